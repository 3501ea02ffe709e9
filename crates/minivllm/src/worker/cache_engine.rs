//! The KV cache memory: every layer's key and value blocks, and the CPU swap pool that
//! preempted sequences' blocks are copied out to (`--swap-space`).

use minivllm_kernels::attention::{KvBuffer, KvCacheDtype};

use crate::config::{KvCacheLayout, ModelConfig};
use crate::distributed::kv_transfer::KvLayoutTag;
use crate::ids::{BlockId, CpuBlockId};
use crate::model_executor::layers::attention::LayerKvCache;
use crate::model_executor::layers::gated_delta_net::LayerStateCache;
use crate::model_executor::loader::weights::DType;

/// vLLM's `--kv-cache-dtype`: what the KV cache stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum CacheDtype {
    /// f32 with `--dtype float32` (the reference path), else f16, as llama.cpp's default:
    /// half the bytes that decoding a large batch streams, for a rounding of keys and
    /// values well below that of 8-bit activations.
    #[default]
    Auto,
    Float32,
    Float16,
    BFloat16,
}

impl CacheDtype {
    /// The element type to allocate, given the weights' `--dtype`.
    pub fn resolve(self, weights: DType) -> KvCacheDtype {
        match self {
            CacheDtype::Auto if weights == DType::Float32 => KvCacheDtype::Float32,
            CacheDtype::Auto | CacheDtype::Float16 => KvCacheDtype::Float16,
            CacheDtype::Float32 => KvCacheDtype::Float32,
            CacheDtype::BFloat16 => KvCacheDtype::BFloat16,
        }
    }
}

impl std::str::FromStr for CacheDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(CacheDtype::Auto),
            "float32" | "float" | "fp32" => Ok(CacheDtype::Float32),
            "float16" | "half" | "fp16" => Ok(CacheDtype::Float16),
            "bfloat16" | "bf16" => Ok(CacheDtype::BFloat16),
            _ => Err(format!(
                "unknown --kv-cache-dtype {s:?} (supported: auto, float32, float16, bfloat16)"
            )),
        }
    }
}

/// Owns the paged KV cache: `num_blocks` blocks of `block_size` tokens, each holding the K/V
/// of as many layers as the layout's groups have (all the layers, unless some slide).
pub struct CacheEngine {
    block_size: usize,
    num_blocks: usize,
    layout: KvCacheLayout,
    dtype: KvCacheDtype,
    /// Values per block in one layer's key (or value) cache.
    block_len: usize,
    /// One store per slot of the layout.
    layers: Vec<LayerKvCache>,
    /// The swap pool: `num_cpu_blocks` blocks per layer in the same layout. On a CPU engine
    /// both pools are host memory; the swap pool is kept apart so it never counts as KV
    /// cache capacity, as in vLLM.
    cpu_layers: Vec<LayerKvCache>,
    num_cpu_blocks: usize,
    /// The linear-attention layers' states, one store per such layer, each of the same
    /// slots (none for a model without such layers).
    states: Vec<LayerStateCache>,
}

/// Why a KV cache of the asked size cannot be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheError {
    #[error("block size must be positive")]
    ZeroBlockSize,
    #[error(
        "KV cache budget of {budget} bytes holds no block of {block_bytes} bytes \
         (block size {block_size}); raise --kv-cache-memory"
    )]
    TooSmall {
        budget: u64,
        block_bytes: u64,
        block_size: usize,
    },
    #[error(
        "KV cache budget of {budget} bytes cannot hold one sequence's linear-attention state \
         ({state_bytes} bytes) beside the attention layers' blocks; raise --kv-cache-memory"
    )]
    TooSmallForState { budget: u64, state_bytes: u64 },
    #[error(
        "swap space of {swap_space} bytes holds no block of {block_bytes} bytes; raise \
         --swap-space or leave it at 0 to preempt by recompute"
    )]
    SwapTooSmall { swap_space: u64, block_bytes: u64 },
}

impl CacheEngine {
    /// Bytes one block takes across its layers' slots, keys and values.
    pub(crate) fn block_bytes(config: &ModelConfig, block_size: usize, dtype: KvCacheDtype) -> u64 {
        let slots = KvCacheLayout::for_model(config).num_slots();
        (2 * slots * block_size * config.kv_slot_size() * dtype.size()) as u64
    }

    /// As many blocks of `dtype` as fit in `budget_bytes`. A model with linear-attention
    /// layers first takes state slots, up to `max_state_slots` and half the budget (a
    /// running sequence holds one slot, so fewer slots cap the running sequences; prefix
    /// caching keeps states in the others), and gives the rest to blocks.
    pub(crate) fn with_budget(
        config: &ModelConfig,
        block_size: usize,
        budget_bytes: u64,
        dtype: KvCacheDtype,
        max_state_slots: usize,
    ) -> Result<Self, CacheError> {
        if block_size == 0 {
            return Err(CacheError::ZeroBlockSize);
        }
        let block_bytes = Self::block_bytes(config, block_size, dtype);
        let state_bytes = config
            .linear_attention
            .as_ref()
            .map_or(0, |l| l.state_bytes_per_seq());
        let num_state_slots = match state_bytes {
            0 => 0,
            s => ((budget_bytes / 2 / s) as usize).min(max_state_slots),
        };
        if state_bytes > 0 && num_state_slots == 0 {
            return Err(CacheError::TooSmallForState {
                budget: budget_bytes,
                state_bytes,
            });
        }
        let kv_budget = budget_bytes - num_state_slots as u64 * state_bytes;
        let num_blocks = (kv_budget / block_bytes) as usize;
        if num_blocks == 0 {
            return Err(CacheError::TooSmall {
                budget: budget_bytes,
                block_bytes,
                block_size,
            });
        }
        Ok(Self::with_dtype(config, block_size, num_blocks, dtype)
            .with_state_slots(config, num_state_slots))
    }

    /// Gives every linear-attention layer of `config` `num_slots` state slots.
    pub fn with_state_slots(mut self, config: &ModelConfig, num_slots: usize) -> Self {
        let Some(linear) = &config.linear_attention else {
            return self;
        };
        let layers = linear.num_layers();
        self.states = (0..layers)
            .map(|_| LayerStateCache::zeros(linear.state_lens(), num_slots))
            .collect();
        tracing::info!(
            slots = num_slots,
            mib = (num_slots as u64 * linear.state_bytes_per_seq()) >> 20,
            layers,
            "linear-attention state allocated: a slot per running sequence, the rest for \
             prefix caching's states at block boundaries"
        );
        self
    }

    /// An f32 cache of `num_blocks` blocks: the reference path's.
    pub fn new(config: &ModelConfig, block_size: usize, num_blocks: usize) -> Self {
        Self::with_dtype(config, block_size, num_blocks, KvCacheDtype::Float32)
    }

    pub fn with_dtype(
        config: &ModelConfig,
        block_size: usize,
        num_blocks: usize,
        dtype: KvCacheDtype,
    ) -> Self {
        let block_len = block_size * config.kv_slot_size();
        let layout = KvCacheLayout::for_model(config);
        tracing::info!(
            num_blocks,
            block_size,
            // Of a sequence's whole context, in every group.
            tokens = num_blocks * block_size / layout.num_groups(),
            %dtype,
            groups = layout.num_groups(),
            layers_per_block = layout.num_slots(),
            "KV cache allocated"
        );
        Self {
            block_size,
            num_blocks,
            dtype,
            block_len,
            layers: alloc_layers(layout.num_slots(), num_blocks * block_len, dtype),
            layout,
            cpu_layers: Vec::new(),
            num_cpu_blocks: 0,
            states: Vec::new(),
        }
    }

    /// Adds a swap pool of as many blocks as fit in `swap_space` bytes (none for 0).
    pub(crate) fn with_swap_space(self, swap_space: u64) -> Result<Self, CacheError> {
        if swap_space == 0 {
            return Ok(self);
        }
        if !self.states.is_empty() {
            tracing::warn!("--swap-space is unused with linear-attention layers: preempted sequences are recomputed");
            return Ok(self);
        }
        if self.layout.has_sliding_window() {
            // Blocks given back mid-sequence leave nothing whole to swap.
            tracing::warn!("--swap-space is unused with sliding-window layers: preempted sequences are recomputed");
            return Ok(self);
        }
        let block_bytes = self.bytes_per_block() as u64;
        match (swap_space / block_bytes) as usize {
            0 => Err(CacheError::SwapTooSmall {
                swap_space,
                block_bytes,
            }),
            n => Ok(self.with_cpu_blocks(n)),
        }
    }

    /// What the cache stores.
    pub fn dtype(&self) -> KvCacheDtype {
        self.dtype
    }

    /// Bytes of keys and values one cached position takes, all layers: what attention reads
    /// per position of context.
    pub fn kv_bytes_per_position(&self) -> usize {
        2 * self.layout.num_layers() * self.block_len * self.dtype.size() / self.block_size
    }

    /// Bytes one block takes across its slots, keys and values ([`Self::block_bytes`] of
    /// this cache).
    pub(crate) fn bytes_per_block(&self) -> usize {
        2 * self.layers.len() * self.block_len * self.dtype.size()
    }

    /// Which layers share the blocks, and how.
    pub fn layout(&self) -> &KvCacheLayout {
        &self.layout
    }

    /// Replaces the swap pool with one of `num_cpu_blocks` blocks.
    pub(crate) fn with_cpu_blocks(mut self, num_cpu_blocks: usize) -> Self {
        self.cpu_layers = alloc_layers(
            self.layers.len(),
            num_cpu_blocks * self.block_len,
            self.dtype,
        );
        self.num_cpu_blocks = num_cpu_blocks;
        tracing::info!(num_cpu_blocks, "swap space allocated");
        self
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn num_cpu_blocks(&self) -> usize {
        self.num_cpu_blocks
    }

    /// Copies whole blocks (every layer, keys and values) into the swap pool.
    pub(crate) fn swap_out(&mut self, pairs: &[(BlockId, CpuBlockId)]) {
        let pairs: Vec<(usize, usize)> = pairs
            .iter()
            .map(|(g, c)| (g.0 as usize, c.0 as usize))
            .collect();
        copy_between(&self.layers, &mut self.cpu_layers, &pairs, self.block_len);
    }

    /// Copies whole blocks (every layer, keys and values) back from the swap pool.
    pub(crate) fn swap_in(&mut self, pairs: &[(CpuBlockId, BlockId)]) {
        let pairs: Vec<(usize, usize)> = pairs
            .iter()
            .map(|(c, g)| (c.0 as usize, g.0 as usize))
            .collect();
        copy_between(&self.cpu_layers, &mut self.layers, &pairs, self.block_len);
    }

    /// The shape of this cache's blocks, as a KV payload names it.
    pub(crate) fn transfer_layout(&self) -> KvLayoutTag {
        KvLayoutTag {
            num_slots: self.layers.len() as u32,
            block_size: self.block_size as u32,
            block_len: self.block_len as u32,
            dtype: self.dtype,
        }
    }

    /// Appends `blocks` to `out` as a KV payload holds them: block after block, each its
    /// slots' keys then values.
    pub(crate) fn export_blocks(&self, blocks: &[BlockId], out: &mut Vec<u8>) {
        let len = self.block_len;
        for b in blocks {
            for layer in &self.layers {
                layer.key.append_le_bytes(b.0 as usize * len, len, out);
                layer.value.append_le_bytes(b.0 as usize * len, len, out);
            }
        }
    }

    /// Writes one block of a payload (laid out as [`export_blocks`] writes one) into
    /// `block`.
    ///
    /// [`export_blocks`]: Self::export_blocks
    pub(crate) fn import_block(&mut self, block: BlockId, bytes: &[u8]) {
        let (start, n) = (
            block.0 as usize * self.block_len,
            self.block_len * self.dtype.size(),
        );
        for (layer, kv) in self.layers.iter_mut().zip(bytes.chunks_exact(2 * n)) {
            layer.key.set_le_bytes(start, &kv[..n]);
            layer.value.set_le_bytes(start, &kv[n..]);
        }
    }

    /// The stores of the layout's slots.
    pub fn layers_mut(&mut self) -> &mut [LayerKvCache] {
        &mut self.layers
    }

    /// The K/V stores of the layout's slots and the linear-attention layers' state stores.
    pub fn caches_mut(&mut self) -> (&mut [LayerKvCache], &mut [LayerStateCache]) {
        (&mut self.layers, &mut self.states)
    }

    /// State slots of the linear-attention layers (0 for a model without them).
    pub fn num_state_slots(&self) -> usize {
        self.states.first().map_or(0, LayerStateCache::num_slots)
    }
}

/// `num_layers` zeroed key and value caches of `len` values each. Zeroed vectors come from
/// the allocator as zeroed pages, which the OS maps lazily: a large budget costs memory only
/// as blocks are first written.
fn alloc_layers(num_layers: usize, len: usize, dtype: KvCacheDtype) -> Vec<LayerKvCache> {
    (0..num_layers)
        .map(|_| LayerKvCache {
            key: KvBuffer::zeros(dtype, len),
            value: KvBuffer::zeros(dtype, len),
        })
        .collect()
}

/// Copies blocks `(src, dst)` from one pool to the other, in every layer.
fn copy_between(
    src: &[LayerKvCache],
    dst: &mut [LayerKvCache],
    pairs: &[(usize, usize)],
    block_len: usize,
) {
    for (from, to) in src.iter().zip(dst.iter_mut()) {
        for (s, d) in [(&from.key, &mut to.key), (&from.value, &mut to.value)] {
            for &(i, j) in pairs {
                d.copy_from(j * block_len, s, i * block_len, block_len);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::RopeScaling;

    pub(crate) fn tiny_config() -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            family: crate::config::ModelFamily::Llama,
            qkv_bias: false,
            o_bias_and_sinks: false,
            qk_norm: crate::config::QkNorm::None,
            sandwich_norms: false,
            hidden_act: crate::config::Activation::Silu,
            embedding_multiplier: None,
            norm_weight_offset: 0.0,
            query_pre_attn_scalar: None,
            attn_logit_softcapping: None,
            final_logit_softcapping: None,
            sliding_window: None,
            sliding_layers: Vec::new(),
            rope_local_theta: None,
            vocab_size: 8,
            hidden_size: 8,
            intermediate_size: 16,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            head_dim: 4,
            rotary_dim: 4,
            max_position_embeddings: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: true,
            moe: None,
            linear_attention: None,
            attn_output_gate: false,
            gemma4: None,
        }
    }

    /// A value unique to (layer, key or value, block, offset), so any misplaced float shows.
    fn mark(layer: usize, kind: usize, block: usize, off: usize) -> f32 {
        (((layer * 2 + kind) * 100 + block) * 1000 + off) as f32
    }

    #[test]
    fn swap_out_then_in_restores_blocks_in_every_layer() {
        let cfg = tiny_config();
        let mut cache = CacheEngine::new(&cfg, 2, 4).with_cpu_blocks(3);
        assert_eq!(cache.num_cpu_blocks(), 3);
        let len = cache.block_len;
        for (l, layer) in cache.layers.iter_mut().enumerate() {
            for (kind, c) in [&mut layer.key, &mut layer.value].into_iter().enumerate() {
                let KvBuffer::Float32(c) = c else {
                    panic!("CacheEngine::new makes f32 caches")
                };
                for (i, x) in c.iter_mut().enumerate() {
                    *x = mark(l, kind, i / len, i % len);
                }
            }
        }
        cache.swap_out(&[(BlockId(1), CpuBlockId(2)), (BlockId(3), CpuBlockId(0))]);
        for layer in &mut cache.layers {
            layer.key.fill(-1.0);
            layer.value.fill(-1.0);
        }
        // Back into other blocks, as a swapped-in sequence gets fresh ones.
        cache.swap_in(&[(CpuBlockId(2), BlockId(0)), (CpuBlockId(0), BlockId(2))]);
        for (l, layer) in cache.layers.iter().enumerate() {
            for (kind, c) in [&layer.key, &layer.value].into_iter().enumerate() {
                for off in 0..len {
                    assert_eq!(c.get(off), mark(l, kind, 1, off));
                    assert_eq!(c.get(2 * len + off), mark(l, kind, 3, off));
                    assert_eq!(c.get(len + off), -1.0);
                    assert_eq!(c.get(3 * len + off), -1.0);
                }
            }
        }
    }

    #[test]
    fn exported_blocks_import_into_other_blocks_of_another_cache() {
        for dtype in [KvCacheDtype::Float32, KvCacheDtype::Float16] {
            let config = tiny_config();
            let mut from = CacheEngine::with_dtype(&config, 4, 6, dtype);
            for (l, layer) in from.layers_mut().iter_mut().enumerate() {
                for i in 0..layer.key.len() {
                    let mut one = KvBuffer::zeros(dtype, 1);
                    one.fill(mark(l, 0, i / 16, i % 16) / 1e6);
                    layer.key.copy_from(i, &one, 0, 1);
                    one.fill(mark(l, 1, i / 16, i % 16) / 1e6);
                    layer.value.copy_from(i, &one, 0, 1);
                }
            }
            let mut bytes = Vec::new();
            from.export_blocks(&[BlockId(4), BlockId(1)], &mut bytes);
            let tag = from.transfer_layout();
            assert_eq!(bytes.len(), 2 * tag.block_bytes());
            let mut to = CacheEngine::with_dtype(&config, 4, 6, dtype);
            assert_eq!(to.transfer_layout(), tag);
            to.import_block(BlockId(0), &bytes[..tag.block_bytes()]);
            to.import_block(BlockId(5), &bytes[tag.block_bytes()..]);
            let len = tag.block_len as usize;
            for (a, b) in from.layers.iter().zip(&to.layers) {
                for (src, dst) in [(4, 0), (1, 5)] {
                    for i in 0..len {
                        assert_eq!(a.key.get(src * len + i), b.key.get(dst * len + i));
                        assert_eq!(a.value.get(src * len + i), b.value.get(dst * len + i));
                    }
                }
                assert_eq!(b.key.get(len), 0.0, "an untouched block stays zero");
            }
        }
    }

    #[test]
    fn swap_space_is_counted_in_whole_blocks() {
        let cfg = tiny_config();
        let block_bytes = CacheEngine::block_bytes(&cfg, 2, KvCacheDtype::Float32);
        let cache = CacheEngine::new(&cfg, 2, 4);
        let cache = cache.with_swap_space(3 * block_bytes + 1).unwrap();
        assert_eq!(cache.num_cpu_blocks(), 3);
        let off = CacheEngine::new(&cfg, 2, 4).with_swap_space(0).unwrap();
        assert_eq!(off.num_cpu_blocks(), 0);
        assert!(matches!(
            CacheEngine::new(&cfg, 2, 4).with_swap_space(block_bytes - 1),
            Err(CacheError::SwapTooSmall { .. })
        ));
    }
}
