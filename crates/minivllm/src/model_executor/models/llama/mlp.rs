//! A decoder layer's MLP: dense, routed experts in its place, or (Gemma 4 26B-A4B) both
//! side by side, each with norms of its own.

use crate::distributed::CommError;
use crate::model_executor::layers::fused_moe::FusedMoe;
use crate::model_executor::layers::linear::WeightMatrix;
use crate::model_executor::layers::mlp::GatedMlp;
use crate::model_executor::layers::norm::RmsNorm;
use crate::model_executor::layers::parallel::sized;

use super::{DecoderLayer, ForwardBuffers, LlamaForCausalLM};

/// A layer's MLP.
// One per layer, built once at load: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Mlp {
    Dense(GatedMlp),
    Moe(FusedMoe),
    DenseAndMoe(Box<DenseAndMoe>),
}

/// Gemma 4's: `post_dense(dense(x)) + post_moe(experts(pre_moe(residual)))`, `x` the
/// layer's usual MLP input and `residual` the stream it was normed from, which the
/// experts' router also reads.
pub(super) struct DenseAndMoe {
    pub dense: GatedMlp,
    pub moe: FusedMoe,
    pub post_dense: RmsNorm,
    pub pre_moe: RmsNorm,
    pub post_moe: RmsNorm,
}

impl Mlp {
    pub fn matrices(&self) -> Box<dyn Iterator<Item = &WeightMatrix> + '_> {
        match self {
            Mlp::Dense(m) => Box::new(m.matrices().into_iter()),
            Mlp::Moe(m) => Box::new(m.matrices()),
            Mlp::DenseAndMoe(b) => Box::new(b.dense.matrices().into_iter().chain(b.moe.matrices())),
        }
    }

    /// Bytes of weights a step of `batch` tokens reads.
    pub fn bytes_per_step(&self, batch: usize) -> f64 {
        match self {
            Mlp::Dense(m) => m.nbytes() as f64,
            Mlp::Moe(m) => m.bytes_per_step(batch),
            Mlp::DenseAndMoe(b) => b.dense.nbytes() as f64 + b.moe.bytes_per_step(batch),
        }
    }

    pub fn flops_per_token(&self) -> f64 {
        match self {
            Mlp::Dense(m) => m.flops_per_row(),
            Mlp::Moe(m) => m.flops_per_token(),
            Mlp::DenseAndMoe(b) => b.dense.flops_per_row() + b.moe.flops_per_token(),
        }
    }
}

impl LlamaForCausalLM {
    /// `mlp_out = mlp(hidden)`, `hidden` normed from `residual`.
    pub(super) fn mlp_block(
        &self,
        layer: &DecoderLayer,
        t: usize,
        buf: &mut ForwardBuffers,
    ) -> Result<(), CommError> {
        let (comm, h, act) = (&*self.comm, self.config.hidden_size, self.local.hidden_act);
        let dense = match &layer.mlp {
            Mlp::Dense(m) => Some(m),
            Mlp::DenseAndMoe(b) => Some(&b.dense),
            Mlp::Moe(_) => None,
        };
        if let Some(m) = dense {
            m.forward(
                &buf.hidden,
                t,
                h,
                act,
                comm,
                &mut buf.mlp,
                &mut buf.gather,
                &mut buf.mlp_out,
            )?;
        }
        match &layer.mlp {
            Mlp::Dense(_) => Ok(()),
            Mlp::Moe(m) => m.forward(
                &buf.hidden,
                &buf.hidden,
                t,
                h,
                act,
                comm,
                &mut buf.moe,
                &mut buf.gather,
                &mut buf.mlp_out,
            ),
            Mlp::DenseAndMoe(b) => {
                let dense = sized(&mut buf.normed, t * h);
                b.post_dense.forward(&buf.mlp_out[..t * h], dense);
                let stream = &buf.residual[..t * h];
                b.pre_moe.forward(stream, sized(&mut buf.moe_in, t * h));
                b.moe.forward(
                    &buf.moe_in,
                    stream,
                    t,
                    h,
                    act,
                    comm,
                    &mut buf.moe,
                    &mut buf.gather,
                    &mut buf.moe_out,
                )?;
                let out = sized(&mut buf.mlp_out, t * h);
                b.post_moe.forward(&buf.moe_out[..t * h], out);
                out.iter_mut()
                    .zip(&buf.normed[..t * h])
                    .for_each(|(o, d)| *o += d);
                Ok(())
            }
        }
    }
}
