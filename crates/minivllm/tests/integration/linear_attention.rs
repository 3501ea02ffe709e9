//! Qwen3.5's hybrid model (Gated DeltaNet layers with a recurrent state per sequence, beside
//! full-attention layers with a paged KV cache) through the whole engine: the tiny model of
//! `model_families.rs` as a Hugging Face folder gives transformers' greedy tokens however
//! the scheduler runs it — batched, in prefill chunks that carry the state, with fewer
//! state slots than requests (they wait for one), and preempted and recomputed (the slot
//! given back and its state rebuilt); and a chat's second turn resumes from the state its
//! first turn kept at a block boundary. Qwen3.5-MoE, the same layers with the experts in
//! every MLP's place, and Qwen3-Next (its DeltaNet projections fused per key-head group)
//! likewise.

use minivllm::engine::llm_engine::{EngineArgs, PromptInput};
use minivllm::entrypoints::llm::LLM;
use minivllm::model_executor::loader::weights::LoadOptions;

use super::model_families::cases;
use super::tiny_models;
use crate::common;

/// The tiny Qwen3.5 as a folder, with SmolLM2's tokenizer beside it (its prompts are token
/// ids, all below the tiny vocabulary's 256).
fn qwen35_folder() -> tempfile::TempDir {
    folder("qwen35")
}

/// `family`'s tiny model as a folder, with SmolLM2's tokenizer.
fn folder(family: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    tiny_models::write_hf_folder(family, dir.path());
    let src = common::reference_dir().join("smollm2-hf");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// The tiny model in f32, in a context of 64 and a cache of 16 MiB.
fn engine_args(dir: &tempfile::TempDir) -> EngineArgs {
    EngineArgs {
        model: dir.path().to_str().unwrap().to_string(),
        load: LoadOptions::FLOAT32,
        max_model_len: Some(64),
        kv_cache_memory: 16 << 20,
        threads: Some(2),
        ..EngineArgs::default()
    }
}

/// Bytes of one sequence's state in the tiny model: three DeltaNet layers, each a
/// convolution window of 3 over 128 channels and 4 value heads of 16 × 16.
const STATE_BYTES: u64 = 3 * (3 * 128 + 4 * 16 * 16) * 4;
/// Bytes of one f32 block of 16 tokens: one attention layer, K and V, 2 KV heads of 32.
const BLOCK_BYTES: u64 = 2 * 16 * 2 * 32 * 4;

#[test]
fn qwen35_gives_transformers_greedy_tokens_however_it_is_scheduled() {
    let dir = qwen35_folder();
    let args = engine_args(&dir);
    let cases = cases("qwen35");
    let prompts: Vec<PromptInput> = cases
        .iter()
        .map(|c| PromptInput::TokenIds(c.prompt.clone()))
        .collect();
    let params = common::greedy(12);
    // (name, args, preemptions expected)
    let variants = [
        ("batched", args.clone(), false),
        (
            "chunked prefill, 8-token steps",
            EngineArgs {
                max_num_batched_tokens: Some(8),
                ..args.clone()
            },
            false,
        ),
        (
            // Half the budget buys one slot: the requests run one after another.
            "one state slot",
            EngineArgs {
                kv_cache_memory: 4 * STATE_BYTES - 1,
                ..args.clone()
            },
            false,
        ),
        (
            // Three slots, and 7 blocks where the three sequences end up needing 8.
            "preempted",
            EngineArgs {
                kv_cache_memory: 6 * STATE_BYTES + BLOCK_BYTES,
                ..args.clone()
            },
            true,
        ),
        (
            "swap space asked for",
            EngineArgs {
                kv_cache_memory: 6 * STATE_BYTES + BLOCK_BYTES,
                swap_space: 64 * BLOCK_BYTES,
                ..args.clone()
            },
            true,
        ),
    ];
    for (name, variant, preempts) in variants {
        let mut llm = LLM::new(&variant).unwrap_or_else(|e| panic!("{name}: {e}"));
        let outs = llm.generate(prompts.clone(), &params, false).unwrap();
        for (i, (out, case)) in outs.iter().zip(&cases).enumerate() {
            assert_eq!(
                out.outputs[0].token_ids, case.greedy,
                "{name}: prompt {i} against transformers"
            );
        }
        let stats = llm.engine().stats();
        assert_eq!(
            stats.num_preemptions > 0,
            preempts,
            "{name}: {} preemptions",
            stats.num_preemptions
        );
        assert_eq!(stats.num_running + stats.num_waiting, 0, "{name}");
    }
}

/// Qwen3.5-MoE (every MLP routed to 2 of 8 experts beside a gated shared expert) and
/// Qwen3-Next through the engine, batched and in 8-token prefill chunks, from their Hugging
/// Face folders.
#[test]
fn the_moe_hybrids_give_transformers_greedy_tokens_through_the_engine() {
    for family in ["qwen35moe", "qwen3next"] {
        moe_hybrid_through_the_engine(family);
    }
}

fn moe_hybrid_through_the_engine(family: &str) {
    let dir = folder(family);
    let cases = cases(family);
    let prompts: Vec<PromptInput> = cases
        .iter()
        .map(|c| PromptInput::TokenIds(c.prompt.clone()))
        .collect();
    for chunk in [None, Some(8)] {
        let args = EngineArgs {
            max_num_batched_tokens: chunk,
            ..engine_args(&dir)
        };
        let mut llm = LLM::new(&args).unwrap();
        assert!(llm.engine().model().config().moe.is_some());
        let outs = llm
            .generate(prompts.clone(), &common::greedy(12), false)
            .unwrap();
        for (i, (out, case)) in outs.iter().zip(&cases).enumerate() {
            let what = format!("{family}, chunks {chunk:?}: prompt {i}");
            assert_eq!(out.outputs[0].token_ids, case.greedy, "{what}");
        }
    }
}

/// What the engine cannot do with a recurrent state is refused, saying why.
#[test]
fn qwen35_refuses_speculative_decoding_and_too_small_a_cache() {
    let dir = qwen35_folder();
    let args = engine_args(&dir);
    let e = LLM::new(&EngineArgs {
        speculative_config: Some(
            minivllm::config::SpeculativeConfig::from_json(
                r#"{"method": "ngram", "num_speculative_tokens": 3}"#,
            )
            .unwrap(),
        ),
        ..args.clone()
    })
    .err()
    .expect("speculative decoding refused")
    .to_string();
    assert!(e.contains("linear-attention"), "{e}");
    // Nor as another model's draft (it has the test model's tokenizer).
    let spec = format!(
        r#"{{"method": "draft_model", "model": {:?}, "num_speculative_tokens": 2}}"#,
        dir.path().to_str().unwrap()
    );
    let e = LLM::new(&EngineArgs {
        model: common::test_model_path().to_str().unwrap().to_string(),
        speculative_config: Some(minivllm::config::SpeculativeConfig::from_json(&spec).unwrap()),
        ..args.clone()
    })
    .err()
    .expect("a linear-attention draft model refused")
    .to_string();
    assert!(e.contains("linear-attention"), "{e}");
    let e = LLM::new(&EngineArgs {
        kv_cache_memory: STATE_BYTES,
        ..args.clone()
    })
    .err()
    .expect("a budget below one state refused")
    .to_string();
    assert!(e.contains("--kv-cache-memory"), "{e}");
}

/// A chat's second turn resumes from the state its first turn kept at its last block
/// boundary (vLLM's prefix caching of states, "align" mode): it computes only the tokens
/// after that boundary, and decodes what a cold run decodes. Without prefix caching it
/// computes everything.
#[test]
fn qwen35_second_turn_resumes_from_the_first_turns_state() {
    let dir = qwen35_folder();
    let args = engine_args(&dir);
    let case = &cases("qwen35")[2];
    let run = |llm: &mut LLM, prompt: &[u32], n: usize| {
        let input = vec![PromptInput::TokenIds(prompt.to_vec())];
        let out = llm.generate(input, &common::greedy(n), false).unwrap();
        (
            out[0].outputs[0].token_ids.clone(),
            out[0].num_cached_tokens,
        )
    };
    let mut llm = LLM::new(&args).unwrap();
    let (first, cached) = run(&mut llm, &case.prompt, 12);
    assert_eq!((&first, cached), (&case.greedy, 0));
    let turn = [&case.prompt[..], &first, &[17, 42, 99, 3, 250]].concat();
    // The first turn computed its prompt and all its tokens but the last: 51 tokens,
    // whose last block boundary (of 16) is 48.
    let boundary = (case.prompt.len() + first.len() - 1) / 16 * 16;
    assert_eq!(boundary, 48);
    let warm = run(&mut llm, &turn, 6);
    let mut cold_llm = LLM::new(&EngineArgs {
        enable_prefix_caching: false,
        ..args.clone()
    })
    .unwrap();
    let cold = run(&mut cold_llm, &turn, 6);
    assert_eq!(cold.1, 0);
    assert_eq!(warm, (cold.0, boundary));
}

/// An `n > 1` request's later completions start from the state the first kept at the
/// prompt's last block boundary (the state copied at the fork): the prompt is computed
/// once, each later completion computes only its tokens after that boundary, and every
/// completion decodes what a lone request decodes. Without prefix caching each computes it.
#[test]
fn qwen35_completions_of_one_request_share_the_prompts_state() {
    let dir = qwen35_folder();
    let case = &cases("qwen35")[2];
    // Sampled (n > 1 refuses greedy), from the top token only: greedy's tokens.
    let params = minivllm::sampling_params::SamplingParams {
        n: 3,
        temperature: 1.0,
        top_k: 1,
        ..common::greedy(12)
    };
    for prefix_caching in [true, false] {
        let mut llm = LLM::new(&EngineArgs {
            enable_prefix_caching: prefix_caching,
            ..engine_args(&dir)
        })
        .unwrap();
        let prompt = vec![PromptInput::TokenIds(case.prompt.clone())];
        let out = llm.generate(prompt, &params, false).unwrap();
        assert_eq!(out[0].outputs.len(), 3);
        for c in &out[0].outputs {
            assert_eq!(c.token_ids, case.greedy, "prefix caching {prefix_caching}");
        }
        // A 40-token prompt, whose last boundary (of 16) is 32; 11 decode steps each.
        let prompts = match prefix_caching {
            true => 40 + 2 * (40 - 32),
            false => 3 * 40,
        };
        let computed = llm.engine().stats().num_computed_tokens;
        assert_eq!(
            computed,
            prompts + 3 * 11,
            "prefix caching {prefix_caching}"
        );
    }
}
