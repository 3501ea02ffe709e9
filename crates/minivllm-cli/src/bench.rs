//! `minivllm bench latency` and `bench throughput`: the model's speed offline (the serving
//! benchmark is in `bench_serve`).

use std::time::{Duration, Instant};

use anyhow::bail;
use minivllm::engine::llm_engine::{EngineArgs, LLMEngine, PromptInput};
use minivllm::kernels::qmatmul::QKernel;
use minivllm::sampling_params::{RequestOutputKind, SamplingParams};

use crate::ModelArgs;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    kind: BenchKind,
}

#[derive(clap::Subcommand)]
enum BenchKind {
    /// Time one batch: a prefill of `--input-len` tokens per sequence, then `--output-len` decode steps.
    Latency(LatencyArgs),
    /// Offline throughput through the engine: many requests at once, like `vllm bench throughput`.
    Throughput(ThroughputArgs),
    /// Load an OpenAI-compatible server with streamed requests, like `vllm bench serve`.
    Serve(crate::bench_serve::ServeBenchArgs),
    /// Measure this machine's limits (read bandwidth, each instruction set's peak); the other
    /// benchmarks then quote their figures as a share of them.
    Machine(crate::bench_machine::MachineArgs),
    /// Offline throughput at several numbers of sequences, with an SVG chart.
    Sweep(crate::bench_sweep::SweepArgs),
}

#[derive(clap::Args)]
struct ThroughputArgs {
    #[command(flatten)]
    engine: crate::EngineFlags,
    #[arg(long, default_value_t = 64)]
    num_prompts: usize,
    /// Tokens per (random) prompt.
    #[arg(long, default_value_t = 128)]
    input_len: usize,
    /// Tokens generated per prompt (EOS ignored, so every request makes exactly this many).
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    #[arg(long)]
    progress: bool,
    /// Print the results as one JSON object.
    #[arg(long)]
    json: bool,
    /// Constrain every completion (structured output) to measure what it costs: `regex`
    /// (letters and spaces, never complete), `json` (an array of objects, which the model
    /// may close early) or `json-enum` (an array of enum strings).
    #[arg(long, value_enum)]
    structured_output: Option<BenchConstraint>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum BenchConstraint {
    Regex,
    Json,
    JsonEnum,
}

impl BenchConstraint {
    fn params(self) -> minivllm::sampling_params::StructuredOutputsParams {
        use minivllm::sampling_params::StructuredOutputsParams as P;
        match self {
            BenchConstraint::Regex => P::regex("[a-z ]*"),
            BenchConstraint::Json => P::json_schema(serde_json::json!({
                "type": "array",
                "items": {"type": "object", "properties": {"id": {"type": "integer"},
                    "name": {"type": "string"}}, "required": ["id", "name"]}
            })),
            BenchConstraint::JsonEnum => P::json_schema(serde_json::json!({
                "type": "array", "items": {"enum": ["red", "green", "blue", "cyan"]}
            })),
        }
    }
}

#[derive(clap::Args)]
struct LatencyArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value_t = 512)]
    input_len: usize,
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    #[arg(long, default_value_t = 1)]
    batch_size: usize,
    #[arg(long, default_value_t = 3)]
    num_iters: usize,
    /// Untimed runs first, so page faults and thread start-up are not measured.
    #[arg(long, default_value_t = 1)]
    num_iters_warmup: usize,
    /// Print the results as one JSON object.
    #[arg(long)]
    json: bool,
}

impl BenchArgs {
    /// The model options of a benchmark that runs a model here.
    pub fn model_args(&self) -> Option<&ModelArgs> {
        match &self.kind {
            BenchKind::Latency(a) => Some(&a.model),
            BenchKind::Throughput(a) => Some(&a.engine.model),
            BenchKind::Sweep(a) => Some(a.model_args()),
            BenchKind::Serve(_) | BenchKind::Machine(_) => None,
        }
    }
}

/// `driver`: rank 0's hold on a tensor-parallel group, for the benchmarks that run a model.
pub fn run(
    args: BenchArgs,
    driver: Option<minivllm::worker::worker_process::Driver>,
) -> anyhow::Result<()> {
    match args.kind {
        BenchKind::Latency(a) => latency(a, driver),
        BenchKind::Throughput(a) => throughput(a, driver),
        BenchKind::Serve(a) => crate::bench_serve::run(a),
        BenchKind::Machine(a) => crate::bench_machine::run(a),
        BenchKind::Sweep(a) => crate::bench_sweep::run(a, driver),
    }
}

/// Deterministic pseudo-random token ids, so runs and peers see the same prompts.
pub(crate) fn random_prompts(n: usize, len: usize, vocab: u64) -> Vec<Vec<u32>> {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            (0..len)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((seed >> 33) % vocab) as u32
                })
                .collect()
        })
        .collect()
}

fn throughput(
    args: ThroughputArgs,
    driver: Option<minivllm::worker::worker_process::Driver>,
) -> anyhow::Result<()> {
    use minivllm::entrypoints::llm::LLM;
    if args.num_prompts == 0 || args.input_len == 0 || args.output_len == 0 {
        bail!("--num-prompts, --input-len and --output-len must be positive");
    }
    let mut llm = LLM::with_driver(&args.engine.engine_args()?, driver)?;
    let vocab = llm.engine().tokenizer().vocab_size() as u64;
    let prompts = random_prompts(args.num_prompts, args.input_len, vocab);
    let params = SamplingParams {
        temperature: 0.0,
        ignore_eos: true,
        max_tokens: Some(args.output_len),
        structured_outputs: args.structured_output.map(BenchConstraint::params),
        ..SamplingParams::default()
    };
    let start = Instant::now();
    let outs = llm.generate(prompts, &params, args.progress)?;
    let secs = start.elapsed().as_secs_f64();
    let output_tokens: usize = outs.iter().map(|o| o.num_generated_tokens()).sum();
    let total_tokens = output_tokens + args.num_prompts * args.input_len;
    let stats = llm.engine().stats();
    let overhead_per_step = stats.overhead_seconds() / stats.num_steps.max(1) as f64;
    let report = serde_json::json!({
        "elapsed_time": secs,
        "num_requests": args.num_prompts,
        "requests_per_second": args.num_prompts as f64 / secs,
        "output_tokens_per_second": output_tokens as f64 / secs,
        "tokens_per_second": total_tokens as f64 / secs,
        "num_preemptions": stats.num_preemptions,
        "num_swapped_out": stats.num_swapped_out,
        "num_steps": stats.num_steps,
        "overhead_seconds_per_step": overhead_per_step,
        "overhead_share": stats.overhead_seconds() / stats.step_seconds.max(1e-9),
        "num_token_masks": stats.grammar.num_token_masks,
        "token_mask_us": stats.grammar.per_token_us().0,
        "grammar_accept_us": stats.grammar.per_token_us().1,
    });
    let env = Environment::now();
    // Every prompt token and every generated token but the last goes through the layers once;
    // each generated token costs one LM head row.
    let model = llm.engine().model();
    let per_seq_tokens = args.input_len + args.output_len - 1;
    let flops = args.num_prompts as f64 * model.sequence_flops(per_seq_tokens, args.output_len);
    let gflops = flops / secs / 1e9;
    let shares = Shares::new(&env, &model.weight_formats());
    if args.json {
        let mut report = report;
        report["gflop_per_second"] = gflops.into();
        report["share_of_peak"] = shares.compute_share(gflops).into();
        report["peak"] = shares.peak_name.into();
        env.add_to(&mut report);
        println!("{report}");
    } else {
        println!(
            "{} requests x ({} in + {} out) in {secs:.2} s: {:.2} requests/s, {:.1} output tokens/s, {:.1} total tokens/s ({} steps, {} preemptions)",
            args.num_prompts,
            args.input_len,
            args.output_len,
            args.num_prompts as f64 / secs,
            output_tokens as f64 / secs,
            total_tokens as f64 / secs,
            stats.num_steps,
            stats.num_preemptions
        );
        println!(
            "compute: {gflops:.1} GFLOP/s{}",
            shares.compute_text(gflops)
        );
        println!(
            "per step: {:.2} ms, of which {:.3} ms ({:.1} %) outside the forward pass \
             (scheduling, input preparation, sampling, outputs)",
            stats.step_seconds * 1e3 / stats.num_steps.max(1) as f64,
            overhead_per_step * 1e3,
            100.0 * stats.overhead_seconds() / stats.step_seconds.max(1e-9)
        );
        let g = stats.grammar;
        if g.num_token_masks > 0 {
            let (mask_us, accept_us) = g.per_token_us();
            println!(
                "structured output: {} tokens constrained; per token {mask_us:.1} us for the \
                 mask, {accept_us:.1} us advancing the grammar ({:.1} % of the steps' time in \
                 all)",
                g.num_token_masks,
                100.0 * (g.mask_seconds + g.accept_seconds) / stats.step_seconds.max(1e-9)
            );
        }
        let spec = stats.spec_decode;
        if spec.num_drafts > 0 {
            println!(
                "speculative decoding: {} drafts of {} tokens, {:.1} % accepted, mean \
                 acceptance length {:.2} tokens per drafted step",
                spec.num_drafts,
                spec.num_draft_tokens,
                100.0 * spec.acceptance_rate(),
                spec.mean_acceptance_length()
            );
        }
        env.print();
        shares.print_hint();
    }
    Ok(())
}

struct Timing {
    prefill: Duration,
    decode: Duration,
    /// Of each, the time in tensor parallelism's collectives (on rank 0), where measured.
    prefill_comm: Option<Duration>,
    decode_comm: Option<Duration>,
    /// Of the decode steps, the seconds outside the model's forward pass.
    decode_overhead: f64,
}

fn latency(
    args: LatencyArgs,
    driver: Option<minivllm::worker::worker_process::Driver>,
) -> anyhow::Result<()> {
    if args.batch_size == 0 || args.input_len == 0 || args.num_iters == 0 {
        bail!("--batch-size, --input-len and --num-iters must be positive");
    }
    let mut engine = LLMEngine::from_engine_args_with_driver(&latency_engine_args(&args)?, driver)?;
    let total = args.input_len + args.output_len;
    if total > engine.max_model_len() {
        bail!(
            "input + output length {total} exceeds the maximum model length {}",
            engine.max_model_len()
        );
    }
    let per_seq = total.div_ceil(args.model.block_size);
    if per_seq * args.batch_size > engine.num_total_blocks() {
        bail!("the KV cache is too small for this batch: raise --kv-cache-memory");
    }
    let vocab = engine.model().config().vocab_size as u64;
    let prompts = random_prompts(args.batch_size, args.input_len, vocab);
    for _ in 0..args.num_iters_warmup {
        run_once(&mut engine, &prompts, args.output_len)?;
    }
    let mut runs: Vec<Timing> = (0..args.num_iters)
        .map(|_| run_once(&mut engine, &prompts, args.output_len))
        .collect::<anyhow::Result<_>>()?;
    runs.sort_by_key(|t| t.prefill + t.decode);
    let t = &runs[runs.len() / 2];
    let prefill_tokens = (args.batch_size * args.input_len) as f64;
    // The first output token comes from the prefill; the rest from decode steps.
    let decode_steps = args.output_len.saturating_sub(1);
    let decode_tokens = (args.batch_size * decode_steps) as f64;
    let model = engine.model();
    let weight_bytes = model.weight_bytes_per_token() as f64;
    let prefill_tps = prefill_tokens / t.prefill.as_secs_f64();
    let step_s = t.decode.as_secs_f64() / decode_steps.max(1) as f64;
    let decode_tps = decode_tokens / t.decode.as_secs_f64();
    // What the work weighs: FLOPs of the prefill, bytes and FLOPs of an average decode step.
    let batch = args.batch_size as f64;
    let prefill_flops = batch * model.sequence_flops(args.input_len, 1);
    let mid_context = args.input_len + args.output_len / 2;
    let kv_bytes = engine.kv_bytes_per_position();
    let step_bytes = weight_bytes + batch * (kv_bytes * mid_context) as f64;
    let step_flops = batch
        * (model.layer_flops_per_token() + model.head_flops() + model.attention_flops(mid_context));
    let prefill_gflops = prefill_flops / t.prefill.as_secs_f64() / 1e9;
    let decode_gbs = step_bytes / step_s / 1e9;
    let overhead_s = t.decode_overhead / decode_steps.max(1) as f64;
    let env = Environment::now();
    let formats: Vec<String> = model
        .weight_formats()
        .iter()
        .map(|(f, b)| format!("{f} {:.1} MiB", *b as f64 / (1 << 20) as f64))
        .collect();
    let shares = Shares::new(&env, &model.weight_formats());
    if args.json {
        let mut report = serde_json::json!({
            "batch_size": args.batch_size,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "prefill_seconds": t.prefill.as_secs_f64(),
            "prefill_tokens_per_second": prefill_tps,
            "prefill_gflop_per_second": prefill_gflops,
            "prefill_share_of_peak": shares.compute_share(prefill_gflops),
            "peak": shares.peak_name,
            "weights": formats,
            "weight_bytes_per_step": weight_bytes,
        });
        if let Some(c) = t.prefill_comm {
            report["tensor_parallel_size"] = args.model.tensor_parallel_size.into();
            report["prefill_collective_seconds"] = c.as_secs_f64().into();
        }
        if let (Some(c), true) = (t.decode_comm, decode_steps > 0) {
            report["decode_collective_seconds"] = c.as_secs_f64().into();
        }
        if decode_steps > 0 {
            report["decode_seconds"] = t.decode.as_secs_f64().into();
            report["decode_tokens_per_second"] = decode_tps.into();
            report["decode_weight_gb_per_second"] = (weight_bytes / step_s / 1e9).into();
            report["decode_bytes_per_step"] = step_bytes.into();
            report["decode_gb_per_second"] = decode_gbs.into();
            report["decode_share_of_bandwidth"] = shares.bandwidth_share(decode_gbs).into();
            report["decode_gflop_per_second"] = (step_flops / step_s / 1e9).into();
            report["decode_overhead_seconds_per_step"] = overhead_s.into();
            report["decode_overhead_share"] = (overhead_s / step_s).into();
        }
        env.add_to(&mut report);
        println!("{report}");
        return Ok(());
    }
    println!(
        "batch {} x (input {} + output {}), median of {} runs",
        args.batch_size, args.input_len, args.output_len, args.num_iters
    );
    println!(
        "prefill: {:.3} s, {prefill_tps:.1} tokens/s, {prefill_gflops:.1} GFLOP/s{}",
        t.prefill.as_secs_f64(),
        shares.compute_text(prefill_gflops)
    );
    if decode_steps > 0 {
        println!(
            "decode:  {:.3} s, {decode_tps:.1} tokens/s, {:.2} ms per step, {:.1} MB read per step \
             (weights and KV cache) at {decode_gbs:.1} GB/s{}",
            t.decode.as_secs_f64(),
            step_s * 1e3,
            step_bytes / 1e6,
            shares.bandwidth_text(decode_gbs)
        );
        println!(
            "         {:.3} ms per step ({:.1} %) outside the forward pass (scheduling, input \
             preparation, sampling, outputs)",
            overhead_s * 1e3,
            100.0 * overhead_s / step_s
        );
    }
    println!(
        "weights: {} ({:.1} MB read per decode step)",
        formats.join(", "),
        weight_bytes / 1e6
    );
    print_collectives(t, args.model.tensor_parallel_size, decode_steps);
    env.print();
    shares.print_hint();
    Ok(())
}

/// With tensor parallelism: the share of each phase that rank 0 spent in collectives
/// (sending, and waiting for the slowest rank).
fn print_collectives(t: &Timing, tensor_parallel_size: usize, decode_steps: usize) {
    let share = |c: Duration, of: Duration| 100.0 * c.as_secs_f64() / of.as_secs_f64();
    if let Some(c) = t.prefill_comm {
        println!(
            "tensor parallel {tensor_parallel_size}, rank 0 in collectives: prefill {:.3} s \
             ({:.0} %)",
            c.as_secs_f64(),
            share(c, t.prefill)
        );
    }
    if let (Some(c), true) = (t.decode_comm, decode_steps > 0) {
        println!(
            "tensor parallel {tensor_parallel_size}, rank 0 in collectives: decode {:.2} ms \
             per step ({:.0} %)",
            c.as_secs_f64() * 1e3 / decode_steps as f64,
            share(c, t.decode)
        );
    }
}

/// A run's rates as shares of this machine's limits, when `bench machine` has measured them.
struct Shares {
    limits: Option<crate::bench_machine::MachineLimits>,
    /// The compute limit that bounds the linear layers with these weight formats.
    peak_name: Option<&'static str>,
}

impl Shares {
    fn new(env: &Environment, formats: &[(&'static str, usize)]) -> Self {
        // F16/BF16 weights are widened and multiplied in f32, like F32 ones.
        let quantised = formats
            .iter()
            .any(|(f, _)| !matches!(*f, "F32" | "F16" | "BF16"));
        use minivllm::kernels::probe;
        let peak_name = match (env.isa.as_str(), quantised) {
            ("scalar", _) => None,
            (_, true) => QKernel::best().peak_name(),
            ("avx512", false) => Some(probe::F32_FMA_AVX512),
            (_, false) => Some(probe::F32_FMA_AVX2),
        };
        Self {
            limits: crate::bench_machine::MachineLimits::load(&env.cpu, env.threads),
            peak_name,
        }
    }

    fn compute_share(&self, gflops: f64) -> Option<f64> {
        let peak = self.limits.as_ref()?.get(self.peak_name?)?;
        Some(gflops / peak)
    }

    fn bandwidth_share(&self, gbs: f64) -> Option<f64> {
        Some(gbs / self.limits.as_ref()?.bandwidth()?)
    }

    fn compute_text(&self, gflops: f64) -> String {
        match (self.compute_share(gflops), self.peak_name, &self.limits) {
            (Some(share), Some(name), Some(l)) => format!(
                " ({:.0} % of the {name} peak, {:.0})",
                share * 100.0,
                l.get(name).unwrap_or(0.0)
            ),
            _ => String::new(),
        }
    }

    fn bandwidth_text(&self, gbs: f64) -> String {
        match (self.bandwidth_share(gbs), &self.limits) {
            (Some(share), Some(l)) => format!(
                " ({:.0} % of the {:.1} GB/s read bandwidth)",
                share * 100.0,
                l.bandwidth().unwrap_or(0.0)
            ),
            _ => String::new(),
        }
    }

    fn print_hint(&self) {
        if self.limits.is_none() {
            println!("(run `minivllm bench machine` once to see these figures as a share of this machine's limits)");
        }
    }
}

/// What a benchmark ran on: every figure is quoted with it.
pub(crate) struct Environment {
    pub cpu: String,
    pub isa: String,
    /// The integer kernel of quantised weights (`QKernel::name`).
    pub int8_kernel: &'static str,
    pub threads: usize,
    pub peak_rss_mb: Option<f64>,
}

impl Environment {
    pub fn now() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        Self {
            cpu,
            isa: format!("{:?}", minivllm::kernels::cpu::isa()).to_lowercase(),
            int8_kernel: QKernel::best().name(),
            threads: minivllm::kernels::threading::num_threads(),
            peak_rss_mb: peak_rss_bytes().map(|b| b as f64 / 1e6),
        }
    }

    pub(crate) fn print(&self) {
        let rss = self
            .peak_rss_mb
            .map_or("unknown".into(), |m| format!("{m:.0} MB"));
        println!(
            "cpu: {}, isa {} (int8: {}), {} threads; peak memory (RSS) {rss}",
            self.cpu, self.isa, self.int8_kernel, self.threads
        );
    }

    pub(crate) fn add_to(&self, report: &mut serde_json::Value) {
        report["cpu"] = self.cpu.clone().into();
        report["isa"] = self.isa.clone().into();
        report["int8_kernel"] = self.int8_kernel.into();
        report["threads"] = self.threads.into();
        report["peak_rss_mb"] = self.peak_rss_mb.into();
    }
}

/// The process's peak resident memory (`VmHWM`), where Linux reports it.
fn peak_rss_bytes() -> Option<u64> {
    minivllm::utils::proc_kib_field("/proc/self/status", "VmHWM")
}

/// The engine for `bench latency`: the whole batch prefilled in its first step, then one
/// decode step per token, as `vllm bench latency` drives vLLM's.
fn latency_engine_args(args: &LatencyArgs) -> anyhow::Result<EngineArgs> {
    let m = &args.model;
    crate::check_default_model(&m.model)?;
    Ok(EngineArgs {
        model: m.model.clone(),
        max_model_len: m.max_model_len,
        max_num_seqs: args.batch_size,
        max_num_batched_tokens: Some((args.batch_size * args.input_len).max(2048)),
        max_prefill_tokens: Some((args.batch_size * args.input_len).max(2048)),
        block_size: m.block_size,
        kv_cache_memory: m.kv_cache_memory,
        kv_cache_dtype: m.kv_cache_dtype,
        // Every iteration sends the same prompts: cached prefixes would skip the prefill.
        enable_prefix_caching: false,
        threads: m.threads,
        load: m.load_options(),
        tensor_parallel_size: m.tensor_parallel_size,
        ..EngineArgs::default()
    })
}

/// One batch through the engine: the step that prefills every prompt (and samples each
/// first token), then the decode steps until every request has `output_len` tokens.
fn run_once(
    engine: &mut LLMEngine,
    prompts: &[Vec<u32>],
    output_len: usize,
) -> anyhow::Result<Timing> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT_ID: AtomicUsize = AtomicUsize::new(0);
    let params = SamplingParams {
        temperature: 0.0,
        ignore_eos: true,
        max_tokens: Some(output_len),
        // As vLLM's benchmark, through `LLM`: no step builds an output nobody reads.
        output_kind: RequestOutputKind::FinalOnly,
        ..SamplingParams::default()
    };
    for p in prompts {
        let id = format!("latency-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
        engine.add_request(id, PromptInput::from(p.clone()), params.clone(), 0)?;
    }
    let comm = |engine: &LLMEngine| engine.model().communicator().time_in_collectives();
    let (start, comm_start) = (Instant::now(), comm(engine));
    engine.step()?;
    let prefill = start.elapsed();
    let comm_prefill_end = comm(engine);
    let (start, overhead_start) = (Instant::now(), engine.stats().overhead_seconds());
    let mut steps = 0;
    while engine.has_unfinished_requests() {
        engine.step()?;
        steps += 1;
    }
    let decode = start.elapsed();
    let decode_overhead = engine.stats().overhead_seconds() - overhead_start;
    let comm_end = comm(engine);
    if steps != output_len.saturating_sub(1) {
        bail!(
            "the batch took {steps} decode steps, not {}: the prompts did not prefill in one step \
             or sequences were preempted (raise --kv-cache-memory)",
            output_len.saturating_sub(1)
        );
    }
    let between = |a: Option<Duration>, b: Option<Duration>| Some(b? - a?);
    Ok(Timing {
        prefill,
        decode,
        prefill_comm: between(comm_start, comm_prefill_end),
        decode_comm: between(comm_prefill_end, comm_end),
        decode_overhead,
    })
}
