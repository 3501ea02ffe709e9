//! `minivllm perplexity`: the quality of a model (or of one weight format against another) as
//! llama.cpp's `llama-perplexity` measures it.
//!
//! The text is tokenised once (with the model's BOS) and cut into chunks of `--ctx-size`
//! tokens, each starting with BOS as llama.cpp does. Each chunk is one forward pass; its
//! second half is scored (every position there predicts the next token with at least half a
//! window of context), and the perplexity is `exp` of the mean negative log-likelihood.
//!
//! `--kl-divergence-base FILE` alone writes the scored positions' full log-probability rows
//! to FILE; with `--kl-divergence` it reads them back (another run, often another format of
//! the same model) and reports the KL divergence of this run's distributions from the
//! base's, and how often both put the same token first: llama.cpp's `--kl-divergence`
//! statistics. Rows are stored as llama.cpp stores them: 16-bit levels between the row's
//! minimum and maximum log-probability.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::PathBuf;

use anyhow::{bail, ensure, Context};
use minivllm::config::KvCacheLayout;
use minivllm::engine::tokenizer::Tokenizer;
use minivllm::ids::BlockId;
use minivllm::kernels::softmax::log_softmax_inplace;
use minivllm::model_executor::input_metadata::StateStep;
use minivllm::model_executor::model_loader::load_model;
use minivllm::worker::cache_engine::CacheEngine;
use minivllm::worker::model_runner::{ModelRunner, SeqInput};

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: crate::ModelArgs,
    /// The text to score.
    #[arg(long, short = 'f')]
    file: PathBuf,
    /// Tokens per chunk (llama.cpp's `--ctx-size`).
    #[arg(long, short = 'c', default_value_t = 512)]
    ctx_size: usize,
    /// Score at most this many chunks (default: as many as the text fills).
    #[arg(long)]
    chunks: Option<usize>,
    /// Log-probabilities of a base run: written here, or read with `--kl-divergence`.
    #[arg(long)]
    kl_divergence_base: Option<PathBuf>,
    /// Compare with the base run in `--kl-divergence-base`.
    #[arg(long, requires = "kl_divergence_base")]
    kl_divergence: bool,
}

const MAGIC: &[u8; 8] = b"MVLOGPRB";
const BLOCK_SIZE: usize = 16;

/// What the run scored, accumulated chunk by chunk.
#[derive(Default)]
struct Scores {
    nll: Vec<f64>,
    /// With a base: each position's KL divergence, the base's NLL, and top-1 agreement.
    kld: Vec<f64>,
    base_nll: Vec<f64>,
    same_top: usize,
}

pub fn run(args: PerplexityArgs) -> anyhow::Result<()> {
    let m = &args.model;
    crate::check_default_model(&m.model)?;
    ensure!(
        m.tensor_parallel_size == 1,
        "perplexity runs in one process (--tensor-parallel-size 1)"
    );
    ensure!(args.ctx_size >= 2, "--ctx-size must be at least 2");
    let threads = m
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    minivllm::kernels::threading::init_threads(threads);
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let loaded = load_model(&m.model, &m.load_options()).context("loading the model")?;
    let tokenizer = Tokenizer::for_model(&loaded).context("loading the tokenizer")?;
    let mut tokens = tokenizer.encode(&text, true)?;
    let bos = tokenizer.bos_token_id().filter(|_| tokenizer.add_bos());
    if bos.is_some() && tokens.first() == bos.as_ref() {
        tokens.remove(0);
    }
    let n_ctx = args.ctx_size;
    let mut n_chunks = tokens.len() / n_ctx;
    if let Some(limit) = args.chunks {
        n_chunks = n_chunks.min(limit);
    }
    ensure!(
        n_chunks > 0,
        "{} holds {} tokens: at least --ctx-size {n_ctx} are needed",
        args.file.display(),
        tokens.len()
    );
    let vocab = loaded.config.vocab_size;
    let blocks = n_ctx.div_ceil(BLOCK_SIZE);
    let kv = m.kv_cache_dtype.resolve(m.dtype);
    // One window's blocks for every KV cache group: a window is one prefill, nothing freed.
    let groups = KvCacheLayout::for_model(&loaded.config).num_groups();
    // One sequence at a time: a model with linear attention needs one state slot.
    let cache = CacheEngine::with_dtype(&loaded.config, BLOCK_SIZE, blocks * groups, kv)
        .with_state_slots(&loaded.config, 1);
    let state = (cache.num_state_slots() > 0).then_some(StateStep::in_slot(0));
    let mut runner = ModelRunner::new(loaded.model, cache);
    let first = n_ctx / 2;
    let scored = n_ctx - 1 - first;
    let tokens = &tokens[..n_chunks * n_ctx];

    let mut base = match (&args.kl_divergence_base, args.kl_divergence) {
        (Some(path), true) => Some(BaseReader::open(path, n_ctx, vocab, tokens)?),
        _ => None,
    };
    let mut writer = match (&args.kl_divergence_base, args.kl_divergence) {
        (Some(path), false) => Some(BaseWriter::create(path, n_ctx, vocab, tokens)?),
        _ => None,
    };
    eprintln!(
        "perplexity: {} tokens, {n_chunks} chunks of {n_ctx}, scoring the last {scored} \
         positions of each ({:?} weights, {kv:?} KV cache)",
        tokens.len(),
        m.dtype
    );
    let tables: Vec<Vec<BlockId>> = (0..groups)
        .map(|g| {
            (0..blocks)
                .map(|b| BlockId((g * blocks + b) as u32))
                .collect()
        })
        .collect();
    let mut scores = Scores::default();
    let (mut row, mut base_row) = (vec![0.0f32; vocab], vec![0.0f32; vocab]);
    let started = std::time::Instant::now();
    for (c, chunk) in tokens.chunks_exact(n_ctx).enumerate() {
        let mut input = chunk.to_vec();
        if let Some(bos) = bos {
            input[0] = bos;
        }
        let seq = SeqInput {
            token_ids: &input,
            prompt_len: n_ctx,
            num_computed: 0,
            num_new: n_ctx,
            block_tables: &tables,
            prompt_logprobs_from: Some(first),
            state,
        };
        let mut rows = Vec::new();
        runner.prepare_input([seq], &mut rows);
        let (row0, positions) = rows[0].prompt.clone().context("no prompt rows")?;
        let logits = runner.execute_model()?;
        for (i, p) in positions.enumerate().take(scored) {
            let r = row0 + i;
            row.copy_from_slice(&logits[r * vocab..(r + 1) * vocab]);
            log_softmax_inplace(&mut row);
            let next = input[p + 1] as usize;
            scores.nll.push(-f64::from(row[next]));
            if let Some(w) = &mut writer {
                w.write_row(&row)?;
            }
            if let Some(b) = &mut base {
                b.read_row(&mut base_row)?;
                scores.add_comparison(&row, &base_row, next);
            }
        }
        let ppl = mean(&scores.nll).exp();
        eprint!("[{}]{ppl:.4},", c + 1);
        if c + 1 == n_chunks {
            eprintln!();
        }
    }
    if let Some(w) = writer {
        w.finish()?;
    }
    report(&scores, started.elapsed().as_secs_f64(), tokens.len());
    Ok(())
}

impl Scores {
    fn add_comparison(&mut self, row: &[f32], base: &[f32], next: usize) {
        // KL(base ‖ this) = Σ p_base · (log p_base − log p_this).
        let kld: f64 = base
            .iter()
            .zip(row)
            .map(|(&b, &t)| f64::from(b).exp() * (f64::from(b) - f64::from(t)))
            .sum();
        self.kld.push(kld.max(0.0));
        self.base_nll.push(-f64::from(base[next]));
        self.same_top += usize::from(argmax(row) == argmax(base));
    }
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap_or(0)
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len().max(1) as f64
}

/// Standard error of the mean.
fn sem(x: &[f64]) -> f64 {
    let m = mean(x);
    let var = x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (x.len().max(2) - 1) as f64;
    (var / x.len().max(1) as f64).sqrt()
}

fn report(s: &Scores, seconds: f64, tokens: usize) {
    let n = s.nll.len();
    let ppl = mean(&s.nll).exp();
    // The error of exp(mean) from the mean's, to first order, as llama.cpp reports it.
    println!(
        "Final estimate: PPL = {ppl:.4} +/- {:.5} ({n} positions; {:.1} s, {:.0} tokens/s)",
        ppl * sem(&s.nll),
        seconds,
        tokens as f64 / seconds
    );
    if s.kld.is_empty() {
        return;
    }
    let base_ppl = mean(&s.base_nll).exp();
    let mut sorted = s.kld.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    println!("====== Perplexity statistics ======");
    println!("Mean PPL(Q)                   : {ppl:.6}");
    println!("Mean PPL(base)                : {base_ppl:.6}");
    println!(
        "Mean ln(PPL(Q)/PPL(base))     : {:.6}",
        ppl.ln() - base_ppl.ln()
    );
    println!("====== KL divergence statistics ======");
    println!("Mean    KLD: {:.6} ± {:.6}", mean(&s.kld), sem(&s.kld));
    println!("Maximum KLD: {:.6}", sorted[sorted.len() - 1]);
    println!("99.9%   KLD: {:.6}", pct(0.999));
    println!("99.0%   KLD: {:.6}", pct(0.99));
    println!("Median  KLD: {:.6}", pct(0.5));
    println!("Minimum KLD: {:.6}", sorted[0]);
    println!(
        "Same top p: {:.3} ± {:.3} %",
        100.0 * s.same_top as f64 / n as f64,
        {
            let p = s.same_top as f64 / n as f64;
            100.0 * (p * (1.0 - p) / n as f64).sqrt()
        }
    );
}

/// Writes the header (context, vocabulary, the scored tokens) and then one row per position.
struct BaseWriter {
    out: BufWriter<File>,
    levels: Vec<u8>,
}

impl BaseWriter {
    fn create(path: &PathBuf, n_ctx: usize, vocab: usize, tokens: &[u32]) -> anyhow::Result<Self> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::new(file);
        out.write_all(MAGIC)?;
        for v in [n_ctx, vocab, tokens.len()] {
            out.write_all(&(v as u64).to_le_bytes())?;
        }
        for t in tokens {
            out.write_all(&t.to_le_bytes())?;
        }
        Ok(Self {
            out,
            levels: Vec::with_capacity(vocab * 2),
        })
    }

    /// The row's minimum and level width, then each entry as a 16-bit level above it.
    fn write_row(&mut self, row: &[f32]) -> anyhow::Result<()> {
        let min = row.iter().copied().fold(f32::INFINITY, f32::min).max(-1e4);
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let step = ((max - min) / 65535.0).max(f32::MIN_POSITIVE);
        self.out.write_all(&min.to_le_bytes())?;
        self.out.write_all(&step.to_le_bytes())?;
        self.levels.clear();
        for &x in row {
            let q = ((x.max(min) - min) / step).round().min(65535.0) as u16;
            self.levels.extend_from_slice(&q.to_le_bytes());
        }
        self.out.write_all(&self.levels)?;
        Ok(())
    }

    fn finish(mut self) -> anyhow::Result<()> {
        Ok(self.out.flush()?)
    }
}

struct BaseReader {
    input: BufReader<File>,
    levels: Vec<u8>,
}

impl BaseReader {
    /// Opens a base file and checks it was made from the same tokens and vocabulary.
    fn open(path: &PathBuf, n_ctx: usize, vocab: usize, tokens: &[u32]) -> anyhow::Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut input = BufReader::new(file);
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic)?;
        if &magic != MAGIC {
            bail!("{} is not a minivllm log-probability file", path.display());
        }
        let mut header = [0u64; 3];
        for v in &mut header {
            let mut b = [0u8; 8];
            input.read_exact(&mut b)?;
            *v = u64::from_le_bytes(b);
        }
        let [base_ctx, base_vocab, base_tokens] = header.map(|v| v as usize);
        if (base_ctx, base_vocab) != (n_ctx, vocab) {
            bail!(
                "the base was made with --ctx-size {base_ctx} and a vocabulary of {base_vocab}; \
                 this run has {n_ctx} and {vocab}"
            );
        }
        if base_tokens < tokens.len() {
            bail!(
                "the base scored {base_tokens} tokens, fewer than this run's {} (--chunks?)",
                tokens.len()
            );
        }
        for (i, &t) in tokens.iter().enumerate() {
            let mut b = [0u8; 4];
            input.read_exact(&mut b)?;
            if u32::from_le_bytes(b) != t {
                bail!("the base tokenised the text differently (token {i}): another model?");
            }
        }
        // Skip the tokens of chunks this run does not score.
        std::io::copy(
            &mut (&mut input).take(4 * (base_tokens - tokens.len()) as u64),
            &mut std::io::sink(),
        )?;
        Ok(Self {
            input,
            levels: vec![0; vocab * 2],
        })
    }

    fn read_row(&mut self, row: &mut [f32]) -> anyhow::Result<()> {
        let mut b = [0u8; 8];
        self.input
            .read_exact(&mut b)
            .context("the base file ends early")?;
        let min = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let step = f32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        self.input.read_exact(&mut self.levels)?;
        for (x, q) in row.iter_mut().zip(self.levels.chunks_exact(2)) {
            *x = min + step * f32::from(u16::from_le_bytes([q[0], q[1]]));
        }
        // Normalised again: the levels' rounding then moves the KL divergence only at second
        // order (a run against its own base reads about 1e-8, not the 1e-5 unnormalised).
        log_softmax_inplace(row);
        Ok(())
    }
}
