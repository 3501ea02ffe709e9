//! The gated MLP, `down(act(gate(x)) * up(x))`: a dense layer's, a shared expert's, and
//! (its weights only) each routed expert's.

use minivllm_kernels::activation::{gelu_tanh_and_mul, silu_and_mul, swiglu_oai_and_mul};

use crate::config::Activation;
use crate::distributed::{CommError, Communicator, GatherBuffers};
use crate::model_executor::layers::linear::{Linear, WeightMatrix};
use crate::model_executor::layers::parallel::{project_whole, sized, whole_rows};
use crate::model_executor::loader::weights::{optional_vector, LoadOptions, WeightSource};
use crate::model_executor::loader::LoadError;

/// A gated MLP's weights: gate and up stacked (`[2 * width, hidden]`, this rank's rows of
/// each with tensor parallelism) and down (`[hidden, whole width]`, this rank's rows).
pub(crate) struct GatedMlp {
    pub gate_up_proj: Linear,
    pub down_proj: Linear,
    /// gpt-oss's expert biases: gate's then up's (this rank's part of each, as the rows),
    /// and down's, whole (added once its output is gathered).
    pub gate_up_bias: Option<Vec<f32>>,
    pub down_bias: Option<Vec<f32>>,
    /// This rank's part of the width, and the whole of it.
    pub width: usize,
    pub whole_width: usize,
}

/// Activations of an MLP, kept between forward passes.
#[derive(Default)]
pub(crate) struct MlpBuffers {
    pub gate_up: Vec<f32>,
    pub act: Vec<f32>,
    /// With tensor parallelism: the activations put together from every rank's columns,
    /// and this rank's columns of the output.
    pub whole: Vec<f32>,
    pub local_out: Vec<f32>,
}

impl MlpBuffers {
    pub fn capacity(&self) -> usize {
        [&self.gate_up, &self.act, &self.whole, &self.local_out]
            .iter()
            .map(|v| v.capacity())
            .sum()
    }
}

impl GatedMlp {
    /// Loads `gate`, `up` and `down` (full tensor names): `width` and `own_hidden` are this
    /// rank's rows of gate/up and of down, `whole_width` down's columns.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        src: &dyn WeightSource,
        [gate, up, down]: [&str; 3],
        hidden: usize,
        width: usize,
        whole_width: usize,
        own_hidden: usize,
        opts: &LoadOptions,
    ) -> Result<Self, LoadError> {
        let bias = |weight: &str, len: usize| {
            optional_vector(src, &weight.replace(".weight", ".bias"), len)
        };
        let gate_up_bias = match (bias(gate, width)?, bias(up, width)?) {
            (Some(mut g), Some(u)) => {
                g.extend(u);
                Some(g)
            }
            (None, None) => None,
            _ => {
                return Err(LoadError::Config(format!(
                    "{gate} and {up}: one has a bias and the other none"
                )))
            }
        };
        Ok(Self {
            gate_up_proj: Linear::load_merged(src, &[(gate, width), (up, width)], hidden, opts)?,
            // Its input, the gated activations, carries the largest outliers: one
            // activation scale per K-quant super-block cost too much accuracy there.
            down_proj: Linear::load(src, down, whole_width, own_hidden, opts)?
                .keep_block_activation_scales(),
            gate_up_bias,
            // Whole on every rank: tensor parallelism leaves `.bias` of down unsplit.
            down_bias: bias(down, hidden)?,
            width,
            whole_width,
        })
    }

    pub fn matrices(&self) -> [&WeightMatrix; 2] {
        [self.gate_up_proj.weight(), self.down_proj.weight()]
    }

    /// Bytes of its weights: what one token reads through it.
    pub(crate) fn nbytes(&self) -> usize {
        self.matrices().iter().map(|m| m.nbytes()).sum()
    }

    /// Floating-point operations of one token through it.
    pub(crate) fn flops_per_row(&self) -> f64 {
        self.matrices().iter().map(|m| m.flops_per_row()).sum()
    }

    /// `out[t, hidden] = down(act(gate(x)) * up(x))`, gathered over the ranks.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        x: &[f32],
        t: usize,
        hidden: usize,
        act_fn: Activation,
        comm: &dyn Communicator,
        buf: &mut MlpBuffers,
        gather: &mut GatherBuffers,
        out: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        let gate_up = sized(&mut buf.gate_up, t * 2 * self.width);
        self.gate_up_proj.forward(x, gate_up, t);
        add_bias(gate_up, self.gate_up_bias.as_deref());
        let act = sized(&mut buf.act, t * self.width);
        activate(act_fn, gate_up, act, self.width);
        let split = comm.world_size() > 1;
        let act = whole_rows(
            comm,
            split,
            act,
            t,
            self.whole_width,
            gather,
            &mut buf.whole,
        )?;
        project_whole(
            comm,
            &self.down_proj,
            act,
            t,
            hidden,
            &mut buf.local_out,
            gather,
            out,
        )?;
        add_bias(&mut out[..t * hidden], self.down_bias.as_deref());
        Ok(())
    }
}

/// Adds `bias` to each of `rows`' rows (of its length), if there is one.
pub(crate) fn add_bias(rows: &mut [f32], bias: Option<&[f32]>) {
    if let Some(bias) = bias {
        for row in rows.chunks_exact_mut(bias.len()) {
            row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
        }
    }
}

/// `act = f(gate) * up` for rows laid out `[gate(width) | up(width)]`.
pub(crate) fn activate(act_fn: Activation, gate_up: &[f32], act: &mut [f32], width: usize) {
    match act_fn {
        Activation::Silu => silu_and_mul(gate_up, act, width),
        Activation::GeluTanh => gelu_tanh_and_mul(gate_up, act, width),
        Activation::SwigluOai { alpha, limit } => {
            swiglu_oai_and_mul(gate_up, act, width, alpha, limit)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use minivllm_kernels::quant::GgmlType;

    use super::*;
    use crate::model_executor::layers::linear::tests::{tensor, Blocks};

    /// A gated MLP's down projection keeps one activation scale per block of 32 in its
    /// Q4_K products (its input carries the largest outliers); gate and up share one per
    /// super-block, as ggml's Q8_K. The choice changes the product, so it is checked here
    /// where the loader makes it.
    #[test]
    fn down_projections_keep_block_activation_scales() {
        let (hidden, width) = (256, 512);
        let src = Blocks(HashMap::from([
            ("gate.weight", tensor(GgmlType::Q4_K, width, hidden, 1)),
            ("up.weight", tensor(GgmlType::Q4_K, width, hidden, 2)),
            ("down.weight", tensor(GgmlType::Q4_K, hidden, width, 3)),
        ]));
        let opts = LoadOptions::default();
        let mlp = GatedMlp::load(
            &src,
            ["gate.weight", "up.weight", "down.weight"],
            hidden,
            width,
            width,
            hidden,
            &opts,
        )
        .unwrap();
        let kept = |w: &WeightMatrix| match w {
            WeightMatrix::Quant(q) => q.keeps_block_activation_scales(),
            _ => panic!("expected a Q4_K matrix, got {}", w.format()),
        };
        assert!(!kept(mlp.gate_up_proj.weight()));
        assert!(kept(mlp.down_proj.weight()));
        // What the down projection computes is the plain matrix's with the flag set, and
        // not the same as with shared scales (an input with one outlier per super-block).
        let x: Vec<f32> = (0..width)
            .map(|i| {
                if i % 256 == 7 {
                    40.0
                } else {
                    ((i * 5) % 11) as f32 / 11.0 - 0.5
                }
            })
            .collect();
        let plain = Linear::load(&src, "down.weight", width, hidden, &opts).unwrap();
        let kept_copy = Linear::load(&src, "down.weight", width, hidden, &opts)
            .unwrap()
            .keep_block_activation_scales();
        let run = |l: &Linear| {
            let mut out = vec![0.0; hidden];
            l.forward(&x, &mut out, 1);
            out
        };
        assert_eq!(run(&mlp.down_proj), run(&kept_copy));
        assert_ne!(run(&mlp.down_proj), run(&plain));
        // A draft head's selected rows keep the choice.
        let picked = mlp.down_proj.weight().select_rows(&[3, 1]).unwrap();
        assert!(kept(&picked));
    }
}
