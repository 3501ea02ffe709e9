//! The attention layer: a step's query against the paged KV cache, through the kernels'
//! paged attention, with the step's new keys and values written into their slots first.

use minivllm_kernels::attention::{
    paged_attention, reshape_and_cache, AttnShape, KvBuffer, SeqAttn,
};

use crate::model_executor::input_metadata::InputMetadata;

/// The attention kernels' view of a batch in the layers of one KV cache group, built once
/// per forward and shared by the group's layers.
pub(crate) struct AttentionMetadata<'a> {
    pub slot_mapping: &'a [usize],
    pub seqs: Vec<SeqAttn<'a>>,
}

impl<'a> AttentionMetadata<'a> {
    /// One per KV cache group of `input`.
    pub fn groups(input: &'a InputMetadata) -> Vec<Self> {
        (input.slot_mapping.iter().enumerate())
            .map(|(g, slots)| Self {
                slot_mapping: slots,
                seqs: (0..input.seqs.len())
                    .map(|i| input.seq_attn(i, g))
                    .collect(),
            })
            .collect()
    }
}

/// One layer's paged KV cache: values `[num_blocks, num_kv_heads, block_size, head_dim]`, keys
/// `[num_blocks, num_kv_heads, head_dim, block_size]` (see `reshape_and_cache`).
pub struct LayerKvCache {
    pub key: KvBuffer,
    pub value: KvBuffer,
}

/// Multi-head attention with grouped KV heads over a paged cache.
#[derive(Clone, Copy)]
pub(crate) struct PagedAttention<'s> {
    shape: AttnShape<'s>,
}

impl<'s> PagedAttention<'s> {
    pub fn new(num_heads: usize, num_kv_heads: usize, head_dim: usize, block_size: usize) -> Self {
        Self {
            shape: AttnShape {
                num_heads,
                num_kv_heads,
                head_dim,
                block_size,
                block_stride: None,
                scale: 1.0 / (head_dim as f32).sqrt(),
                sliding_window: None,
                sinks: None,
                softcap: None,
            },
        }
    }

    /// Scores scaled by `scale` instead of `1 / sqrt(head_dim)` (Gemma's
    /// `query_pre_attn_scalar`).
    pub(crate) fn with_scale(mut self, scale: f32) -> Self {
        self.shape.scale = scale;
        self
    }

    /// The cache's blocks are `stride` floats apart, wider than this layer's own (Gemma 4's
    /// layers of several widths share the cache's block ids).
    pub(crate) fn with_block_stride(mut self, stride: usize) -> Self {
        self.shape.block_stride = Some(stride);
        self
    }

    /// Each query sees only the last `window` positions, its own included.
    pub(crate) fn with_sliding_window(mut self, window: Option<usize>) -> Self {
        self.shape.sliding_window = window;
        self
    }

    /// Gemma 2's soft-capping of the scaled scores at `cap` (`attn_logit_softcapping`).
    pub(crate) fn with_softcap(mut self, cap: Option<f32>) -> Self {
        self.shape.softcap = cap;
        self
    }

    /// gpt-oss's sinks: a logit per query head (this rank's heads) joining each softmax.
    pub(crate) fn with_sinks(mut self, sinks: Option<&'s [f32]>) -> Self {
        self.shape.sinks = sinks;
        self
    }

    /// Attends every query over its sequence's context as the cache holds it, writing
    /// nothing (a layer that reads an earlier layer's K/V of the same step).
    pub fn attend(
        &self,
        q: &[f32],
        cache: &LayerKvCache,
        meta: &AttentionMetadata<'_>,
        out: &mut [f32],
    ) {
        let (kc, vc) = (cache.key.view(), cache.value.view());
        paged_attention(out, q, kc, vc, &meta.seqs, &self.shape);
    }

    /// Writes this step's keys and values into their slots, then attends every query over its
    /// sequence's context.
    pub fn forward(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        cache: &mut LayerKvCache,
        meta: &AttentionMetadata<'_>,
        out: &mut [f32],
    ) {
        reshape_and_cache(
            k,
            v,
            cache.key.view_mut(),
            cache.value.view_mut(),
            meta.slot_mapping,
            &self.shape,
        );
        let (kc, vc) = (cache.key.view(), cache.value.view());
        paged_attention(out, q, kc, vc, &meta.seqs, &self.shape);
    }
}
