//! The KV cache memory: every layer's key and value blocks.

use crate::config::ModelConfig;
use crate::core::block_pool::BlockId;
use crate::model_executor::layers::attention::LayerKvCache;

/// Owns the paged KV cache: `num_blocks` blocks of `block_size` tokens in every layer.
pub struct CacheEngine {
    block_size: usize,
    num_blocks: usize,
    /// Floats per block in one layer's key (or value) cache.
    block_len: usize,
    layers: Vec<LayerKvCache>,
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
        let per_layer = num_blocks * block_size * config.kv_size();
        // vec![0.0; n] asks the allocator for zeroed pages, which the OS maps lazily: a large
        // budget costs memory only as blocks are first written.
        let layers = (0..config.num_hidden_layers)
            .map(|_| LayerKvCache {
                key: vec![0.0; per_layer],
                value: vec![0.0; per_layer],
            })
            .collect();
        tracing::info!(
            num_blocks,
            block_size,
            tokens = num_blocks * block_size,
            "KV cache allocated"
        );
        Self {
            block_size,
            num_blocks,
            block_len: block_size * config.kv_size(),
            layers,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
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

    pub fn layers_mut(&mut self) -> &mut [LayerKvCache] {
        &mut self.layers
    }
}
