//! Every supported family against Hugging Face transformers' float32 output, on tiny
//! random-weight models (`tests/data/tiny_models/<family>`, made by
//! `scripts/make_tiny_reference_models.py`; weights drawn again in `tiny_models.rs`): teacher-forced
//! log-probabilities and a prompt's logits within 1e-4, greedy ids equal, and the same logits
//! whether a prompt is computed whole, in chunks, or batched with others.

use std::sync::OnceLock;

use minivllm::config::KvCacheLayout;
use minivllm::ids::BlockId;
use minivllm::model_executor::input_metadata::StateStep;
use minivllm::model_executor::loader::weights::LoadOptions;
use minivllm::model_executor::models::llama::LlamaForCausalLM;
use minivllm::testing::group_tables;
use minivllm::worker::cache_engine::CacheEngine;
use minivllm::worker::model_runner::{LogitsRows, ModelRunner, SeqInput};
use minivllm_kernels::attention::KvCacheDtype;
use minivllm_kernels::softmax::log_softmax_inplace;
use serde_json::Value;

use super::tiny_models::{self, reference, TinyWeights};

const FAMILIES: [&str; 19] = [
    "llama",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "llama3",
    "phi3",
    "qwen3yarn",
    "qwen3moe",
    "qwen2moe",
    "mixtral",
    "olmoe",
    "gptoss",
    "qwen35",
    "qwen35moe",
    "qwen3next",
    "gemma4",
    "gemma4e",
    "gemma4moe",
];
const TOL: f32 = 1e-4;
pub(crate) const BLOCK_SIZE: usize = 16;
/// Blocks each sequence of a test may use: sequences of a batch get disjoint ranges.
const BLOCKS_PER_SEQ: u32 = 8;

pub(crate) struct Case {
    pub prompt: Vec<u32>,
    pub greedy: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub last_logits: Vec<f32>,
}

pub(crate) fn cases(family: &str) -> Vec<Case> {
    let json = reference(family);
    let ids = crate::common::ids;
    let floats = |v: &Value| -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: ids(&c["prompt"]),
            greedy: ids(&c["greedy"]),
            logprobs: floats(&c["logprobs"]),
            last_logits: floats(&c["last_logits"]),
        })
        .collect()
}

fn runner(family: &str) -> ModelRunner {
    runner_for(family, None)
}

/// The runner of `family`'s model, its positions sized to `max_model_len` where given.
fn runner_for(family: &str, max_model_len: Option<usize>) -> ModelRunner {
    static THREADS: OnceLock<()> = OnceLock::new();
    THREADS.get_or_init(|| minivllm_kernels::threading::init_threads(2));
    let config = tiny_models::config(family);
    let mut model =
        LlamaForCausalLM::load(&config, &TinyWeights::of(family), &LoadOptions::FLOAT32)
            .unwrap_or_else(|e| panic!("{family}: {e}"));
    if let Some(len) = max_model_len {
        model.set_max_model_len(len);
    }
    let groups = KvCacheLayout::for_model(&config).num_groups();
    // A state slot per sequence slot, for the models with linear attention.
    let cache = CacheEngine::with_dtype(
        &config,
        BLOCK_SIZE,
        BLOCKS_PER_SEQ as usize * 4 * groups,
        KvCacheDtype::Float32,
    )
    .with_state_slots(&config, 4);
    ModelRunner::new(model, cache)
}

fn blocks(seq: u32) -> Vec<BlockId> {
    // Out of order, so that a block table read as positions would be caught; and with the
    // groups' blocks interleaved (`group_tables`), Gemma 4's full layers (twice the sliding
    // ones' width in `gemma4e`) have their first block where a sliding layer's third
    // would start if each layer kept its blocks at its own width.
    [1, 3, 2, 0, 5, 4, 7, 6]
        .into_iter()
        .map(|b| BlockId(seq * BLOCKS_PER_SEQ + b))
        .collect()
}

/// One sequence of a step: its tokens, how many are cached, how many are new, its slot in
/// the KV cache, and whether its prompt positions are scored.
pub(crate) type StepSeq<'a> = (&'a [u32], usize, usize, u32, bool);

/// A sequence's logits rows in a step, and the row it samples from (empty if none).
pub(crate) type SeqRows = (LogitsRows, Vec<f32>);

/// One step over `seqs`: each one's rows and sampled row, all the step's logits, and the
/// vocabulary size.
fn step_all(runner: &mut ModelRunner, seqs: &[StepSeq<'_>]) -> (Vec<SeqRows>, Vec<f32>, usize) {
    let groups = runner.cache().layout().num_groups();
    let states = runner.cache().num_state_slots() > 0;
    let tables: Vec<Vec<Vec<BlockId>>> = seqs
        .iter()
        .map(|s| group_tables(&blocks(s.3), groups))
        .collect();
    let inputs =
        seqs.iter()
            .zip(&tables)
            .map(
                |(&(tokens, computed, new, slot, score_prompt), table)| SeqInput {
                    token_ids: tokens,
                    prompt_len: tokens.len(),
                    num_computed: computed,
                    num_new: new,
                    block_tables: table,
                    prompt_logprobs_from: score_prompt.then_some(0),
                    state: states.then_some(StateStep::in_slot(slot)),
                },
            );
    let mut rows = Vec::new();
    runner.prepare_input(inputs, &mut rows);
    let logits = runner.execute_model().unwrap().to_vec();
    let vocab = runner_vocab(&logits, &rows);
    let rows = rows
        .into_iter()
        .map(|r| {
            let row = r
                .sample
                .map_or(Vec::new(), |i| logits[i * vocab..(i + 1) * vocab].to_vec());
            (r, row)
        })
        .collect();
    (rows, logits, vocab)
}

/// One step: each sequence's rows and sampled row.
pub(crate) fn step(runner: &mut ModelRunner, seqs: &[StepSeq<'_>]) -> Vec<SeqRows> {
    step_all(runner, seqs).0
}

/// The vocabulary size, from the logits and how many rows they hold.
fn runner_vocab(logits: &[f32], rows: &[LogitsRows]) -> usize {
    let n: usize = rows
        .iter()
        .map(|r| r.prompt.as_ref().map_or(0, |p| p.1.len()) + usize::from(r.sample.is_some()))
        .sum();
    logits.len() / n.max(1)
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap() as u32
}

pub(crate) fn assert_close(ours: &[f32], theirs: &[f32], what: &str) -> f32 {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    let mut worst = 0.0f32;
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let d = (a - b).abs();
        assert!(d <= TOL, "{what}: entry {i}: {a} vs {b}");
        worst = worst.max(d);
    }
    worst
}

#[test]
fn every_family_matches_transformers() {
    for family in FAMILIES {
        let mut runner = runner(family);
        let mut worst = 0.0f32;
        for (n, case) in cases(family).iter().enumerate() {
            let what = format!("{family} prompt {n}");
            // The prompt's last logits, and greedy decoding one token a step from the cache.
            let mut tokens = case.prompt.clone();
            let out = step(&mut runner, &[(&tokens, 0, tokens.len(), 0, false)]);
            worst = worst.max(assert_close(&out[0].1, &case.last_logits, &what));
            let mut next = argmax(&out[0].1);
            for _ in 1..case.greedy.len() {
                tokens.push(next);
                let out = step(&mut runner, &[(&tokens, tokens.len() - 1, 1, 0, false)]);
                next = argmax(&out[0].1);
            }
            tokens.push(next);
            assert_eq!(
                &tokens[case.prompt.len()..],
                &case.greedy[..],
                "{what}: greedy ids"
            );

            // Teacher-forced: every position's log-probability of the token after it.
            let (out, logits, vocab) =
                step_all(&mut runner, &[(&tokens, 0, tokens.len(), 0, true)]);
            let (first, positions) = out[0].0.prompt.clone().unwrap();
            assert_eq!(positions, 0..tokens.len() - 1);
            let lps: Vec<f32> = (0..positions.len())
                .map(|p| {
                    let mut row = logits[(first + p) * vocab..(first + p + 1) * vocab].to_vec();
                    log_softmax_inplace(&mut row);
                    row[tokens[p + 1] as usize]
                })
                .collect();
            worst = worst.max(assert_close(&lps, &case.logprobs, &what));
        }
        eprintln!("{family}: worst difference from transformers {worst:.2e}");
    }
}

/// A prompt's logits are the same computed whole, in chunks of 7 (which cut across blocks
/// and, for Gemma, across its 16-position window), and batched with other prompts (within
/// 1e-4, as `batch_invariance.rs` holds the f32 path: products of other row counts may sum in
/// another order).
#[test]
fn every_family_is_batch_invariant() {
    for family in FAMILIES {
        let mut runner = runner(family);
        let cases = cases(family);
        let alone: Vec<Vec<f32>> = cases
            .iter()
            .map(|c| {
                step(&mut runner, &[(&c.prompt, 0, c.prompt.len(), 0, false)])[0]
                    .1
                    .clone()
            })
            .collect();
        for (c, want) in cases.iter().zip(&alone) {
            let len = c.prompt.len();
            let mut done = 0;
            let mut last = Vec::new();
            while done < len {
                let new = 7.min(len - done);
                last = step(&mut runner, &[(&c.prompt, done, new, 1, false)])[0]
                    .1
                    .clone();
                done += new;
            }
            assert_close(
                &last,
                want,
                &format!("{family}: chunked prefill against whole"),
            );
        }
        let batch: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| (&c.prompt[..], 0, c.prompt.len(), i as u32, false))
            .collect();
        let together = step(&mut runner, &batch);
        for (i, ((_, got), want)) in together.iter().zip(&alone).enumerate() {
            assert_close(
                got,
                want,
                &format!("{family}: prompt {i} batched against alone"),
            );
        }
    }
}

/// Phi-3's LongRoPE runs the short factors when the engine's context (`max_model_len`) is
/// within the original one, as transformers does for a sequence within it: a 4-token
/// prompt's logits with the model sized to 4 positions. (The cases above run the long
/// factors: the model's 512 positions exceed its original 4, and so do their prompts.)
#[test]
fn phi3_runs_the_short_factors_within_the_original_context() {
    let json = reference("phi3");
    let case = &json["short_case"];
    let prompt = crate::common::ids(&case["prompt"]);
    let want: Vec<f32> = case["last_logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    let mut short = runner_for("phi3", Some(prompt.len()));
    let out = step(&mut short, &[(&prompt, 0, prompt.len(), 0, false)]);
    let worst = assert_close(&out[0].1, &want, "phi3 short factors");
    eprintln!("phi3 short factors: worst difference from transformers {worst:.2e}");
    // The long factors give other logits: the choice is tested, not moot.
    let mut long = runner("phi3");
    let out = step(&mut long, &[(&prompt, 0, prompt.len(), 0, false)]);
    let moved = out[0]
        .1
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(
        moved > 1e-2,
        "long factors moved the logits by {moved} only"
    );
}
