//! One forward over many sequences (mixed prefill and decode, any block placement) must give
//! each sequence the logits it gets alone, with f32 weights and with the file's quantised
//! ones (whose products take another path from 32 rows on).

use crate::common;

use minivllm::ids::BlockId;
use minivllm::model_executor::loader::weights::LoadOptions;
use minivllm::model_executor::model_loader::load_model;
use minivllm::worker::cache_engine::CacheEngine;
use minivllm::worker::model_runner::{ModelRunner, SeqInput};

const BLOCK_SIZE: usize = 16;
const TOL: f32 = 1e-4;

/// Deterministic pseudo-random token ids (no RNG crate needed for fixed test data).
fn tokens(seed: u64, n: usize, vocab: u32) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

struct Seq {
    tokens: Vec<u32>,
    /// Tokens already in the cache before the batched step (0 = a prefill).
    cached: usize,
}

fn runner(num_blocks: usize, opts: &LoadOptions) -> ModelRunner {
    minivllm::kernels::threading::init_threads(2);
    let m = load_model(common::test_model_path().to_str().unwrap(), opts).unwrap();
    ModelRunner::new(m.model, CacheEngine::new(&m.config, BLOCK_SIZE, num_blocks))
}

/// `tokens[from..]` to compute over a cache holding `tokens[..from]`, through the engine's
/// own batch preparation; each asks for its last token's logits.
fn input<'a>(tokens: &'a [u32], from: usize, table: &'a Vec<BlockId>) -> SeqInput<'a> {
    SeqInput {
        token_ids: tokens,
        prompt_len: tokens.len(),
        num_computed: from,
        num_new: tokens.len() - from,
        block_tables: std::slice::from_ref(table),
        prompt_logprobs_from: None,
        state: None,
    }
}

/// Logits of each sequence's last token, computed alone: its cached part first (as an
/// earlier step would have), then its new tokens.
fn alone(runner: &mut ModelRunner, seq: &Seq) -> Vec<f32> {
    let table: Vec<BlockId> = (0..seq.tokens.len().div_ceil(BLOCK_SIZE) as u32)
        .map(BlockId)
        .collect();
    let mut rows = Vec::new();
    if seq.cached > 0 {
        runner.prepare_input([input(&seq.tokens[..seq.cached], 0, &table)], &mut rows);
        runner.execute_model().unwrap();
    }
    runner.prepare_input([input(&seq.tokens, seq.cached, &table)], &mut rows);
    runner.execute_model().unwrap().to_vec()
}

/// All sequences' cached parts filled first, then every new part in one forward, with each
/// sequence's blocks taken from `block_order` (scattered and out of order when shuffled).
fn batched(runner: &mut ModelRunner, seqs: &[Seq], block_order: &[u32]) -> Vec<Vec<f32>> {
    let mut next_block = block_order.iter().copied().map(BlockId);
    let tables: Vec<Vec<BlockId>> = seqs
        .iter()
        .map(|s| {
            next_block
                .by_ref()
                .take(s.tokens.len().div_ceil(BLOCK_SIZE))
                .collect()
        })
        .collect();
    let mut rows = Vec::new();
    let cached = seqs.iter().zip(&tables).filter(|(s, _)| s.cached > 0);
    runner.prepare_input(
        cached.map(|(s, t)| input(&s.tokens[..s.cached], 0, t)),
        &mut rows,
    );
    if !rows.is_empty() {
        runner.execute_model().unwrap();
    }
    let new = seqs.iter().zip(&tables);
    runner.prepare_input(new.map(|(s, t)| input(&s.tokens, s.cached, t)), &mut rows);
    let logits = runner.execute_model().unwrap();
    logits
        .chunks_exact(logits.len() / seqs.len())
        .map(<[f32]>::to_vec)
        .collect()
}

fn eight_sequences(vocab: u32) -> Vec<Seq> {
    // (total length, cached before the step): prefills of odd lengths, decodes (one new
    // token) and chunked prefills (several new tokens after a cached prefix).
    let shapes = [
        (1, 0),
        (7, 0),
        (33, 32),
        (16, 15),
        (70, 0),
        (45, 40),
        (17, 16),
        (100, 64),
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(i, &(n, cached))| Seq {
            tokens: tokens(i as u64 + 1, n, vocab),
            cached,
        })
        .collect()
}

fn assert_close(a: &[f32], b: &[f32], what: &str) {
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < TOL, "{what}: max |difference| {worst:e}");
}

#[test]
fn batched_mixed_prefill_and_decode_matches_each_alone_f32() {
    batched_matches_alone(&LoadOptions::FLOAT32);
}

#[test]
fn batched_mixed_prefill_and_decode_matches_each_alone_quantised() {
    batched_matches_alone(&LoadOptions::default());
}

fn batched_matches_alone(opts: &LoadOptions) {
    let mut r = runner(64, opts);
    let vocab = r.model().config().vocab_size as u32;
    let seqs = eight_sequences(vocab);
    let solo: Vec<Vec<f32>> = seqs.iter().map(|s| alone(&mut r, s)).collect();

    let in_order: Vec<u32> = (0..64).collect();
    for (i, (b, s)) in batched(&mut r, &seqs, &in_order)
        .iter()
        .zip(&solo)
        .enumerate()
    {
        assert_close(b, s, &format!("sequence {i}, contiguous blocks"));
    }
    // Scattered, descending and interleaved block ids.
    let scattered: Vec<u32> = (0..64).map(|i| (i * 37 + 11) % 64).rev().collect();
    for (i, (b, s)) in batched(&mut r, &seqs, &scattered)
        .iter()
        .zip(&solo)
        .enumerate()
    {
        assert_close(b, s, &format!("sequence {i}, scattered blocks"));
    }
}
