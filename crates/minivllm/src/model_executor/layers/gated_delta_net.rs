//! Gated DeltaNet, the linear-attention layer of Qwen3.5 (three layers in four) and
//! Qwen3-Next: instead of a KV cache, each sequence keeps a fixed-size state per layer (the
//! causal convolution's last inputs and the gated delta rule's `[k_dim, v_dim]` matrix per
//! value head), so its cost per token does not grow with the context.
//!
//! Per token: the input's projections give q, k, v (through a causal depthwise convolution and SiLU),
//! the output gate `z`, and per value head the write strength `β = sigmoid(b)` and the log
//! decay `g = −exp(A_log)·softplus(a + dt_bias)`; the rule (`minivllm_kernels::gated_delta`)
//! turns q, k, v into each head's output, which an RMSNorm gated by `silu(z)` scales before
//! the output projection (transformers' `Qwen3_5GatedDeltaNet`).

use std::ops::Range;

use minivllm_kernels::activation::{sigmoid, silu};
use minivllm_kernels::conv1d::causal_conv1d_silu;
use minivllm_kernels::gated_delta::{
    gated_delta_rule_chunked, gated_delta_rule_recurrent, DeltaHeads, DeltaInputs,
};
use minivllm_kernels::norm::rms_norm;

use crate::config::linear_attention;
use crate::model_executor::layers::linear::{Linear, WeightMatrix};
use crate::model_executor::layers::parallel::sized;
use crate::model_executor::loader::weights::{LoadOptions, WeightSource};
use crate::model_executor::loader::LoadError;

/// Tokens up to which a call runs the rule one token at a time: below a few tokens the
/// chunked form's solves cost more than they save.
const RECURRENT_MAX_TOKENS: usize = 4;

/// The name (under the layer's prefix) that GGUF files' `ssm_a`, `−exp(A_log)`, reads as.
pub(crate) const GGUF_NEG_A: &str = "ssm_a";

/// The shape of one Gated DeltaNet layer (Qwen3.5's `linear_*` config keys).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GatedDeltaNetConfig {
    pub hidden_size: usize,
    pub heads: DeltaHeads,
    /// `linear_conv_kernel_dim`.
    pub conv_width: usize,
    pub rms_norm_eps: f32,
}

impl GatedDeltaNetConfig {
    fn key_dim(&self) -> usize {
        self.heads.num_k_heads * self.heads.k_dim
    }

    fn value_dim(&self) -> usize {
        self.heads.num_v_heads * self.heads.v_dim
    }

    fn conv_dim(&self) -> usize {
        linear_attention::conv_dim(&self.heads)
    }
}

pub(crate) struct GatedDeltaNet {
    cfg: GatedDeltaNetConfig,
    /// q, k, v, then z: one product for the wide projections of the input.
    in_proj: Linear,
    /// b, then a: each value head's write strength and decay step.
    in_proj_ba: Linear,
    /// `[conv_dim, conv_width]`.
    conv: Vec<f32>,
    /// `−exp(A_log)` per value head: the rate of its decay.
    neg_a: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The gated RMSNorm's scale, `[v_dim]` (shared by the heads).
    norm: Vec<f32>,
    out_proj: Linear,
}

/// One sequence's state in one layer, carried from call to call (zeros at its start).
pub(crate) struct DeltaState<'a> {
    /// `[conv_dim, conv_width − 1]`: the convolution's last inputs.
    pub conv: &'a mut [f32],
    /// `[num_v_heads, k_dim, v_dim]`: the rule's state.
    pub recurrent: &'a mut [f32],
}

/// One linear-attention layer's state for every state slot of the cache (the KV cache
/// manager gives each running sequence one): what the layer keeps instead of K/V.
pub struct LayerStateCache {
    /// `[num_slots, conv_len + rec_len]`.
    data: Vec<f32>,
    conv_len: usize,
    rec_len: usize,
}

impl LayerStateCache {
    /// `num_slots` zeroed states of `[conv_len, rec_len]` floats. Zeroed vectors come
    /// from the allocator as zeroed pages, resident only once a slot is first used.
    pub fn zeros([conv_len, rec_len]: [usize; 2], num_slots: usize) -> Self {
        Self {
            data: vec![0.0; num_slots * (conv_len + rec_len)],
            conv_len,
            rec_len,
        }
    }

    /// Whether each slot holds a state of these lengths.
    pub(crate) fn holds(&self, lens: [usize; 2]) -> bool {
        [self.conv_len, self.rec_len] == lens
    }

    pub(crate) fn num_slots(&self) -> usize {
        self.data.len() / (self.conv_len + self.rec_len).max(1)
    }

    /// Copies slot `from`'s state into slot `to`.
    fn copy(&mut self, from: usize, to: usize) {
        let per = self.conv_len + self.rec_len;
        self.data
            .copy_within(from * per..(from + 1) * per, to * per);
    }

    fn slot(&mut self, slot: usize) -> DeltaState<'_> {
        let per = self.conv_len + self.rec_len;
        let (conv, recurrent) = self.data[slot * per..(slot + 1) * per].split_at_mut(self.conv_len);
        DeltaState { conv, recurrent }
    }
}

/// One sequence's rows of a batch and the state slot they carry on from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeltaSeq {
    pub rows: Range<usize>,
    pub slot: usize,
    /// The rows start the sequence: its state starts from zeros, whatever the slot held
    /// (a finished or preempted sequence's).
    pub fresh: bool,
    /// A slot whose state (a cached prefix's) `slot` takes before the rows.
    pub restore_from: Option<usize>,
    /// `(after, into)`: the state after the first `after` rows is copied into slot `into`
    /// (kept for prefix caching at a block boundary).
    pub snapshot: Option<(usize, usize)>,
}

#[cfg(test)]
impl DeltaSeq {
    /// Rows `rows` carrying on from `slot` (or starting there when `fresh`), with no copy.
    pub fn in_slot(rows: Range<usize>, slot: usize, fresh: bool) -> Self {
        Self {
            rows,
            slot,
            fresh,
            restore_from: None,
            snapshot: None,
        }
    }
}

/// A forward pass's intermediates, kept between calls.
#[derive(Default)]
pub(crate) struct DeltaBuffers {
    proj: Vec<f32>,
    ba: Vec<f32>,
    core: Vec<f32>,
    gated: Vec<f32>,
    seq: SeqBuffers,
}

impl DeltaBuffers {
    /// Floats held.
    pub fn capacity(&self) -> usize {
        let s = &self.seq;
        [
            &self.proj,
            &self.ba,
            &self.core,
            &self.gated,
            &s.mixed,
            &s.conv_out,
            &s.q,
            &s.k,
            &s.v,
            &s.g,
            &s.beta,
        ]
        .iter()
        .map(|v| v.capacity())
        .sum()
    }
}

/// One sequence's intermediates.
#[derive(Default)]
struct SeqBuffers {
    mixed: Vec<f32>,
    conv_out: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

impl GatedDeltaNet {
    /// The layer under transformers' names from `prefix` (`model.layers.N.linear_attn`).
    /// A GGUF file's (through `GgufWeights`' names) holds `−exp(A_log)` as `ssm_a` and the
    /// convolution's kernel without its middle axis, as llama.cpp's converter writes them.
    pub fn load(
        src: &dyn WeightSource,
        prefix: &str,
        cfg: &GatedDeltaNetConfig,
        opts: &LoadOptions,
    ) -> Result<Self, LoadError> {
        let (nv, hidden) = (cfg.heads.num_v_heads, cfg.hidden_size);
        let name = |n: &str| format!("{prefix}.{n}");
        let in_proj = Linear::load_merged(
            src,
            &[
                (&name("in_proj_qkv.weight"), cfg.conv_dim()),
                (&name("in_proj_z.weight"), cfg.value_dim()),
            ],
            hidden,
            opts,
        )?;
        // Apart from q/k/v and z: quantised files may keep these small ones in f32, and a
        // matrix stacked from an f32 part would be f32 whole.
        let in_proj_ba = Linear::load_merged(
            src,
            &[
                (&name("in_proj_b.weight"), nv),
                (&name("in_proj_a.weight"), nv),
            ],
            hidden,
            opts,
        )?;
        let conv_name = name("conv1d.weight");
        let conv = src.load(&conv_name)?;
        let conv = match conv.shape.len() {
            2 => conv.expect_shape(&conv_name, &[cfg.conv_dim(), cfg.conv_width])?,
            _ => conv.expect_shape(&conv_name, &[cfg.conv_dim(), 1, cfg.conv_width])?,
        };
        let vector = |n: &str, len: usize| -> Result<Vec<f32>, LoadError> {
            src.load(&name(n))?.expect_shape(&name(n), &[len])
        };
        let neg_a = if src.contains(&name("A_log")) {
            vector("A_log", nv)?.iter().map(|a| -a.exp()).collect()
        } else {
            vector(GGUF_NEG_A, nv)?
        };
        Ok(Self {
            cfg: *cfg,
            in_proj,
            in_proj_ba,
            conv,
            neg_a,
            dt_bias: vector("dt_bias", nv)?,
            norm: vector("norm.weight", cfg.heads.v_dim)?,
            out_proj: Linear::load(src, &name("out_proj.weight"), cfg.value_dim(), hidden, opts)?,
        })
    }

    /// The projections' matrices.
    pub fn matrices(&self) -> [&WeightMatrix; 3] {
        [
            self.in_proj.weight(),
            self.in_proj_ba.weight(),
            self.out_proj.weight(),
        ]
    }

    /// Floats of a sequence's convolution state and of its rule state in this layer.
    pub(crate) fn state_lens(&self) -> [usize; 2] {
        linear_attention::state_lens(&self.cfg.heads, self.cfg.conv_width)
    }

    /// A batch's rows `x` `[t, hidden]` (normed) into `out` `[t, hidden]`: the
    /// projections over all rows at once, the convolution and the rule per sequence of
    /// `seqs` (rows back to back), each carrying its slot's state in `states` on.
    pub fn forward(
        &self,
        x: &[f32],
        seqs: &[DeltaSeq],
        states: &mut LayerStateCache,
        buf: &mut DeltaBuffers,
        out: &mut Vec<f32>,
    ) {
        let c = &self.cfg;
        let nv = c.heads.num_v_heads;
        let (vdim, cdim) = (c.value_dim(), c.conv_dim());
        let width = cdim + vdim;
        let t = seqs.last().map_or(0, |s| s.rows.end);
        let x = &x[..t * c.hidden_size];
        let proj = sized(&mut buf.proj, t * width);
        self.in_proj.forward(x, proj, t);
        let ba = sized(&mut buf.ba, t * 2 * nv);
        self.in_proj_ba.forward(x, ba, t);
        let core = sized(&mut buf.core, t * vdim);
        // Every restore before any sequence runs: a slot restored from may be handed out
        // again in the same step (as another's fresh slot or snapshot).
        for seq in seqs {
            if let Some(from) = seq.restore_from {
                states.copy(from, seq.slot);
            }
        }
        for seq in seqs {
            if seq.fresh {
                let state = states.slot(seq.slot);
                state.conv.fill(0.0);
                state.recurrent.fill(0.0);
            }
            // Cut at the snapshot's boundary, which the state passes between the parts.
            let rows = seq.rows.clone();
            let cut = seq
                .snapshot
                .map_or(rows.end, |(after, _)| rows.start + after);
            for (i, part) in [rows.start..cut, cut..rows.end].into_iter().enumerate() {
                if !part.is_empty() {
                    self.mix(
                        &proj[part.start * width..part.end * width],
                        &ba[part.start * 2 * nv..part.end * 2 * nv],
                        states.slot(seq.slot),
                        &mut buf.seq,
                        &mut core[part.start * vdim..part.end * vdim],
                    );
                }
                if let (0, Some((_, into))) = (i, seq.snapshot) {
                    states.copy(seq.slot, into);
                }
            }
        }

        // Each head's output normed (rows of v_dim), scaled, and gated by silu(z).
        let gated = sized(&mut buf.gated, t * vdim);
        rms_norm(core, &self.norm, c.rms_norm_eps, gated);
        for (rows, p) in gated.chunks_exact_mut(vdim).zip(proj.chunks_exact(width)) {
            for (o, &z) in rows.iter_mut().zip(&p[cdim..]) {
                *o *= silu(z);
            }
        }
        let out = sized(out, t * c.hidden_size);
        self.out_proj.forward(gated, out, t);
    }

    /// One sequence's projected rows `proj` through the convolution and the rule into
    /// `core` `[rows, value_dim]`, its `state` carried on.
    fn mix(
        &self,
        proj: &[f32],
        ba: &[f32],
        state: DeltaState<'_>,
        buf: &mut SeqBuffers,
        core: &mut [f32],
    ) {
        let c = &self.cfg;
        let nv = c.heads.num_v_heads;
        let (kdim, vdim, cdim) = (c.key_dim(), c.value_dim(), c.conv_dim());
        let width = cdim + vdim;
        let t = proj.len() / width;
        let mixed = sized(&mut buf.mixed, t * cdim);
        for (m, row) in mixed.chunks_exact_mut(cdim).zip(proj.chunks_exact(width)) {
            m.copy_from_slice(&row[..cdim]);
        }
        let conv_out = sized(&mut buf.conv_out, t * cdim);
        causal_conv1d_silu(mixed, cdim, &self.conv, None, state.conv, conv_out);

        let (q, k, v) = (
            sized(&mut buf.q, t * kdim),
            sized(&mut buf.k, t * kdim),
            sized(&mut buf.v, t * vdim),
        );
        let (g, beta) = (sized(&mut buf.g, t * nv), sized(&mut buf.beta, t * nv));
        for i in 0..t {
            let row = &conv_out[i * cdim..(i + 1) * cdim];
            q[i * kdim..(i + 1) * kdim].copy_from_slice(&row[..kdim]);
            k[i * kdim..(i + 1) * kdim].copy_from_slice(&row[kdim..2 * kdim]);
            v[i * vdim..(i + 1) * vdim].copy_from_slice(&row[2 * kdim..]);
            let (b, a) = ba[i * 2 * nv..(i + 1) * 2 * nv].split_at(nv);
            for h in 0..nv {
                beta[i * nv + h] = sigmoid(b[h]);
                g[i * nv + h] = self.neg_a[h] * softplus(a[h] + self.dt_bias[h]);
            }
        }
        let io = DeltaInputs { q, k, v, g, beta };
        if t <= RECURRENT_MAX_TOKENS {
            gated_delta_rule_recurrent(&c.heads, &io, state.recurrent, core);
        } else {
            gated_delta_rule_chunked(&c.heads, &io, state.recurrent, core);
        }
    }
}

/// `ln(1 + eˣ)`, and `x` itself above 20 (torch's `softplus` threshold).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

#[cfg(test)]
mod tests;
