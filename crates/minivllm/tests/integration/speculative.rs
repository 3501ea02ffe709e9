//! Speculative decoding beyond "the same tokens" (which `step_seams.rs` checks): rejected
//! drafts leave no trace in the KV cache or the prefix cache, sampling keeps the target
//! model's distribution, and a sequence whose guesses keep failing is given fewer.

use std::collections::HashMap;

use crate::common;
use crate::common::{greedy, test_llm_speculative};
use crate::step_seams::{Oracle, Wrong};

use minivllm::engine::llm_engine::{LLMEngine, PromptInput};
use minivllm::ids::TokenId;
use minivllm::outputs::RequestOutput;
use minivllm::sampling_params::SamplingParams;
use minivllm::worker::draft_model_proposer::COMMON_TOKENS;

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
];

fn run(engine: &mut LLMEngine) -> HashMap<String, RequestOutput> {
    let mut done = HashMap::new();
    while engine.has_unfinished_requests() {
        for o in engine.step().expect("step") {
            if o.finished {
                done.insert(o.request_id.clone(), o);
            }
        }
    }
    done
}

/// Rollback: K/V written for rejected drafts is overwritten and never registered in the
/// prefix cache. A follow-up prompt that extends each finished text (prompt and output)
/// hits the same cached tokens and gets the same tokens and logprobs, bit for bit, as after
/// plain decoding; a draft's K/V left behind would change them.
#[test]
fn rejected_drafts_leave_the_kv_and_prefix_caches_as_plain_decoding_does() {
    let follow_up = |spec: bool| {
        let mut llm = common::test_llm(256, 64 << 20);
        let engine = llm.engine_mut();
        if spec {
            engine.set_draft_proposer(Box::new(Wrong), false);
        }
        for (i, p) in PROMPTS.iter().enumerate() {
            let prompt = PromptInput::Text(p.to_string());
            engine
                .add_request(format!("r{i}"), prompt, greedy(37), 0)
                .unwrap();
        }
        let first = run(engine);
        let drafts = engine.stats().spec_decode;
        let tok = engine.tokenizer().clone();
        let hits_before = engine.stats().prefix_cache_hits;
        let params = SamplingParams {
            logprobs: Some(5),
            ..greedy(8)
        };
        for (i, p) in PROMPTS.iter().enumerate() {
            let mut ids = tok.encode(p, true).unwrap();
            ids.extend(&first[&format!("r{i}")].outputs[0].token_ids);
            engine
                .add_request(format!("f{i}"), PromptInput::from(ids), params.clone(), 0)
                .unwrap();
        }
        let second = run(engine);
        let hits = engine.stats().prefix_cache_hits - hits_before;
        let results: Vec<_> = (0..PROMPTS.len())
            .map(|i| {
                let c = &second[&format!("f{i}")].outputs[0];
                (c.token_ids.clone(), format!("{:?}", c.logprobs))
            })
            .collect();
        (hits, results, drafts)
    };
    let (plain_hits, plain, _) = follow_up(false);
    let (spec_hits, spec, drafts) = follow_up(true);
    assert!(
        drafts.num_draft_tokens > 0 && drafts.num_accepted_tokens * 4 < drafts.num_draft_tokens,
        "the wrong proposer's drafts were verified and rejected: {drafts:?}"
    );
    assert!(
        plain_hits > 0,
        "the follow-ups share the first prompts' blocks"
    );
    assert_eq!(spec_hits, plain_hits);
    assert_eq!(spec, plain);
}

/// Sampling keeps the target model's distribution: the first three tokens of many seeded
/// completions (each its own RNG stream, the plain and speculative runs on different seeds,
/// so the two samples are independent), with drafts from the greedy continuation that are
/// right often and wrong often, pass a chi-squared test of homogeneity against plain
/// sampling's. Seeded, so the test gives the same verdict every run.
#[test]
fn speculative_sampling_keeps_the_target_distribution() {
    const N: usize = 600;
    let prompt = "My favourite colour is";
    let sample = |spec: bool, seed: u64| {
        let mut llm = common::test_llm(64, 64 << 20);
        let engine = llm.engine_mut();
        if spec {
            engine
                .add_request("g", PromptInput::Text(prompt.into()), greedy(3), 0)
                .unwrap();
            let g = run(engine);
            let mut path = engine.tokenizer().encode(prompt, true).unwrap();
            path.extend(&g["g"].outputs[0].token_ids);
            let oracle = Oracle {
                runs: vec![path],
                k: 4,
            };
            engine.set_draft_proposer(Box::new(oracle), false);
        }
        // Each request its own seed, all batched together: a seeded request samples the
        // same tokens whatever shares its batches, and the draft length is fixed.
        for r in 0..N {
            let params = SamplingParams {
                temperature: 1.0,
                top_k: 3,
                seed: Some(seed + r as u64),
                max_tokens: Some(3),
                ignore_eos: true,
                ..SamplingParams::default()
            };
            let prompt = PromptInput::Text(prompt.into());
            engine
                .add_request(format!("s{r}"), prompt, params, 0)
                .unwrap();
        }
        let mut counts: HashMap<Vec<TokenId>, usize> = HashMap::new();
        for out in run(engine).into_values() {
            *counts.entry(out.outputs[0].token_ids.clone()).or_default() += 1;
        }
        assert_eq!(counts.values().sum::<usize>(), N);
        let spec_stats = engine.stats().spec_decode;
        (counts, spec_stats)
    };
    let (plain, _) = sample(false, 1);
    let (spec, stats) = sample(true, 100_000);
    assert!(
        stats.num_accepted_tokens > 50 && stats.num_draft_tokens - stats.num_accepted_tokens > 50,
        "drafts both kept and rejected: {stats:?}"
    );
    // Categories seen fewer than 10 times in all are pooled into one.
    let mut keys: Vec<_> = plain.keys().chain(spec.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    let (mut rows, mut rare) = (Vec::new(), (0.0, 0.0));
    for k in keys {
        let (a, b) = (
            plain.get(&k).copied().unwrap_or(0),
            spec.get(&k).copied().unwrap_or(0),
        );
        if a + b < 10 {
            rare = (rare.0 + a as f64, rare.1 + b as f64);
        } else {
            rows.push((a as f64, b as f64));
        }
    }
    if rare.0 + rare.1 > 0.0 {
        rows.push(rare);
    }
    // Both samples have N: each cell's expected count is the row's mean.
    let chi2: f64 = rows
        .iter()
        .map(|&(a, b)| {
            let e = (a + b) / 2.0;
            (a - e).powi(2) / e + (b - e).powi(2) / e
        })
        .sum();
    let df = rows.len() - 1;
    // The 0.999 quantile of chi-squared, by the Wilson-Hilferty approximation.
    let k = df as f64;
    let bound = k * (1.0 - 2.0 / (9.0 * k) + 3.09 * (2.0 / (9.0 * k)).sqrt()).powi(3);
    assert!(
        df >= 3 && chi2 < bound,
        "chi2 {chi2:.1} over {df} degrees of freedom (bound {bound:.1}): {rows:?}"
    );
}

/// A proposer whose guesses keep failing is given fewer: after the first rejections its
/// drafts shrink to the one-token probes that keep its record current.
#[test]
fn failing_guesses_are_cut_back() {
    let mut llm = common::test_llm(256, 64 << 20);
    let engine = llm.engine_mut();
    engine.set_draft_proposer(Box::new(Wrong), true);
    engine
        .add_request("r", PromptInput::Text(PROMPTS[1].into()), greedy(120), 0)
        .unwrap();
    run(engine);
    let s = engine.stats().spec_decode;
    // 119 decode steps with 3 guesses each would be 357 tokens, 238 past each draft's first.
    assert!(
        s.num_drafts > 0 && s.num_draft_tokens - s.num_drafts < 20,
        "{s:?}"
    );
}

/// `draft_model`: the test model drafting for itself, greedily on its own KV cache. Its
/// greedy guesses are the target's greedy tokens (the same weights and kernels, logits
/// batch-invariant), so every one is kept and steps fall by the draft length; seeded
/// sampling, with or without penalties, gives plain decoding's tokens too, with fewer
/// guesses kept.
#[test]
fn a_draft_model_gives_plain_decodings_tokens() {
    let model = common::test_model_path().to_str().unwrap().to_string();
    let spec = format!(
        r#"{{"method": "draft_model", "model": {model:?}, "num_speculative_tokens": 4, "adaptive_draft_length": false}}"#
    );
    let mut plain = test_llm_speculative(None).unwrap();
    let mut fast = test_llm_speculative(Some(&spec)).unwrap();
    let seeded = SamplingParams {
        temperature: 0.8,
        seed: Some(3),
        n: 2,
        max_tokens: Some(30),
        ..SamplingParams::default()
    };
    // Penalties and min_tokens at a draft position count the drafts kept before it.
    let penalised = SamplingParams {
        repetition_penalty: 1.3,
        frequency_penalty: 0.6,
        presence_penalty: 0.4,
        min_tokens: 20,
        seed: Some(5),
        ..seeded.clone()
    };
    for params in [greedy(40), seeded, penalised] {
        let mut results = Vec::new();
        for llm in [&mut plain, &mut fast] {
            let engine = llm.engine_mut();
            let (steps, spec) = (engine.stats().num_steps, engine.stats().spec_decode);
            for (i, p) in PROMPTS.iter().enumerate() {
                let prompt = PromptInput::Text(p.to_string());
                engine
                    .add_request(format!("r{i}"), prompt, params.clone(), 0)
                    .unwrap();
            }
            let outs = run(engine);
            let tokens: Vec<Vec<Vec<TokenId>>> = (0..PROMPTS.len())
                .map(|i| {
                    outs[&format!("r{i}")]
                        .outputs
                        .iter()
                        .map(|c| c.token_ids.clone())
                        .collect()
                })
                .collect();
            let s = engine.stats().spec_decode;
            let drafted = s.num_draft_tokens - spec.num_draft_tokens;
            let accepted = s.num_accepted_tokens - spec.num_accepted_tokens;
            results.push((tokens, engine.stats().num_steps - steps, drafted, accepted));
        }
        let (plain_run, spec_run) = (&results[0], &results[1]);
        assert_eq!(spec_run.0, plain_run.0, "{params:?}");
        assert!(spec_run.2 > 0, "drafts were made: {spec_run:?}");
        if params.temperature == 0.0 {
            // Its greedy guesses of itself are all kept but where the token is one the
            // draft's partial head lacks (rare, not in the sequence before), each such miss
            // costing at most the rest of that draft.
            let rare = (plain_run.0.iter().flatten().flatten())
                .filter(|&&t| t as usize >= COMMON_TOKENS)
                .count() as u64;
            assert!(
                spec_run.2 - spec_run.3 <= 4 * rare,
                "{} of {} guesses kept with {rare} rare tokens",
                spec_run.3,
                spec_run.2
            );
            assert!(
                spec_run.1 * 2 < plain_run.1,
                "steps: {} plain, {} with the draft",
                plain_run.1,
                spec_run.1
            );
        }
    }
    // Every finished sequence's draft state and blocks were given back: a long run again
    // still drafts (the draft cache would otherwise fill and guesses stop).
    let engine = fast.engine_mut();
    let before = engine.stats().spec_decode.num_draft_tokens;
    for round in 0..6 {
        for (i, p) in PROMPTS.iter().enumerate() {
            let prompt = PromptInput::Text(p.to_string());
            engine
                .add_request(format!("again{round}-{i}"), prompt, greedy(60), 0)
                .unwrap();
        }
        run(engine);
    }
    let drafted = engine.stats().spec_decode.num_draft_tokens - before;
    assert!(
        drafted > 6 * 3 * 40,
        "{drafted} tokens drafted over 6 rounds"
    );
}

/// A draft model of another vocabulary is refused at start, by name.
#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let test = "a_draft_model_of_another_vocabulary_is_refused";
    let qwen = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf";
    let Some(other) = minivllm::testing::real_model(qwen, "qwen2.5-coder-0.5b", test) else {
        return;
    };
    let spec = format!(
        r#"{{"model": {:?}, "num_speculative_tokens": 3}}"#,
        other.to_str().unwrap()
    );
    let err = test_llm_speculative(Some(&spec))
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("does not share the target's vocabulary"),
        "{err}"
    );
    let missing = r#"{"model": "/nonexistent/draft.gguf", "num_speculative_tokens": 3}"#;
    let err = test_llm_speculative(Some(missing))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("/nonexistent/draft.gguf"), "{err}");
}
