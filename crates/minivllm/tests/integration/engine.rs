//! The engine end to end on the test model: batching must not change greedy results, whatever
//! the schedule (chunked, preempted, prefix-cached), and nothing may leak.

use crate::common;
use crate::common::greedy;

use minivllm::engine::llm_engine::{EngineArgs, LLMEngine, PromptInput};
use minivllm::entrypoints::llm::LLM;
use minivllm::model_executor::loader::weights::LoadOptions;
use minivllm::outputs::{RequestMetrics, RequestOutput};
use minivllm::sampling_params::SamplingParams;
use minivllm::sequence::FinishReason;

const TEXT: &str = "The history of the city begins with a small settlement on the river bank, \
where fishermen and traders met to exchange goods. Over the centuries the village grew into a \
market town, then into a busy port with ships arriving from distant lands. Merchants built \
warehouses along the water, and churches rose above the roofs. In the modern era, factories \
and railways transformed the landscape, and the population grew rapidly as people moved from \
the countryside in search of work. Today the city is known for its museums, its universities, \
and its parks, which attract visitors from around the world every year. def fibonacci(n):\n    \
if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\nprint([fibonacci(i) \
for i in range(10)])\nQuestion: What is the capital of France? Answer: The capital of France is \
Paris, a city famous for the Eiffel Tower, the Louvre museum and its cafes along the Seine. ";

fn engine_args() -> EngineArgs {
    EngineArgs {
        model: common::test_model_path().to_str().unwrap().to_string(),
        max_model_len: Some(512),
        kv_cache_memory: 256 << 20,
        threads: Some(2),
        ..EngineArgs::default()
    }
}

fn llm(args: &EngineArgs) -> LLM {
    LLM::new(args).expect("engine starts")
}

/// 16 prompts of 5 to 146 tokens cut from varied text, so greedy decisions are not near-ties:
/// 1,160 tokens in all, several times what the tiny KV cache below holds.
fn varied_prompts(llm: &LLM) -> Vec<Vec<u32>> {
    let ids = llm.engine().tokenizer().encode(TEXT, false).unwrap();
    (0..16)
        .map(|i| {
            let len = 5 + (i * 97) % 160;
            let start = (i * 13) % 40;
            (0..len).map(|j| ids[(start + j) % ids.len()]).collect()
        })
        .collect()
}

fn token_ids(outs: &[RequestOutput]) -> Vec<Vec<u32>> {
    outs.iter()
        .map(|o| o.outputs[0].token_ids.clone())
        .collect()
}

fn assert_all_blocks_free(engine: &mut LLMEngine) {
    assert!(!engine.has_unfinished_requests());
    // The worker's persistent batch forgets finished sequences with the next step, or when
    // the engine goes idle.
    engine.release_idle_memory();
    assert_eq!(
        engine.num_worker_seqs(),
        0,
        "the worker kept finished sequences"
    );
    assert_eq!(engine.kv_blocks().0, engine.kv_blocks().1, "blocks leaked");
    let (free, total) = engine.cpu_blocks();
    assert_eq!(free, total, "swap blocks leaked");
}

#[test]
fn batching_chunking_preemption_and_caching_do_not_change_greedy_outputs() {
    let args = engine_args();
    let mut solo = llm(&args);
    let prompts = varied_prompts(&solo);
    let params = greedy(6);
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| token_ids(&solo.generate([p.clone()], &params, false).unwrap()).remove(0))
        .collect();
    assert_all_blocks_free(solo.engine_mut());

    // 24 blocks of 16 tokens (30 layers, K and V, 3 KV heads of 64 in f16): room for two
    // or three of the prompts at a time, and for one sequence of max_model_len 256.
    let tiny_kv_cache = 24 * 16 * 30 * 2 * 3 * 64 * 2;
    let variants: Vec<(&str, EngineArgs)> = vec![
        ("batched", args.clone()),
        (
            "no prefix caching",
            EngineArgs {
                enable_prefix_caching: false,
                ..args.clone()
            },
        ),
        (
            "chunked prefill, 64-token budget",
            EngineArgs {
                max_num_batched_tokens: Some(64),
                ..args.clone()
            },
        ),
        (
            "tiny KV cache",
            EngineArgs {
                kv_cache_memory: tiny_kv_cache,
                max_model_len: Some(256),
                ..args.clone()
            },
        ),
        (
            "tiny KV cache, swap space",
            EngineArgs {
                kv_cache_memory: tiny_kv_cache,
                max_model_len: Some(256),
                // Twice the KV cache, so every victim fits.
                swap_space: 2 * tiny_kv_cache,
                ..args.clone()
            },
        ),
    ];
    for (name, variant) in variants {
        let mut batched = llm(&variant);
        let outs = batched.generate(prompts.clone(), &params, false).unwrap();
        assert_eq!(outs.len(), prompts.len(), "{name}: requests lost");
        assert!(
            outs.iter().all(|o| o.finished),
            "{name}: unfinished request"
        );
        for (i, (got, want)) in token_ids(&outs).iter().zip(&alone).enumerate() {
            assert_eq!(
                got,
                want,
                "{name}: prompt {i} ({} tokens)",
                prompts[i].len()
            );
        }
        let stats = batched.engine().stats();
        if name.starts_with("tiny KV cache") {
            assert!(
                stats.num_preemptions > 0,
                "{name}: expected preemptions, got none"
            );
        }
        if name.ends_with("swap space") {
            assert!(stats.num_swapped_out > 0, "{name}: nothing swapped out");
            assert_eq!(stats.num_swapped_in, stats.num_swapped_out, "{name}");
        } else {
            assert_eq!(
                stats.num_swapped_out, 0,
                "{name}: swapped without swap space"
            );
        }
        assert_all_blocks_free(batched.engine_mut());
    }
}

#[test]
fn shared_prefixes_hit_the_prefix_cache_with_identical_outputs() {
    let mut llm = llm(&engine_args());
    let prefix = llm.engine().tokenizer().encode(TEXT, false).unwrap()[..200].to_vec();
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|i| prefix.iter().copied().chain([504 + i, 3575]).collect())
        .collect();
    let params = greedy(4);
    let first = llm.generate([prompts[0].clone()], &params, false).unwrap();
    let before = llm.engine().stats();
    let rest = llm.generate(prompts[1..].to_vec(), &params, false).unwrap();
    let after = llm.engine().stats();
    assert!(
        after.prefix_cache_hits > before.prefix_cache_hits,
        "no prefix cache hit"
    );
    // Three prompts of 202 tokens; with 192 cached tokens each, only a handful are computed.
    // Each output says how many it found (vLLM's `num_cached_tokens`), the first none.
    assert_eq!(first[0].num_cached_tokens, 0);
    for out in &rest {
        assert_eq!(out.num_cached_tokens, 192, "{}", out.request_id);
    }
    let computed = after.num_computed_tokens - before.num_computed_tokens;
    assert!(
        computed < 3 * 60,
        "computed {computed} tokens for three cached prompts"
    );

    let mut cold = LLM::new(&EngineArgs {
        enable_prefix_caching: false,
        ..engine_args()
    })
    .unwrap();
    let uncached = cold.generate(prompts.clone(), &params, false).unwrap();
    let mut cached = token_ids(&first);
    cached.extend(token_ids(&rest));
    assert_eq!(cached, token_ids(&uncached));
    assert_all_blocks_free(llm.engine_mut());
}

#[test]
fn seeded_sampling_is_reproducible_across_runs_and_batches() {
    let mut llm = llm(&engine_args());
    let sampled = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: Some(1234),
        max_tokens: Some(12),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let prompt = "Once upon a time";
    let alone = token_ids(&llm.generate([prompt], &sampled, false).unwrap());
    let again = token_ids(&llm.generate([prompt], &sampled, false).unwrap());
    assert_eq!(alone, again);
    // In a batch with other (unseeded and seeded) requests, the same tokens come out.
    let others = SamplingParams {
        seed: None,
        ..sampled.clone()
    };
    let params = vec![others.clone(), sampled.clone(), others];
    let batch = llm
        .generate(["The weather today", prompt, "def main():"], &params, false)
        .unwrap();
    assert_eq!(token_ids(&batch)[1], alone[0]);
}

#[test]
fn n_completions_share_the_prompt_blocks() {
    let mut llm = llm(&engine_args());
    let engine = llm.engine_mut();
    let params = SamplingParams {
        n: 3,
        temperature: 1.0,
        seed: Some(7),
        max_tokens: Some(5),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let prompt: Vec<u32> = (0..40).map(|i| 100 + i).collect(); // 3 blocks of 16 (last partial)
    engine
        .add_request("r", PromptInput::TokenIds(prompt), params, 0)
        .unwrap();
    let total = engine.kv_blocks().1;
    // The first sequence prefills the prompt; its siblings, scheduled after it in the same
    // step, find its 2 full blocks in the prefix cache and compute only the partial one.
    engine.step().unwrap();
    engine.step().unwrap(); // each writes its first token into its own partial block
    let used = total - engine.kv_blocks().0;
    // Shared: 2 full prompt blocks; own: 3 partial last blocks.
    assert_eq!(
        used,
        2 + 3,
        "blocks in use with 3 completions sharing a 40-token prompt"
    );
    let mut last = None;
    while engine.has_unfinished_requests() {
        for o in engine.step().unwrap() {
            last = Some(o);
        }
    }
    let out = last.unwrap();
    assert!(out.finished);
    assert_eq!(out.outputs.len(), 3);
    assert!(out.outputs.iter().all(|o| o.token_ids.len() == 5));
    assert_eq!(engine.kv_blocks().0, total);
}

#[test]
fn stop_strings_are_trimmed_and_reported() {
    // f32 weights, whose greedy output is the reference's.
    let mut llm = llm(&EngineArgs {
        load: LoadOptions::FLOAT32,
        ..engine_args()
    });
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(16),
        stop: vec!["answer".to_string()],
        ..SamplingParams::default()
    };
    // Greedy continues " Paris.\n\nThe answer is: ..." (the reference output).
    let out = llm
        .generate(["The capital of France is"], &params, false)
        .unwrap();
    let c = &out[0].outputs[0];
    assert_eq!(c.text, " Paris.\n\nThe ");
    assert_eq!(c.finish_reason, Some(FinishReason::Stop));
    assert_eq!(
        c.stop_reason,
        Some(minivllm::sequence::StopReason::String("answer".into()))
    );
    let keep = SamplingParams {
        include_stop_str_in_output: true,
        ..params
    };
    let out = llm
        .generate(["The capital of France is"], &keep, false)
        .unwrap();
    assert_eq!(out[0].outputs[0].text, " Paris.\n\nThe answer");
}

#[test]
fn bad_requests_fail_alone_and_the_engine_keeps_serving() {
    let mut llm = llm(&engine_args());
    let engine = llm.engine_mut();
    engine
        .add_request(
            "good",
            PromptInput::Text("The capital of France is".into()),
            greedy(4),
            0,
        )
        .unwrap();
    let bad_temp = SamplingParams {
        temperature: -1.0,
        ..greedy(4)
    };
    let e = engine
        .add_request("bad1", PromptInput::Text("hi".into()), bad_temp, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("temperature"), "{e}");
    let e = engine
        .add_request("bad2", PromptInput::TokenIds(vec![5; 600]), greedy(4), 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("length 600") && e.contains("maximum model length of 512"),
        "{e}"
    );
    let e = engine
        .add_request("good", PromptInput::Text("again".into()), greedy(4), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("already in use"), "{e}");
    for (n, best_of) in [(1_000_000_000_000, None), (2, Some(257))] {
        let wide = SamplingParams {
            n,
            best_of,
            temperature: 0.8,
            ..greedy(4)
        };
        let e = engine
            .add_request("wide", PromptInput::Text("hi".into()), wide, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--max-num-seqs 256"), "{e}");
    }
    let mut outs = Vec::new();
    while engine.has_unfinished_requests() {
        outs.extend(engine.step().unwrap());
    }
    let last = outs.last().unwrap();
    assert_eq!(last.request_id, "good");
    assert_eq!(last.outputs[0].text, " Paris.\n\n");
}

#[test]
fn aborted_requests_free_their_blocks() {
    let mut llm = llm(&engine_args());
    let engine = llm.engine_mut();
    for i in 0..4 {
        engine
            .add_request(
                format!("r{i}"),
                PromptInput::Text(TEXT.into()),
                greedy(50),
                0,
            )
            .unwrap();
    }
    engine.step().unwrap();
    engine.step().unwrap();
    assert!(engine.kv_blocks().0 < engine.kv_blocks().1);
    engine.abort_request("r1");
    engine.abort_request("r3");
    engine.abort_request("unknown");
    while engine.has_unfinished_requests() {
        for o in engine.step().unwrap() {
            assert!(o.request_id == "r0" || o.request_id == "r2");
        }
    }
    assert_all_blocks_free(engine);
}

/// vLLM's `RequestMetrics`: a request is stamped scheduled when the scheduler first gives
/// it a step, before that step's forward pass, so its first token comes strictly later; one
/// that waits behind another (one sequence at a time) is scheduled after the first ends.
#[test]
fn request_metrics_stamp_scheduling_before_the_forward_pass() {
    let mut llm = llm(&EngineArgs {
        max_num_seqs: 1,
        ..engine_args()
    });
    let engine = llm.engine_mut();
    for i in 0..2 {
        let prompt = PromptInput::Text(TEXT.into());
        engine
            .add_request(format!("r{i}"), prompt, greedy(2), 0)
            .unwrap();
    }
    let mut last = std::collections::HashMap::new();
    while engine.has_unfinished_requests() {
        for o in engine.step().unwrap() {
            last.insert(
                o.request_id.clone(),
                o.metrics.expect("outputs carry metrics"),
            );
        }
    }
    let (first, second) = (last["r0"], last["r1"]);
    for m in [first, second] {
        let scheduled = m.first_scheduled_time.expect("stamped when scheduled");
        assert!(m.arrival_time <= scheduled, "{m:?}");
        assert!(scheduled < m.first_token_time.unwrap(), "{m:?}");
        assert_eq!(m.time_in_queue, Some(scheduled - m.arrival_time));
    }
    assert!(second.first_scheduled_time.unwrap() >= first.finished_time.unwrap());
    // The latency histograms (`/metrics`) are observed at those same stamps: one clock.
    let h = engine.stats().requests;
    let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-9, "{a} vs {b}");
    let span = |m: &RequestMetrics, from: Option<f64>, to: Option<f64>| {
        to.unwrap() - from.unwrap_or(m.arrival_time)
    };
    assert_eq!(h.time_to_first_token.count(), 2);
    close(
        h.time_to_first_token.sum(),
        span(&first, None, first.first_token_time) + span(&second, None, second.first_token_time),
    );
    assert_eq!(
        h.inter_token_latency.count(),
        2,
        "one gap each: two tokens, two steps"
    );
    close(
        h.inter_token_latency.sum(),
        span(&first, first.first_token_time, first.last_token_time)
            + span(&second, second.first_token_time, second.last_token_time),
    );
    close(
        h.e2e_latency.sum(),
        span(&first, None, first.finished_time) + span(&second, None, second.finished_time),
    );
    assert_eq!(h.generation_tokens.sum(), 4.0);
    assert_eq!(h.success[0] + h.success[1], 2);
    assert_eq!(h.success[2], 0);
    // An aborted request counts as one, once; an unknown id not at all.
    let prompt = PromptInput::Text(TEXT.into());
    engine.add_request("r2", prompt, greedy(2), 0).unwrap();
    engine.abort_request("r2");
    engine.abort_request("r2");
    engine.abort_request("nobody");
    assert_eq!(engine.stats().requests.success[2], 1);
}

/// `LLM::generate` refuses a batch with a bad prompt before adding any of it: nothing runs,
/// nothing is counted as aborted, and the next batch starts clean.
#[test]
fn a_refused_batch_adds_nothing() {
    let mut llm = llm(&engine_args());
    let too_long = PromptInput::TokenIds(vec![1; 600]);
    let prompts = [PromptInput::Text(TEXT.into()), too_long];
    let err = llm.generate(prompts, &greedy(2), false).unwrap_err();
    assert!(err.to_string().contains("600"), "{err}");
    let stats = llm.engine().stats();
    assert_eq!((stats.requests.success, stats.num_waiting), ([0; 4], 0));
    assert!(!llm.engine().has_unfinished_requests());
    let out = llm.generate([TEXT], &greedy(2), false).unwrap();
    assert_eq!(out[0].outputs[0].token_ids.len(), 2);
    assert_eq!(llm.engine().stats().requests.success[2], 0);
}

#[test]
fn logprobs_and_prompt_logprobs_match_the_reference() {
    let mut llm = llm(&EngineArgs {
        load: LoadOptions::FLOAT32,
        ..engine_args()
    });
    let case = &common::reference_cases()[0];
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(4),
        logprobs: Some(5),
        prompt_logprobs: Some(2),
        ..SamplingParams::default()
    };
    let out = llm
        .generate([case.prompt_ids.clone()], &params, false)
        .unwrap()
        .remove(0);
    let c = &out.outputs[0];
    let lps = c.logprobs.as_ref().unwrap();
    for (i, (lp, step)) in lps.iter().zip(&case.steps).enumerate() {
        assert_eq!(c.token_ids[i], step.chosen_id);
        let got = lp.get(step.chosen_id).unwrap();
        assert!(
            (got - step.chosen_logprob).abs() < 2e-3,
            "step {i}: {got} vs {}",
            step.chosen_logprob
        );
        assert_eq!(lp.entries.len(), 5, "chosen token is in the top 5");
        assert_eq!(lp.rank, 1, "greedy chose the most likely token");
    }
    let cum: f64 = lps
        .iter()
        .zip(&c.token_ids)
        .map(|(lp, t)| lp.get(*t).unwrap() as f64)
        .sum();
    assert!((c.cumulative_logprob.unwrap() - cum).abs() < 1e-4);
    let plp = out.prompt_logprobs.as_ref().unwrap();
    assert_eq!(plp.len(), case.prompt_ids.len());
    assert!(plp[0].is_none());
    for (i, entry) in plp.iter().enumerate().skip(1) {
        let entry = entry.as_ref().unwrap();
        let lp = entry.get(case.prompt_ids[i]).unwrap();
        assert!(lp <= 0.0 && lp.is_finite());
    }
}

/// `logprobs = prompt_logprobs = -1` (vLLM's "all") report every token of the vocabulary,
/// and only where the engine allows it (`max_logprobs = -1`): each position's list is a
/// whole distribution, sorted, and begins with what a top-5 request reports.
#[test]
fn all_logprobs_cover_the_vocabulary_where_the_engine_allows_it() {
    use minivllm::sampling_params::ALL_LOGPROBS;
    let all = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(2),
        logprobs: Some(ALL_LOGPROBS),
        prompt_logprobs: Some(ALL_LOGPROBS),
        ..SamplingParams::default()
    };
    let prompt = vec![504u32, 3575, 282, 4649, 314];
    let err = llm(&engine_args())
        .generate([prompt.clone()], &all, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Requested sample logprobs of 49152, which is greater than max allowed: 20"),
        "{err}"
    );
    let mut llm = llm(&EngineArgs {
        max_logprobs: ALL_LOGPROBS,
        ..engine_args()
    });
    let vocab = llm.engine().tokenizer().vocab_size();
    let out = llm
        .generate([prompt.clone()], &all, false)
        .unwrap()
        .remove(0);
    let top5 = SamplingParams {
        logprobs: Some(5),
        prompt_logprobs: Some(5),
        ..all.clone()
    };
    let five = llm
        .generate([prompt.clone()], &top5, false)
        .unwrap()
        .remove(0);
    assert_eq!(out.outputs[0].token_ids, five.outputs[0].token_ids);
    let positions = out.prompt_logprobs.iter().flatten().flatten();
    let positions = positions.chain(out.outputs[0].logprobs.iter().flatten());
    let top_positions = five.prompt_logprobs.iter().flatten().flatten();
    let top_positions = top_positions.chain(five.outputs[0].logprobs.iter().flatten());
    let mut n = 0;
    for (lp, top) in positions.zip(top_positions) {
        n += 1;
        assert_eq!(lp.entries.len(), vocab, "every token once");
        let mut ids: Vec<u32> = lp.entries.iter().map(|e| e.0).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), vocab);
        let mass: f64 = lp.entries.iter().map(|e| (e.1 as f64).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-3, "probabilities sum to {mass}");
        assert_eq!(lp.rank, top.rank);
        // After the chosen (or actual) token, the others in order, as the top 5's.
        assert!(lp.entries[1..].windows(2).all(|w| w[0].1 >= w[1].1));
        assert_eq!(lp.entries[..top.entries.len()], top.entries[..]);
    }
    assert_eq!(n, prompt.len() - 1 + 2);
}

/// One request in each `RequestOutputKind`, side by side in the same batches: deltas fold
/// into the last cumulative output, each delta carries only what is new (no history is
/// copied) and its tokens with their text, and final-only gives one output, the same.
#[test]
fn output_kinds_carry_the_same_result() {
    use minivllm::sampling_params::RequestOutputKind::{Cumulative, Delta, FinalOnly};
    let mut llm = llm(&engine_args());
    let engine = llm.engine_mut();
    let params = |output_kind| SamplingParams {
        n: 2,
        temperature: 0.8,
        seed: Some(7),
        logprobs: Some(2),
        prompt_logprobs: Some(1),
        stop: vec!["\n\n".into()],
        max_tokens: Some(24),
        output_kind,
        ..SamplingParams::default()
    };
    for (id, kind) in [
        ("cumulative", Cumulative),
        ("delta", Delta),
        ("final", FinalOnly),
    ] {
        let prompt = PromptInput::Text("Write a short poem about the sea:".into());
        engine.add_request(id, prompt, params(kind), 0).unwrap();
    }
    let (mut last, mut folded, mut finals) = (None, None::<RequestOutput>, Vec::new());
    while engine.has_unfinished_requests() {
        for out in engine.step().unwrap() {
            match out.request_id.as_str() {
                "cumulative" => last = Some(out),
                "delta" => {
                    // Tokens come with the text they release (so each delta has text
                    // until the last); that the folded deltas equal the cumulative output
                    // below shows none repeats history.
                    for o in &out.outputs {
                        let released = !o.text.is_empty() || o.finish_reason.is_some();
                        assert!(released, "a delta without text: {o:?}");
                    }
                    match &mut folded {
                        Some(acc) => acc.add(out),
                        None => folded = Some(out),
                    }
                }
                _ => finals.push(out),
            }
        }
    }
    let (last, folded) = (last.unwrap(), folded.unwrap());
    assert!(last.finished && folded.finished);
    assert_eq!(folded.outputs, last.outputs);
    assert_eq!(folded.prompt_logprobs, last.prompt_logprobs);
    assert_eq!(finals.len(), 1, "final-only gave {} outputs", finals.len());
    assert_eq!(finals[0].outputs, last.outputs);
    assert_eq!(finals[0].prompt_logprobs, last.prompt_logprobs);
    assert!(last.outputs.iter().all(|o| !o.token_ids.is_empty()));
}
