//! `minivllm bench latency` and `bench throughput`: the model's speed offline (the serving
//! benchmark is in `bench_serve`).

use std::time::Instant;

use anyhow::bail;
use minivllm::kernels::qmatmul::QKernel;
use minivllm::sampling_params::SamplingParams;

use crate::ModelArgs;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    kind: BenchKind,
}

#[derive(clap::Subcommand)]
enum BenchKind {
    /// Time one batch: a prefill of `--input-len` tokens per sequence, then `--output-len` decode steps.
    Latency(crate::bench_latency::LatencyArgs),
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

impl BenchArgs {
    /// The model options of a benchmark that runs a model here.
    pub fn model_args(&self) -> Option<&ModelArgs> {
        match &self.kind {
            BenchKind::Latency(a) => Some(a.model_args()),
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
        BenchKind::Latency(a) => crate::bench_latency::run(a, driver),
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
        print_speculation(&stats, None);
        env.print();
        shares.print_hint();
    }
    Ok(())
}

/// Speculative decoding's acceptance (over `steps` decode steps where counted) and the step
/// cost that set its draft lengths: the crossover where guesses stop paying.
pub(crate) fn print_speculation(
    stats: &minivllm::engine::metrics::EngineStats,
    steps: Option<String>,
) {
    let spec = stats.spec_decode;
    if spec.num_drafts == 0 {
        return;
    }
    println!(
        "speculative decoding: {}{} drafts of {} tokens, {:.1} % accepted, mean acceptance \
         length {:.2}",
        steps.map(|s| s + "; ").unwrap_or_default(),
        spec.num_drafts,
        spec.num_draft_tokens,
        100.0 * spec.acceptance_rate(),
        spec.mean_acceptance_length()
    );
    let Some(d) = stats.spec_draft_length else {
        return;
    };
    if let Some((t0, t1)) = d.cost().fit() {
        let bars: Vec<String> = [1, 4, 16, 64]
            .iter()
            .map(|&b| format!("{:.2} at {b}", d.bar(b)))
            .collect();
        println!(
            "  step cost fitted: {:.2} ms + {:.3} ms per token, {:.3} ms per guess drafted; \
             acceptance a guess needs by sequences running: {}",
            t0 * 1e3,
            t1 * 1e3,
            d.draft_seconds().unwrap_or(0.0) * 1e3,
            bars.join(", ")
        );
    }
}

/// A run's rates as shares of this machine's limits, when `bench machine` has measured them.
pub(crate) struct Shares {
    limits: Option<crate::bench_machine::MachineLimits>,
    /// The compute limit that bounds the linear layers with these weight formats.
    pub(crate) peak_name: Option<&'static str>,
}

impl Shares {
    pub(crate) fn new(env: &Environment, formats: &[(&'static str, usize)]) -> Self {
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

    pub(crate) fn compute_share(&self, gflops: f64) -> Option<f64> {
        let peak = self.limits.as_ref()?.get(self.peak_name?)?;
        Some(gflops / peak)
    }

    pub(crate) fn bandwidth_share(&self, gbs: f64) -> Option<f64> {
        Some(gbs / self.limits.as_ref()?.bandwidth()?)
    }

    pub(crate) fn compute_text(&self, gflops: f64) -> String {
        match (self.compute_share(gflops), self.peak_name, &self.limits) {
            (Some(share), Some(name), Some(l)) => format!(
                " ({:.0} % of the {name} peak, {:.0})",
                share * 100.0,
                l.get(name).unwrap_or(0.0)
            ),
            _ => String::new(),
        }
    }

    pub(crate) fn bandwidth_text(&self, gbs: f64) -> String {
        match (self.bandwidth_share(gbs), &self.limits) {
            (Some(share), Some(l)) => format!(
                " ({:.0} % of the {:.1} GB/s read bandwidth)",
                share * 100.0,
                l.bandwidth().unwrap_or(0.0)
            ),
            _ => String::new(),
        }
    }

    pub(crate) fn print_hint(&self) {
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
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    minivllm::utils::proc_kib_field("/proc/self/status", "VmHWM")
}
