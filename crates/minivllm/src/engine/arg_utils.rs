//! The engine's settings (`EngineArgs`, vLLM's names and defaults) and the checks that turn
//! them into the scheduler's configuration.

use crate::config::{SpeculativeConfig, SpeculativeMethodConfig};
use crate::core::kv_cache_manager::{KvCacheManager, KvCacheManagerConfig};
use crate::core::kv_event_publisher::KvEventPublisher;
use crate::core::policy::Policy;
use crate::core::scheduler::{Scheduler, SchedulerConfig};
use crate::engine::errors::EngineError;
use crate::model_executor::loader::weights::LoadOptions;
use crate::reasoning::ReasoningParserName;
use crate::sampling_params::{logprob_count, SamplingParams, MAX_LOGPROBS};
use crate::worker::cache_engine::{CacheDtype, CacheEngine};
use crate::worker::worker_config::{CacheConfig, WorkerConfig};

/// Prompt tokens per step unless asked otherwise. A burst's prompts then complete a few at a
/// time, first come first served, each sending its first token as soon as it is done,
/// rather than all together once the whole burst is prefilled; on a CPU a step of this many
/// prompt tokens already spends nearly all its time computing (the weights are read once per
/// step, a small part of it), so prefill runs as fast as in larger steps
/// (`docs/benchmarks.md`, "Time to first token under a burst").
pub(crate) const DEFAULT_MAX_PREFILL_TOKENS: usize = 256;

/// Blocks a new sequence may not take (vLLM's watermark): a share of the cache kept free
/// so running sequences can grow without preempting at once.
const WATERMARK: f32 = 0.01;

/// Engine settings, with vLLM's names and defaults where they apply to a CPU engine.
/// Serialisable: the driver of a tensor-parallel group sends them to its workers.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct EngineArgs {
    pub model: String,
    /// Default: the model's context length.
    pub max_model_len: Option<usize>,
    pub max_num_seqs: usize,
    /// Default: 2048, raised to `max_model_len` when chunked prefill is off.
    pub max_num_batched_tokens: Option<usize>,
    /// Most prompt tokens one step computes (`--max-prefill-tokens`), within
    /// `max_num_batched_tokens`; decodes do not count. Default: [`DEFAULT_MAX_PREFILL_TOKENS`].
    pub max_prefill_tokens: Option<usize>,
    /// Prompts with more tokens than this to prefill share the machine's time with the
    /// other requests (`--long-prefill-token-threshold`, vLLM's name; 0: off). Default:
    /// the prefill budget, so prompts that take more than one step.
    pub long_prefill_token_threshold: Option<usize>,
    pub block_size: usize,
    /// Bytes of KV cache.
    pub kv_cache_memory: u64,
    /// What the KV cache stores (`--kv-cache-dtype`).
    pub kv_cache_dtype: CacheDtype,
    /// Bytes of CPU swap pool for preemption by swapping (`--swap-space`); 0 preempts by
    /// recompute only.
    pub swap_space: u64,
    pub enable_prefix_caching: bool,
    pub enable_chunked_prefill: bool,
    pub scheduling_policy: Policy,
    /// Kernel threads (default: all cores).
    pub threads: Option<usize>,
    /// How weights are kept in memory (`--dtype`, `--quantization`).
    pub load: LoadOptions,
    /// Ranks each layer is split over (`--tensor-parallel-size`): processes started by
    /// `mpirun`, one of which (rank 0) runs the engine.
    pub tensor_parallel_size: usize,
    /// `--reasoning-parser`: structured output constrains the answer after the thinking.
    pub reasoning_parser: Option<ReasoningParserName>,
    /// A Jinja chat template used instead of the model's (`--chat-template`).
    pub chat_template: Option<String>,
    /// `--speculative-config`: tokens guessed for the model to verify several per step.
    pub speculative_config: Option<SpeculativeConfig>,
    /// `--kv-events-config`: publish the prefix cache's changes as vLLM's KV cache events.
    pub kv_events_config: Option<crate::config::KvEventsConfig>,
    /// `--kv-transfer-config`: prefill/decode disaggregation's role and connector.
    pub kv_transfer_config: Option<crate::config::KvTransferConfig>,
    /// Most logprobs a request may ask for per position (`--max-logprobs`; default 20);
    /// [`ALL_LOGPROBS`](crate::sampling_params::ALL_LOGPROBS), `-1`, allows the whole
    /// vocabulary, which `logprobs=-1` asks for.
    #[serde(
        default = "default_max_logprobs",
        serialize_with = "logprob_count::serialize",
        deserialize_with = "logprob_count::deserialize"
    )]
    pub max_logprobs: usize,
}

fn default_max_logprobs() -> usize {
    MAX_LOGPROBS
}

impl Default for EngineArgs {
    fn default() -> Self {
        Self {
            model: String::new(),
            max_model_len: None,
            max_num_seqs: 256,
            max_num_batched_tokens: None,
            max_prefill_tokens: None,
            long_prefill_token_threshold: None,
            block_size: 16,
            kv_cache_memory: 1 << 30,
            kv_cache_dtype: CacheDtype::Auto,
            swap_space: 0,
            enable_prefix_caching: true,
            enable_chunked_prefill: true,
            scheduling_policy: Policy::Fcfs,
            threads: None,
            load: LoadOptions::default(),
            tensor_parallel_size: 1,
            reasoning_parser: None,
            chat_template: None,
            speculative_config: None,
            kv_events_config: None,
            kv_transfer_config: None,
            max_logprobs: MAX_LOGPROBS,
        }
    }
}

impl EngineArgs {
    /// Speculative decoding's method and settings, checked before anything loads.
    pub fn speculative(&self) -> Result<Option<SpeculativeMethodConfig>, EngineError> {
        let config = self.speculative_config.as_ref();
        config
            .map(SpeculativeConfig::resolve)
            .transpose()
            .map_err(EngineError::Config)
    }

    /// What the executor and every worker load and allocate.
    pub fn worker_config(&self) -> WorkerConfig {
        WorkerConfig {
            model: self.model.clone(),
            load: self.load,
            max_model_len: self.max_model_len,
            cache: CacheConfig {
                block_size: self.block_size,
                kv_cache_memory: self.kv_cache_memory,
                kv_cache_dtype: self.kv_cache_dtype,
                swap_space: self.swap_space,
                max_num_seqs: self.max_num_seqs,
                enable_prefix_caching: self.enable_prefix_caching,
            },
            threads: self.threads,
            tensor_parallel_size: self.tensor_parallel_size,
        }
    }
}

/// A request's sequences (`n`, or `best_of` when larger) must fit in one batch: a wider one
/// could never be scheduled whole, and its per-sequence state would be allocated for nothing.
pub fn check_width(params: &SamplingParams, max_num_seqs: usize) -> Result<(), EngineError> {
    let width = params.num_sequences();
    if width > max_num_seqs {
        return Err(EngineError::TooManySequences {
            width,
            max_num_seqs,
        });
    }
    Ok(())
}

/// Tokens one step may compute: as asked, else vLLM's defaults.
fn max_num_batched_tokens(args: &EngineArgs, max_model_len: usize) -> usize {
    let default_tokens = if args.enable_chunked_prefill {
        2048
    } else {
        max_model_len.max(2048)
    };
    args.max_num_batched_tokens.unwrap_or(default_tokens)
}

/// `state_slots`: the cache's linear-attention state slots (0: none), which cap the
/// sequences running at once.
pub(crate) fn scheduler_config(
    args: &EngineArgs,
    max_model_len: usize,
    state_slots: usize,
) -> Result<SchedulerConfig, EngineError> {
    if args.max_num_seqs == 0 {
        return Err(EngineError::Config("max_num_seqs must be positive".into()));
    }
    let max_num_seqs = match state_slots {
        0 => args.max_num_seqs,
        slots => {
            if slots < args.max_num_seqs {
                tracing::warn!(
                    max_num_seqs = slots,
                    asked = args.max_num_seqs,
                    "the linear-attention state slots that --kv-cache-memory holds cap the \
                     running sequences: raise it to run more at once"
                );
            }
            slots.min(args.max_num_seqs)
        }
    };
    let max_num_batched_tokens = max_num_batched_tokens(args, max_model_len);
    if max_num_batched_tokens == 0 {
        return Err(EngineError::Config(
            "max_num_batched_tokens must be positive".into(),
        ));
    }
    if !args.enable_chunked_prefill && max_num_batched_tokens < max_model_len {
        return Err(EngineError::Config(format!(
            "max_num_batched_tokens ({max_num_batched_tokens}) is smaller than max_model_len \
             ({max_model_len}) without chunked prefill: long prompts could never run"
        )));
    }
    let max_prefill_tokens = args
        .max_prefill_tokens
        .unwrap_or(DEFAULT_MAX_PREFILL_TOKENS);
    if max_prefill_tokens == 0 {
        return Err(EngineError::Config(
            "max_prefill_tokens must be positive".into(),
        ));
    }
    Ok(SchedulerConfig {
        max_num_batched_tokens,
        max_num_seqs,
        enable_chunked_prefill: args.enable_chunked_prefill,
        max_prefill_tokens,
        long_prefill_token_threshold: args
            .long_prefill_token_threshold
            .unwrap_or(max_prefill_tokens),
        policy: args.scheduling_policy,
    })
}

/// Refuses a KV cache (the executor's, as `args` sized it) that cannot hold one sequence of
/// `max_model_len` tokens, or that `args` cannot use (see [`check_state_support`]).
pub(crate) fn check_kv_cache_fits(
    args: &EngineArgs,
    cache: &CacheEngine,
    max_model_len: usize,
) -> Result<(), EngineError> {
    check_state_support(args.speculative_config.is_some(), cache)?;
    // A new sequence is admitted only while the watermark's blocks stay free, so a prompt
    // of max_model_len must fit in the rest or it could never start.
    let watermark_blocks = (cache.num_blocks() as f32 * WATERMARK).ceil() as usize;
    let usable = cache.num_blocks() - watermark_blocks.min(cache.num_blocks());
    let bs = args.block_size;
    let layout = cache.layout();
    if layout.num_groups() == 1 && !layout.has_sliding_window() {
        let capacity = usable * bs;
        if capacity < max_model_len {
            return Err(EngineError::Config(format!(
                "the KV cache holds {capacity} tokens, fewer than max_model_len \
                 {max_model_len}: raise --kv-cache-memory or lower --max-model-len"
            )));
        }
        return Ok(());
    }
    // A sliding-window group holds at most its window and one step's new tokens.
    let step = max_num_batched_tokens(args, max_model_len);
    let whole = max_model_len.div_ceil(bs);
    let needed: usize = (layout.windows().iter())
        .map(|w| w.map_or(whole, |w| whole.min((step + w - 1).div_ceil(bs) + 1)))
        .sum();
    if usable < needed {
        return Err(EngineError::Config(format!(
            "the KV cache holds {usable} blocks of {bs} tokens ({} layers each), fewer than \
             the {needed} blocks one sequence of max_model_len {max_model_len} needs over the \
             model's {} KV cache groups: raise --kv-cache-memory or lower --max-model-len",
            layout.num_slots(),
            layout.num_groups()
        )));
    }
    Ok(())
}

/// Refuses what a model with linear-attention layers cannot run: speculative decoding
/// (`speculative`), whose rejected draft tokens cannot be taken back out of a state.
fn check_state_support(speculative: bool, cache: &CacheEngine) -> Result<(), EngineError> {
    if speculative && cache.num_state_slots() > 0 {
        return Err(EngineError::Config(
            "speculative decoding is not supported for models with linear-attention layers \
             (Qwen3.5): their state cannot take rejected draft tokens back"
                .into(),
        ));
    }
    Ok(())
}

/// The KV cache manager over `cache`'s blocks, its swap pool and its state slots.
/// The scheduler, over a KV cache manager sized to `cache`, publishing its prefix cache's
/// changes where `--kv-events-config` asks.
pub(crate) fn scheduler(
    args: &EngineArgs,
    cfg: SchedulerConfig,
    cache: &CacheEngine,
) -> Result<Scheduler, EngineError> {
    let mut scheduler = Scheduler::new(cfg, kv_cache_manager(args, cache));
    if let Some(c) = args.kv_events_config.as_ref().filter(|c| c.publishes()) {
        scheduler.set_kv_event_publisher(KvEventPublisher::start(c)?);
    }
    Ok(scheduler)
}

fn kv_cache_manager(args: &EngineArgs, cache: &CacheEngine) -> KvCacheManager {
    KvCacheManager::new(KvCacheManagerConfig {
        num_blocks: cache.num_blocks(),
        block_size: args.block_size,
        enable_prefix_caching: args.enable_prefix_caching,
        watermark: WATERMARK,
        group_windows: cache.layout().windows().to_vec(),
        num_cpu_blocks: cache.num_cpu_blocks(),
        num_state_slots: cache.num_state_slots(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use minivllm_kernels::attention::KvCacheDtype;
    use serde_json::json;

    /// Gemma 3 270M's shape: 18 layers, five sliding (window 512) to one global.
    fn gemma3() -> ModelConfig {
        ModelConfig::from_hf_json(&json!({
            "architectures": ["Gemma3ForCausalLM"], "hidden_size": 640,
            "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
            "sliding_window": 512, "sliding_window_pattern": 6,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "query_pre_attn_scalar": 256
        }))
        .unwrap()
    }

    #[test]
    fn a_sliding_window_cache_is_sized_for_one_whole_sequence_over_its_groups() {
        let config = gemma3();
        let bytes = CacheEngine::block_bytes(&config, 16, KvCacheDtype::Float16);
        let args = EngineArgs {
            max_num_batched_tokens: Some(256),
            ..EngineArgs::default()
        };
        let cache = |blocks: u64| {
            CacheEngine::with_budget(&config, 16, blocks * bytes, KvCacheDtype::Float16, 256)
                .unwrap()
        };
        // 8192 tokens: 512 blocks for the global group, and in each of the five sliding
        // groups the window and a step, (256 + 511) / 16 + 1 = 49: 757 blocks, 8 more for
        // the watermark.
        let ok = cache(766);
        assert_eq!(ok.layout().num_groups(), 6);
        check_kv_cache_fits(&args, &ok, 8192).unwrap();
        let e = check_kv_cache_fits(&args, &cache(760), 8192)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fewer than the 757 blocks"), "{e}");
        assert!(e.contains("--kv-cache-memory"), "{e}");
    }
}
