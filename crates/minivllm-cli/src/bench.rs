//! `minivllm bench latency` and `bench throughput`: the model's speed offline (the serving
//! benchmark is in `bench_serve`).

use std::time::{Duration, Instant};

use anyhow::bail;
use minivllm::model_executor::input_metadata::InputMetadata;
use minivllm::worker::model_runner::ModelRunner;

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
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.kind {
        BenchKind::Latency(a) => latency(a),
        BenchKind::Throughput(a) => throughput(a),
        BenchKind::Serve(a) => crate::bench_serve::run(a),
    }
}

/// Deterministic pseudo-random token ids, so runs and peers see the same prompts.
fn random_prompts(n: usize, len: usize, vocab: u64) -> Vec<Vec<u32>> {
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

fn throughput(args: ThroughputArgs) -> anyhow::Result<()> {
    use minivllm::entrypoints::llm::LLM;
    use minivllm::sampling_params::SamplingParams;
    if args.num_prompts == 0 || args.input_len == 0 || args.output_len == 0 {
        bail!("--num-prompts, --input-len and --output-len must be positive");
    }
    let mut llm = LLM::new(&args.engine.engine_args()?)?;
    let vocab = llm.engine().tokenizer().vocab_size() as u64;
    let prompts = random_prompts(args.num_prompts, args.input_len, vocab);
    let params = SamplingParams {
        temperature: 0.0,
        ignore_eos: true,
        max_tokens: Some(args.output_len),
        ..SamplingParams::default()
    };
    let start = Instant::now();
    let outs = llm.generate(prompts, &params, args.progress)?;
    let secs = start.elapsed().as_secs_f64();
    let output_tokens: usize = outs.iter().map(|o| o.num_generated_tokens()).sum();
    let total_tokens = output_tokens + args.num_prompts * args.input_len;
    let stats = llm.engine().stats();
    let report = serde_json::json!({
        "elapsed_time": secs,
        "num_requests": args.num_prompts,
        "requests_per_second": args.num_prompts as f64 / secs,
        "output_tokens_per_second": output_tokens as f64 / secs,
        "tokens_per_second": total_tokens as f64 / secs,
        "num_preemptions": stats.num_preemptions,
        "num_swapped_out": stats.num_swapped_out,
        "num_steps": stats.num_steps,
    });
    if args.json {
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
    }
    Ok(())
}

struct Timing {
    prefill: Duration,
    decode: Duration,
}

fn latency(args: LatencyArgs) -> anyhow::Result<()> {
    if args.batch_size == 0 || args.input_len == 0 || args.num_iters == 0 {
        bail!("--batch-size, --input-len and --num-iters must be positive");
    }
    let mut rt = args.model.load()?;
    let total = args.input_len + args.output_len;
    if total > rt.max_model_len {
        bail!(
            "input + output length {total} exceeds the maximum model length {}",
            rt.max_model_len
        );
    }
    let block_size = rt.runner.cache().block_size();
    let per_seq = total.div_ceil(block_size);
    if per_seq * args.batch_size > rt.runner.cache().num_blocks() {
        bail!("the KV cache is too small for this batch: raise --kv-cache-memory");
    }
    let vocab = rt.runner.model().config().vocab_size as u64;
    let prompts = random_prompts(args.batch_size, args.input_len, vocab);
    let tables: Vec<Vec<u32>> = (0..args.batch_size)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    for _ in 0..args.num_iters_warmup {
        run_once(
            &mut rt.runner,
            &prompts,
            &tables,
            args.output_len,
            block_size,
        )?;
    }
    let mut runs: Vec<Timing> = (0..args.num_iters)
        .map(|_| {
            run_once(
                &mut rt.runner,
                &prompts,
                &tables,
                args.output_len,
                block_size,
            )
        })
        .collect::<anyhow::Result<_>>()?;
    runs.sort_by_key(|t| t.prefill + t.decode);
    let t = &runs[runs.len() / 2];
    let prefill_tokens = (args.batch_size * args.input_len) as f64;
    // The first output token comes from the prefill; the rest from decode steps.
    let decode_steps = args.output_len.saturating_sub(1);
    let decode_tokens = (args.batch_size * decode_steps) as f64;
    println!(
        "batch {} x (input {} + output {}), median of {} runs",
        args.batch_size, args.input_len, args.output_len, args.num_iters
    );
    println!(
        "prefill: {:.3} s, {:.1} tokens/s",
        t.prefill.as_secs_f64(),
        prefill_tokens / t.prefill.as_secs_f64()
    );
    if decode_steps > 0 {
        println!(
            "decode:  {:.3} s, {:.1} tokens/s, {:.2} ms per step",
            t.decode.as_secs_f64(),
            decode_tokens / t.decode.as_secs_f64(),
            t.decode.as_secs_f64() * 1e3 / decode_steps as f64
        );
    }
    Ok(())
}

/// Prefills every prompt in one batch, then decodes `output_len` steps feeding back the argmax.
fn run_once(
    runner: &mut ModelRunner,
    prompts: &[Vec<u32>],
    tables: &[Vec<u32>],
    output_len: usize,
    block_size: usize,
) -> anyhow::Result<Timing> {
    let mut input = InputMetadata::default();
    for (p, table) in prompts.iter().zip(tables) {
        input.add_sequence(p, p.len(), table, block_size, true);
    }
    let start = Instant::now();
    let mut next = argmax_rows(runner.execute(&input)?, prompts.len());
    let prefill = start.elapsed();
    let start = Instant::now();
    for step in 0..output_len.saturating_sub(1) {
        input.clear();
        for (i, table) in tables.iter().enumerate() {
            let context = prompts[i].len() + step + 1;
            input.add_sequence(&[next[i]], context, table, block_size, true);
        }
        next = argmax_rows(runner.execute(&input)?, prompts.len());
    }
    Ok(Timing {
        prefill,
        decode: start.elapsed(),
    })
}

fn argmax_rows(logits: &[f32], rows: usize) -> Vec<u32> {
    logits
        .chunks_exact(logits.len() / rows)
        .map(minivllm::engine::greedy::argmax)
        .collect()
}
