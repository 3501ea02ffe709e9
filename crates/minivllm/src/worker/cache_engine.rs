//! The KV cache memory: every layer's key and value blocks, and the CPU swap pool that
//! preempted sequences' blocks are copied out to (`--swap-space`).

use crate::config::ModelConfig;
use crate::core::block_pool::{BlockId, CpuBlockId};
use crate::model_executor::layers::attention::LayerKvCache;

/// Owns the paged KV cache: `num_blocks` blocks of `block_size` tokens in every layer.
pub struct CacheEngine {
    block_size: usize,
    num_blocks: usize,
    /// Floats per block in one layer's key (or value) cache.
    block_len: usize,
    layers: Vec<LayerKvCache>,
    /// The swap pool: `num_cpu_blocks` blocks per layer in the same layout. On a CPU engine
    /// both pools are host memory; the swap pool is kept apart so it never counts as KV
    /// cache capacity, as in vLLM.
    cpu_layers: Vec<LayerKvCache>,
    num_cpu_blocks: usize,
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
        "swap space of {swap_space} bytes holds no block of {block_bytes} bytes; raise \
         --swap-space or leave it at 0 to preempt by recompute"
    )]
    SwapTooSmall { swap_space: u64, block_bytes: u64 },
}

impl CacheEngine {
    /// Bytes one block takes across all layers, keys and values (f32).
    pub fn block_bytes(config: &ModelConfig, block_size: usize) -> u64 {
        (2 * config.num_hidden_layers * block_size * config.kv_size() * std::mem::size_of::<f32>())
            as u64
    }

    /// As many blocks as fit in `budget_bytes`.
    pub fn with_budget(
        config: &ModelConfig,
        block_size: usize,
        budget_bytes: u64,
    ) -> Result<Self, CacheError> {
        if block_size == 0 {
            return Err(CacheError::ZeroBlockSize);
        }
        let block_bytes = Self::block_bytes(config, block_size);
        let num_blocks = (budget_bytes / block_bytes) as usize;
        if num_blocks == 0 {
            return Err(CacheError::TooSmall {
                budget: budget_bytes,
                block_bytes,
                block_size,
            });
        }
        Ok(Self::new(config, block_size, num_blocks))
    }

    pub fn new(config: &ModelConfig, block_size: usize, num_blocks: usize) -> Self {
        let block_len = block_size * config.kv_size();
        tracing::info!(
            num_blocks,
            block_size,
            tokens = num_blocks * block_size,
            "KV cache allocated"
        );
        Self {
            block_size,
            num_blocks,
            block_len,
            layers: alloc_layers(config.num_hidden_layers, num_blocks * block_len),
            cpu_layers: Vec::new(),
            num_cpu_blocks: 0,
        }
    }

    /// Adds a swap pool of as many blocks as fit in `swap_space` bytes (none for 0).
    pub fn with_swap_space(self, swap_space: u64) -> Result<Self, CacheError> {
        if swap_space == 0 {
            return Ok(self);
        }
        let block_bytes =
            (2 * self.layers.len() * self.block_len * std::mem::size_of::<f32>()) as u64;
        match (swap_space / block_bytes) as usize {
            0 => Err(CacheError::SwapTooSmall {
                swap_space,
                block_bytes,
            }),
            n => Ok(self.with_cpu_blocks(n)),
        }
    }

    /// Replaces the swap pool with one of `num_cpu_blocks` blocks.
    pub fn with_cpu_blocks(mut self, num_cpu_blocks: usize) -> Self {
        self.cpu_layers = alloc_layers(self.layers.len(), num_cpu_blocks * self.block_len);
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

    /// Copies whole blocks (`src` to `dst`, every layer, keys and values): the data side of
    /// copy-on-write when a shared block is about to be written.
    pub fn copy_blocks(&mut self, pairs: &[(BlockId, BlockId)]) {
        let block_len = self.block_len;
        for layer in &mut self.layers {
            for cache in [&mut layer.key, &mut layer.value] {
                for &(src, dst) in pairs {
                    let (s, d) = (src.0 as usize * block_len, dst.0 as usize * block_len);
                    cache.copy_within(s..s + block_len, d);
                }
            }
        }
    }

    /// Copies whole blocks (every layer, keys and values) into the swap pool.
    pub fn swap_out(&mut self, pairs: &[(BlockId, CpuBlockId)]) {
        let pairs: Vec<(usize, usize)> = pairs
            .iter()
            .map(|(g, c)| (g.0 as usize, c.0 as usize))
            .collect();
        copy_between(&self.layers, &mut self.cpu_layers, &pairs, self.block_len);
    }

    /// Copies whole blocks (every layer, keys and values) back from the swap pool.
    pub fn swap_in(&mut self, pairs: &[(CpuBlockId, BlockId)]) {
        let pairs: Vec<(usize, usize)> = pairs
            .iter()
            .map(|(c, g)| (c.0 as usize, g.0 as usize))
            .collect();
        copy_between(&self.cpu_layers, &mut self.layers, &pairs, self.block_len);
    }

    pub fn layers_mut(&mut self) -> &mut [LayerKvCache] {
        &mut self.layers
    }
}

/// `num_layers` zeroed key and value caches of `len` floats each. vec![0.0; n] asks the
/// allocator for zeroed pages, which the OS maps lazily: a large budget costs memory only as
/// blocks are first written.
fn alloc_layers(num_layers: usize, len: usize) -> Vec<LayerKvCache> {
    (0..num_layers)
        .map(|_| LayerKvCache {
            key: vec![0.0; len],
            value: vec![0.0; len],
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
                d[j * block_len..(j + 1) * block_len]
                    .copy_from_slice(&s[i * block_len..(i + 1) * block_len]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RopeScaling;

    fn tiny_config() -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            vocab_size: 8,
            hidden_size: 8,
            intermediate_size: 16,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            head_dim: 4,
            max_position_embeddings: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: true,
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
                    assert_eq!(c[off], mark(l, kind, 1, off));
                    assert_eq!(c[2 * len + off], mark(l, kind, 3, off));
                    assert_eq!(c[len + off], -1.0);
                    assert_eq!(c[3 * len + off], -1.0);
                }
            }
        }
    }

    #[test]
    fn swap_space_is_counted_in_whole_blocks() {
        let cfg = tiny_config();
        let block_bytes = CacheEngine::block_bytes(&cfg, 2);
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
