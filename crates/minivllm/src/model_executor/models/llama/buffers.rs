//! A forward pass's activations, kept between passes.

use crate::distributed::GatherBuffers;
use crate::model_executor::layers::fused_moe::MoeBuffers;
use crate::model_executor::layers::gated_delta_net::{DeltaBuffers, DeltaSeq};
use crate::model_executor::layers::mlp::MlpBuffers;
use crate::model_executor::layers::rotary::StepRope;

/// Activations of one forward pass, kept between passes so steady-state decoding
/// allocates nothing: vectors only grow when a batch is larger than any before.
#[derive(Default)]
pub struct ForwardBuffers {
    pub(super) hidden: Vec<f32>,
    pub(super) residual: Vec<f32>,
    pub(super) qkv: Vec<f32>,
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    /// Qwen3.5's attention output gates, `[t, q_size]`, and the q rows before their norm.
    pub(super) gate: Vec<f32>,
    pub(super) q_raw: Vec<f32>,
    pub(super) attn_out: Vec<f32>,
    /// The linear-attention layers' sequences of the step, and their intermediates.
    pub(super) delta_seqs: Vec<DeltaSeq>,
    pub(super) delta: DeltaBuffers,
    pub(super) mlp: MlpBuffers,
    pub(super) moe: MoeBuffers,
    pub(super) mlp_out: Vec<f32>,
    /// Where a norm of `hidden` is written before the two are swapped.
    pub(super) normed: Vec<f32>,
    pub(super) last_hidden: Vec<f32>,
    pub(super) logits: Vec<f32>,
    /// With tensor parallelism: this rank's columns of an output (the logits, a
    /// projection's), and the whole rows put together from every rank's.
    pub(super) local_out: Vec<f32>,
    pub(super) whole: Vec<f32>,
    pub(super) gather: GatherBuffers,
    /// The step's cosines and sines: of the model's RoPE base, and of the sliding layers'.
    pub(super) rope: StepRope,
    pub(super) rope_local: StepRope,
    /// Gemma 4's per-layer inputs of the step (`[t, layers · width]`), and scratch.
    pub(super) ple: Vec<f32>,
    pub(super) ple_scratch: Vec<f32>,
    pub(super) ple_act: Vec<f32>,
    /// Gemma 4's experts' input and output beside its dense MLP.
    pub(super) moe_in: Vec<f32>,
    pub(super) moe_out: Vec<f32>,
}

impl ForwardBuffers {
    /// Below this, buffers are kept while idle: what an ordinary batch needs.
    const KEEP_BYTES: usize = 32 << 20;

    /// Rows `rows` of the last forward pass's final hidden states (after the final norm),
    /// `hidden_size` wide: what an embedding pools.
    pub fn hidden(&self, rows: std::ops::Range<usize>, hidden_size: usize) -> &[f32] {
        &self.hidden[rows.start * hidden_size..rows.end * hidden_size]
    }

    /// The first `len` logits of the last forward pass (`len` as it returned them).
    pub fn logits(&self, len: usize) -> &[f32] {
        &self.logits[..len]
    }

    /// The same, to change in place (sampling's bias, bans and penalties).
    pub(crate) fn logits_mut(&mut self, len: usize) -> &mut [f32] {
        &mut self.logits[..len]
    }

    /// Frees the buffers if a past batch grew them large (a step scoring a long prompt's
    /// logprobs needs a vocabulary-wide row per token): called when the engine goes idle,
    /// so one such request does not leave its peak in the server for good.
    pub(crate) fn release_if_large(&mut self) {
        let floats: usize = [
            &self.hidden,
            &self.residual,
            &self.qkv,
            &self.q,
            &self.k,
            &self.v,
            &self.gate,
            &self.q_raw,
            &self.attn_out,
            &self.mlp_out,
            &self.normed,
            &self.last_hidden,
            &self.logits,
            &self.local_out,
            &self.whole,
            &self.ple,
            &self.ple_scratch,
            &self.ple_act,
            &self.moe_in,
            &self.moe_out,
        ]
        .iter()
        .map(|v| v.capacity())
        .sum::<usize>()
            + self.mlp.capacity()
            + self.delta.capacity()
            + self.moe.capacity()
            + self.gather.capacity()
            + self.rope.capacity()
            + self.rope_local.capacity();
        if floats * std::mem::size_of::<f32>() > Self::KEEP_BYTES {
            *self = Self::default();
        }
    }
}
