//! Shared by the integration tests: where the test model and the reference outputs are.
#![allow(dead_code)]

use serde_json::Value;

pub use minivllm::testing::{reference_dir, test_model_path};

pub struct ReferenceStep {
    pub chosen_id: u32,
    pub chosen_logprob: f32,
    pub margin: f32,
    pub top5: Vec<(u32, f32)>,
}

pub struct ReferenceCase {
    pub kind: String,
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    pub steps: Vec<ReferenceStep>,
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn reference_cases() -> Vec<ReferenceCase> {
    let path = reference_dir().join("smollm2_greedy_hf.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| ReferenceCase {
            kind: r["kind"].as_str().unwrap().to_string(),
            prompt: r["prompt"].as_str().unwrap().to_string(),
            prompt_ids: ids(&r["prompt_ids"]),
            output_ids: ids(&r["output_ids"]),
            steps: r["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| ReferenceStep {
                    chosen_id: s["chosen_id"].as_u64().unwrap() as u32,
                    chosen_logprob: s["chosen_logprob"].as_f64().unwrap() as f32,
                    margin: s["top1_top2_logit_margin"].as_f64().unwrap() as f32,
                    top5: s["top5"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| {
                            (
                                t["id"].as_u64().unwrap() as u32,
                                t["logprob"].as_f64().unwrap() as f32,
                            )
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect()
}

/// Each prompt's output ids when `params` runs them all through `engine` in one batch.
pub fn run_to_completion(
    engine: &mut minivllm::engine::llm_engine::LLMEngine,
    prompts: &[Vec<u32>],
    params: &minivllm::sampling_params::SamplingParams,
) -> Vec<Vec<u32>> {
    for (i, p) in prompts.iter().enumerate() {
        let prompt = minivllm::engine::llm_engine::PromptInput::from(p.clone());
        engine
            .add_request(i.to_string(), prompt, params.clone(), 0)
            .unwrap();
    }
    let mut outs = vec![Vec::new(); prompts.len()];
    while engine.has_unfinished_requests() {
        for o in engine.step().unwrap() {
            if o.finished {
                outs[o.request_id.parse::<usize>().unwrap()] = o.outputs[0].token_ids.clone();
            }
        }
    }
    outs
}

/// An engine on the test model with 2 kernel threads, `max_model_len` tokens and
/// `kv_cache_memory` bytes of KV cache.
pub fn test_llm(max_model_len: usize, kv_cache_memory: u64) -> minivllm::entrypoints::llm::LLM {
    minivllm::entrypoints::llm::LLM::new(&minivllm::engine::llm_engine::EngineArgs {
        model: test_model_path().to_str().unwrap().to_string(),
        max_model_len: Some(max_model_len),
        kv_cache_memory,
        threads: Some(2),
        ..Default::default()
    })
    .expect("engine starts")
}

/// Greedy, `max_tokens` tokens, EOS ignored (every request runs its whole length).
pub fn greedy(max_tokens: usize) -> minivllm::sampling_params::SamplingParams {
    minivllm::sampling_params::SamplingParams {
        temperature: 0.0,
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Default::default()
    }
}

/// The test model with `--speculative-config` `spec` (vLLM's JSON), or without it.
pub fn test_llm_speculative(
    spec: Option<&str>,
) -> Result<minivllm::entrypoints::llm::LLM, minivllm::engine::errors::EngineError> {
    minivllm::entrypoints::llm::LLM::new(&minivllm::engine::llm_engine::EngineArgs {
        model: test_model_path().to_str().unwrap().to_string(),
        max_model_len: Some(256),
        kv_cache_memory: 64 << 20,
        threads: Some(2),
        speculative_config: spec
            .map(|s| minivllm::config::SpeculativeConfig::from_json(s).unwrap()),
        ..Default::default()
    })
}
