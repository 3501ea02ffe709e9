//! `minivllm bench latency`: one batch's prefill, then its decode steps, timed apart (as
//! `vllm bench latency`); with `--speculative-config` the decode is speculative, and
//! `--prompt-file` gives a real prompt instead of random tokens so guesses can be right.

use std::time::{Duration, Instant};

use anyhow::bail;
use minivllm::engine::llm_engine::{EngineArgs, LLMEngine, PromptInput};
use minivllm::sampling_params::{RequestOutputKind, SamplingParams};

use crate::bench::{random_prompts, Environment, Shares};
use crate::ModelArgs;

#[derive(clap::Args)]
pub struct LatencyArgs {
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
    /// Speculative decoding for the decode steps, as `serve --speculative-config`; the
    /// acceptance is printed with the results.
    #[arg(long, value_parser = minivllm::config::SpeculativeConfig::from_json)]
    speculative_config: Option<minivllm::config::SpeculativeConfig>,
    /// A real prompt instead of random tokens: the file's text as one user message in the
    /// model's chat template (its length replaces `--input-len`). For speculative decoding
    /// on an input-grounded task, e.g. "rewrite this code ..." with the code in the file.
    #[arg(long)]
    prompt_file: Option<std::path::PathBuf>,
}

impl LatencyArgs {
    pub fn model_args(&self) -> &ModelArgs {
        &self.model
    }
}

/// The prompt token ids: `--prompt-file` in the chat template, or random tokens.
fn prompts(args: &LatencyArgs, engine: &LLMEngine) -> anyhow::Result<Vec<Vec<u32>>> {
    let Some(path) = &args.prompt_file else {
        let vocab = engine.model().config().vocab_size as u64;
        return Ok(random_prompts(args.batch_size, args.input_len, vocab));
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--prompt-file {}: {e}", path.display()))?;
    let tok = engine.tokenizer();
    let message = minivllm::engine::chat_template::ChatMessage::new("user", text);
    let prompt = tok.apply_chat_template(&[message], true)?;
    let ids = tok.encode(&prompt, false)?;
    Ok(vec![ids; args.batch_size])
}

struct Timing {
    prefill: Duration,
    decode: Duration,
    /// Of each, the time in tensor parallelism's collectives (on rank 0), where measured.
    prefill_comm: Option<Duration>,
    decode_comm: Option<Duration>,
    /// Of the decode steps, the seconds outside the model's forward pass.
    decode_overhead: f64,
    /// Steps after the prefill: one per token, fewer with speculative decoding.
    decode_steps: usize,
}

pub fn run(
    args: LatencyArgs,
    driver: Option<minivllm::worker::worker_process::Driver>,
) -> anyhow::Result<()> {
    if args.batch_size == 0 || args.input_len == 0 || args.num_iters == 0 {
        bail!("--batch-size, --input-len and --num-iters must be positive");
    }
    let mut engine = LLMEngine::from_engine_args_with_driver(&latency_engine_args(&args)?, driver)?;
    let prompts = prompts(&args, &engine)?;
    let args = LatencyArgs {
        input_len: prompts[0].len(),
        ..args
    };
    let total = args.input_len + args.output_len;
    if total > engine.max_model_len() {
        bail!(
            "input + output length {total} exceeds the maximum model length {}",
            engine.max_model_len()
        );
    }
    let per_seq = total.div_ceil(args.model.block_size);
    if per_seq * args.batch_size > engine.kv_blocks().1 {
        bail!("the KV cache is too small for this batch: raise --kv-cache-memory");
    }
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
    let decode_tokens = (args.batch_size * args.output_len.saturating_sub(1)) as f64;
    let decode_steps = t.decode_steps;
    let spec = engine.stats().spec_decode;
    let model = engine.model();
    let weight_bytes = model.weight_bytes_per_step(args.batch_size);
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
        report["decode_steps"] = decode_steps.into();
        if spec.num_drafts > 0 {
            report["spec_decode_num_drafts"] = spec.num_drafts.into();
            report["spec_decode_num_draft_tokens"] = spec.num_draft_tokens.into();
            report["spec_decode_acceptance_rate"] = spec.acceptance_rate().into();
            report["spec_decode_mean_acceptance_length"] = spec.mean_acceptance_length().into();
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
    let steps = format!(
        "{decode_steps} decode steps for {} tokens a sequence",
        args.output_len.saturating_sub(1)
    );
    crate::bench::print_speculation(&engine.stats(), Some(steps));
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
        speculative_config: args.speculative_config.clone(),
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
    let speculative = engine.stats().spec_decode.num_drafts > 0;
    if steps != output_len.saturating_sub(1) && !(speculative && steps < output_len) {
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
        decode_steps: steps,
    })
}
