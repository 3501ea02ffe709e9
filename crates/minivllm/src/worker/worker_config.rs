//! What every rank needs to load its part of the model and size its KV cache (vLLM's
//! `ModelConfig`/`CacheConfig`/`LoadConfig` as the workers see them), and why a worker
//! could not start. The driver of a tensor-parallel group sends it to the other ranks, so
//! it is serialisable and holds nothing the scheduler alone needs.

use crate::config::ModelConfig;
use crate::distributed::CommError;
use crate::model_executor::loader::weights::LoadOptions;
use crate::model_executor::loader::LoadError;
use crate::worker::cache_engine::{CacheDtype, CacheError};

/// The KV cache a rank allocates.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CacheConfig {
    /// Tokens per block (`--block-size`).
    pub block_size: usize,
    /// Bytes of KV cache (`--kv-cache-memory`): as many blocks as fit.
    pub kv_cache_memory: u64,
    /// What the cache stores (`--kv-cache-dtype`).
    pub kv_cache_dtype: CacheDtype,
    /// Bytes of CPU swap pool (`--swap-space`); 0 for none.
    pub swap_space: u64,
    /// The most sequences running at once (`--max-num-seqs`): with
    /// `enable_prefix_caching`, the most linear-attention state slots worth allocating.
    pub max_num_seqs: usize,
    /// Prefix caching (`--enable-prefix-caching`), which keeps linear-attention states at
    /// block boundaries in slots of their own.
    pub enable_prefix_caching: bool,
}

impl CacheConfig {
    /// The most linear-attention state slots worth allocating: one per sequence that may
    /// run, and as many again for prefix caching's states when it is on.
    pub fn max_state_slots(&self) -> usize {
        self.max_num_seqs * if self.enable_prefix_caching { 2 } else { 1 }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WorkerConfig {
    /// A GGUF file, a Hugging Face folder or a cached repo id.
    pub model: String,
    /// How weights are kept in memory (`--dtype`, `--quantization`).
    pub load: LoadOptions,
    /// Default: the model's context length.
    pub max_model_len: Option<usize>,
    pub cache: CacheConfig,
    /// Kernel threads per rank (default: all cores).
    pub threads: Option<usize>,
    /// Ranks the model is split over.
    pub tensor_parallel_size: usize,
}

impl WorkerConfig {
    /// Starts the kernels' thread pool with the threads asked for.
    pub(crate) fn init_threads(&self) {
        let threads = self
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        minivllm_kernels::threading::init_threads(threads.max(1));
    }
}

/// `--max-model-len` checked against the model's context length (the default).
pub fn resolve_max_model_len(
    asked: Option<usize>,
    config: &ModelConfig,
) -> Result<usize, WorkerError> {
    let context = config.max_position_embeddings;
    match asked {
        Some(0) => Err(WorkerError::Config("max_model_len must be positive".into())),
        Some(n) if n > context => Err(WorkerError::Config(format!(
            "max_model_len {n} exceeds the model's context length of {context}"
        ))),
        Some(n) => Ok(n),
        None => Ok(context),
    }
}

/// Why the executor or a worker could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("invalid engine arguments: {0}")]
    Config(String),
    /// Tensor parallelism's group could not form, or broke.
    #[error(transparent)]
    Distributed(#[from] CommError),
}
