//! `minivllm bench serve`: load an OpenAI-compatible server (ours, vLLM, llama-server) with
//! streamed requests and report TTFT, TPOT, ITL and throughput, like `vllm bench serve`.

mod client;
mod metrics;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use minivllm::engine::tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::{mpsc, Semaphore};

use client::{BenchRequest, Client, Outcome};

#[derive(clap::Args)]
pub struct ServeBenchArgs {
    /// The server, without the endpoint path.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// `/v1/completions`, or `/v1/chat/completions` (the prompt goes as one user message).
    #[arg(long, default_value = "/v1/completions")]
    endpoint: String,
    /// The model name sent in requests (default: the first one `/v1/models` lists).
    #[arg(long)]
    model: Option<String>,
    /// Tokenizer (GGUF file or Hugging Face folder) that sizes prompts and counts tokens.
    #[arg(long, default_value = crate::DEFAULT_MODEL)]
    tokenizer: String,
    #[arg(long, value_enum, default_value = "random")]
    dataset_name: DatasetName,
    /// JSON lines of `{"prompt": "...", "output_len": N}` (`output_len` optional).
    #[arg(long)]
    dataset_path: Option<PathBuf>,
    #[arg(long, default_value_t = 100)]
    num_prompts: usize,
    #[arg(long, default_value_t = 128)]
    random_input_len: usize,
    /// Tokens generated per request (EOS ignored), unless a jsonl line gives its own.
    #[arg(long, default_value_t = 128)]
    random_output_len: usize,
    /// Random lengths are uniform in [len * (1 - r), len * (1 + r)].
    #[arg(long, default_value_t = 0.0)]
    random_range_ratio: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Requests per second, as Poisson arrivals (default inf: all at once).
    #[arg(long, default_value_t = f64::INFINITY)]
    request_rate: f64,
    /// Most requests in flight at once.
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// Also write the JSON result to this file.
    #[arg(long)]
    result_file: Option<PathBuf>,
    /// Hold every reply to a JSON schema (vLLM's `structured_outputs`): `json`, one schema
    /// for all requests (compiled once, then cached by nothing but the server's speed), or
    /// `fresh-json`, a new schema per request, so each request's time to first token
    /// includes compiling its schema. Replies end when their JSON does, `ignore_eos` or not.
    #[arg(long, value_enum)]
    structured_output: Option<BenchSchema>,
    /// A mixed workload: one prompt of this many random tokens (one output token) is sent
    /// alone first, then again just before the others, which therefore arrive during its
    /// prefill. The report adds its time alone and under the load; the others' TTFT shows
    /// what a long prompt costs everyone else.
    #[arg(long)]
    long_prompt_len: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BenchSchema {
    Json,
    FreshJson,
}

/// The schema of request `i`: an object of a few typed fields, whose names are new per
/// request with `fresh-json`.
fn bench_schema(kind: BenchSchema, i: usize, seed: u64) -> serde_json::Value {
    let tag = match kind {
        BenchSchema::Json => String::new(),
        BenchSchema::FreshJson => format!("_{seed}_{i}"),
    };
    serde_json::json!({
        "type": "object",
        "properties": {
            format!("name{tag}"): {"type": "string", "maxLength": 24},
            format!("count{tag}"): {"type": "integer", "minimum": 0, "maximum": 1000},
            format!("tags{tag}"): {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": [format!("name{tag}"), format!("count{tag}")],
        "additionalProperties": false,
    })
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DatasetName {
    Random,
    Jsonl,
}

pub fn run(args: ServeBenchArgs) -> anyhow::Result<()> {
    check(&args)?;
    crate::check_default_model(&args.tokenizer)?;
    let tok = minivllm::engine::tokenizer::load_tokenizer(&args.tokenizer)
        .with_context(|| format!("cannot load the tokenizer {}", args.tokenizer))?;
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut requests = match args.dataset_name {
        DatasetName::Random => random_requests(&tok, &args, &mut rng)?,
        DatasetName::Jsonl => jsonl_requests(&tok, &args)?,
    };
    if let Some(kind) = args.structured_output {
        for (i, r) in requests.iter_mut().enumerate() {
            r.schema = Some(bench_schema(kind, i, args.seed));
        }
    }
    let offsets = arrival_offsets(requests.len(), args.request_rate, &mut rng);
    // Random tokens of the mean prompt length, two different prompts: none shares prefix
    // blocks with a request or the other, so the prefix cache cannot flatter the rate.
    let mean_len = requests.iter().map(|r| r.prompt_len).sum::<usize>() / requests.len();
    let vocab = ordinary_vocab(&tok);
    let probes = (0..2)
        .map(|_| {
            let (prompt, prompt_len) = exact_prompt(&tok, &vocab, mean_len.max(1), &mut rng)?;
            Ok(BenchRequest {
                prompt,
                prompt_len,
                output_len: 1,
                schema: None,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Two of them: alone, then under the load (the prefix cache holds the first).
    let long_prompts = match args.long_prompt_len {
        Some(len) => {
            let mut one = || {
                let (prompt, prompt_len) = exact_prompt(&tok, &vocab, len, &mut rng)?;
                anyhow::Ok(BenchRequest {
                    prompt,
                    prompt_len,
                    output_len: 1,
                    schema: None,
                })
            };
            Some([one()?, one()?])
        }
        None => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let base = args.base_url.trim_end_matches('/').to_string();
    let lens: Vec<usize> = requests.iter().map(|r| r.prompt_len).collect();
    let (model, outcomes, duration, prefill_rate, long_prompt) = rt.block_on(async {
        let http = client::http_client()?;
        let model = client::resolve_model(&http, &base, args.model.clone()).await?;
        let client = Client::new(http, &base, &args.endpoint, model.clone());
        let prefill_rate = probe_prefill_rate(&client, &probes).await;
        let long = match &long_prompts {
            Some([alone, loaded]) => {
                let alone_s = client
                    .send(alone)
                    .await
                    .map_err(anyhow::Error::msg)?
                    .latency;
                let (c, loaded) = (client.clone(), loaded.clone());
                let during = tokio::spawn(async move { c.send(&loaded).await });
                // Admitted before the others arrive.
                tokio::time::sleep(Duration::from_millis(100)).await;
                Some((alone.prompt_len, alone_s, during))
            }
            None => None,
        };
        let start = Instant::now();
        let outcomes = dispatch(client, requests, offsets, args.max_concurrency).await;
        let duration = start.elapsed().as_secs_f64();
        let long = match long {
            Some((tokens, alone_s, during)) => {
                let loaded = during.await?.map_err(anyhow::Error::msg)?;
                Some(metrics::LongPrompt {
                    tokens,
                    alone_s,
                    loaded_s: loaded.latency,
                })
            }
            None => None,
        };
        anyhow::Ok((model, outcomes, duration, prefill_rate, long))
    })?;
    let settings = metrics::Settings {
        model_id: model,
        tokenizer_id: args.tokenizer.clone(),
        num_prompts: args.num_prompts,
        request_rate: args.request_rate,
        max_concurrency: args.max_concurrency,
    };
    let count = |text: &str| tok.encode(text, false).map_or(0, |ids| ids.len());
    let mut report = metrics::Report::new(settings, &outcomes, duration, count);
    report.long_prompt = long_prompt;
    if args.request_rate.is_infinite() {
        let burst = args.max_concurrency.unwrap_or(lens.len()).min(lens.len());
        report.prefill_bound = prefill_rate.map(|rate| metrics::PrefillBound {
            rate,
            median_ttft_ms: prefill_bound_median_ttft(&lens[..burst], rate) * 1e3,
        });
    }
    print_report(&args, &report, &outcomes)
}

fn check(args: &ServeBenchArgs) -> anyhow::Result<()> {
    ensure!(args.num_prompts > 0, "--num-prompts must be positive");
    ensure!(
        args.random_input_len > 0 && args.random_output_len > 0,
        "--random-input-len and --random-output-len must be positive"
    );
    ensure!(
        (0.0..1.0).contains(&args.random_range_ratio),
        "--random-range-ratio must be in [0, 1)"
    );
    ensure!(args.request_rate > 0.0, "--request-rate must be positive");
    ensure!(
        args.max_concurrency != Some(0),
        "--max-concurrency must be positive"
    );
    Ok(())
}

fn print_report(
    args: &ServeBenchArgs,
    report: &metrics::Report,
    outcomes: &[Outcome],
) -> anyhow::Result<()> {
    if let Some(err) = outcomes.iter().find_map(|o| o.as_ref().err()) {
        eprintln!("first failed request: {err}");
    }
    let json = report.to_json();
    if args.json {
        println!("{json}");
    } else {
        println!("{}", report.table());
    }
    if let Some(path) = &args.result_file {
        std::fs::write(path, format!("{json:#}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if report.completed == 0 {
        bail!("all {} requests failed", report.failed);
    }
    Ok(())
}

/// Sends each request at its offset from the start, at most `max_concurrency` at once, and
/// returns every outcome (in completion order).
async fn dispatch(
    client: Client,
    requests: Vec<BenchRequest>,
    offsets: Vec<f64>,
    max_concurrency: Option<usize>,
) -> Vec<Outcome> {
    let n = requests.len();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let limit = max_concurrency.map(|c| Arc::new(Semaphore::new(c)));
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        for (req, offset) in requests.into_iter().zip(offsets) {
            tokio::time::sleep_until(start + Duration::from_secs_f64(offset)).await;
            let (client, tx, limit) = (client.clone(), tx.clone(), limit.clone());
            tokio::spawn(async move {
                // Waiting for a slot is not the server's time: the clock starts in `send`.
                let _permit = match limit {
                    Some(s) => s.acquire_owned().await.ok(),
                    None => None,
                };
                let _ = tx.send(client.send(&req).await);
            });
        }
    });
    let progress = std::io::stderr().is_terminal();
    let mut outcomes = Vec::with_capacity(n);
    while let Some(o) = rx.recv().await {
        outcomes.push(o);
        if progress {
            eprint!("\r{}/{n} requests done", outcomes.len());
        }
    }
    if progress {
        eprintln!();
    }
    outcomes
}

/// The server's prefill rate in tokens per second, from requests of one output token
/// sent alone one after another, taking the fastest (the first may pay for warm-up).
/// `None` if one fails: the benchmark then reports no prefill bound.
async fn probe_prefill_rate(client: &Client, probes: &[BenchRequest]) -> Option<f64> {
    let mut best: Option<f64> = None;
    for probe in probes {
        let done = client.send(probe).await.ok()?;
        let rate = probe.prompt_len as f64 / done.latency.max(1e-9);
        best = Some(best.map_or(rate, |b| b.max(rate)));
    }
    best
}

/// The median TTFT of a burst of prompts of `lens` tokens arriving together, if the server
/// prefilled them one after another at `rate` tokens per second and sent each first token
/// as soon as its prompt was done: the bound that ordering prefill work can approach.
fn prefill_bound_median_ttft(lens: &[usize], rate: f64) -> f64 {
    let mut done = 0usize;
    let ttfts: Vec<f64> = lens
        .iter()
        .map(|&len| {
            done += len;
            done as f64 / rate
        })
        .collect();
    metrics::stats(&ttfts).median
}

/// Send times in seconds from the start: Poisson arrivals (exponential gaps of mean
/// 1/rate), or all at 0 for an infinite rate.
fn arrival_offsets(n: usize, rate: f64, rng: &mut impl Rng) -> Vec<f64> {
    if rate.is_infinite() {
        return vec![0.0; n];
    }
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            let now = t;
            // 1 - u is in (0, 1], so the log is finite.
            t += -(1.0 - rng.random::<f64>()).ln() / rate;
            now
        })
        .collect()
}

/// A length uniform in [len * (1 - ratio), len * (1 + ratio)], at least 1.
fn sample_len(len: usize, ratio: f64, rng: &mut impl Rng) -> usize {
    let lo = (len as f64 * (1.0 - ratio)).floor() as usize;
    let hi = (len as f64 * (1.0 + ratio)).floor() as usize;
    rng.random_range(lo.max(1)..=hi.max(1))
}

fn random_requests(
    tok: &Tokenizer,
    args: &ServeBenchArgs,
    rng: &mut impl Rng,
) -> anyhow::Result<Vec<BenchRequest>> {
    let vocab = ordinary_vocab(tok);
    ensure!(!vocab.is_empty(), "the tokenizer has no ordinary tokens");
    (0..args.num_prompts)
        .map(|_| {
            let input_len = sample_len(args.random_input_len, args.random_range_ratio, rng);
            let output_len = sample_len(args.random_output_len, args.random_range_ratio, rng);
            let (prompt, prompt_len) = exact_prompt(tok, &vocab, input_len, rng)?;
            Ok(BenchRequest {
                prompt,
                prompt_len,
                output_len,
                schema: None,
            })
        })
        .collect()
}

/// Token ids a random prompt may use: special and added tokens would make servers stop,
/// split or reject the text.
fn ordinary_vocab(tok: &Tokenizer) -> Vec<u32> {
    let added = tok.inner().get_added_tokens_decoder();
    (0..tok.vocab_size() as u32)
        .filter(|id| !added.contains_key(id))
        .collect()
}

/// Text that encodes to `len` tokens. Decoded random ids re-encode differently (merges,
/// split bytes), so like vLLM re-encode, cut or pad, and retry; after a few tries take the
/// closest (the server's usage then reports the real count).
fn exact_prompt(
    tok: &Tokenizer,
    vocab: &[u32],
    len: usize,
    rng: &mut impl Rng,
) -> anyhow::Result<(String, usize)> {
    const TRIES: usize = 10;
    let mut ids: Vec<u32> = Vec::with_capacity(len);
    let mut best: Option<(String, usize)> = None;
    for _ in 0..TRIES {
        ids.truncate(len);
        while ids.len() < len {
            ids.push(vocab[rng.random_range(0..vocab.len())]);
        }
        let text = tok.decode(&ids, false)?;
        ids = tok.encode(&text, false)?;
        if ids.len() == len {
            return Ok((text, len));
        }
        if best
            .as_ref()
            .is_none_or(|(_, n)| n.abs_diff(len) > ids.len().abs_diff(len))
        {
            best = Some((text, ids.len()));
        }
    }
    best.context("no prompt tried")
}

#[derive(serde::Deserialize)]
struct JsonlLine {
    prompt: String,
    output_len: Option<usize>,
}

/// The file's prompts in order, repeated if it has fewer than `--num-prompts`.
fn jsonl_requests(tok: &Tokenizer, args: &ServeBenchArgs) -> anyhow::Result<Vec<BenchRequest>> {
    let path = args
        .dataset_path
        .as_ref()
        .context("--dataset-name jsonl needs --dataset-path")?;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut lines = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let l: JsonlLine = serde_json::from_str(line).with_context(|| {
            format!("{}:{}: expected {{\"prompt\": ...}}", path.display(), i + 1)
        })?;
        lines.push(BenchRequest {
            prompt_len: tok.encode(&l.prompt, false)?.len(),
            output_len: l.output_len.unwrap_or(args.random_output_len),
            prompt: l.prompt,
            schema: None,
        });
    }
    ensure!(!lines.is_empty(), "{} has no prompts", path.display());
    Ok(lines
        .iter()
        .cycle()
        .take(args.num_prompts)
        .cloned()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_bound_is_the_median_of_prompts_done_one_after_another() {
        // 16 prompts of 100 tokens at 459 tok/s: done at k * 100 / 459 s, median 8.5 of them.
        let bound = prefill_bound_median_ttft(&[100; 16], 459.0);
        assert!((bound - 8.5 * 100.0 / 459.0).abs() < 1e-12, "{bound}");
        assert_eq!(prefill_bound_median_ttft(&[30, 10, 20], 10.0), 4.0);
    }

    #[test]
    fn infinite_rate_sends_everything_at_once() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert_eq!(arrival_offsets(5, f64::INFINITY, &mut rng), vec![0.0; 5]);
    }

    #[test]
    fn poisson_gaps_average_one_over_rate_and_repeat_with_the_seed() {
        let offsets = |seed| arrival_offsets(20_000, 4.0, &mut ChaCha8Rng::seed_from_u64(seed));
        let a = offsets(7);
        assert_eq!(a[0], 0.0);
        assert!(a.windows(2).all(|w| w[1] >= w[0]));
        let mean_gap = a[a.len() - 1] / (a.len() - 1) as f64;
        assert!((mean_gap - 0.25).abs() < 0.01, "{mean_gap}");
        assert_eq!(a, offsets(7));
        assert_ne!(a, offsets(8));
    }

    #[test]
    fn sampled_lengths_stay_in_range() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert!((0..100).all(|_| sample_len(128, 0.0, &mut rng) == 128));
        let lens: Vec<_> = (0..1000).map(|_| sample_len(100, 0.5, &mut rng)).collect();
        assert!(lens.iter().all(|l| (50..=150).contains(l)));
        assert!(lens.contains(&50) && lens.contains(&150));
        assert_eq!(sample_len(1, 0.9, &mut rng), 1);
    }
}
