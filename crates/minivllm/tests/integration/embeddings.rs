//! Embeddings (`LLM::embed`): a prefill-only pass through the same scheduler, pooled from the
//! final hidden states. Batch invariance makes the checks exact: a prompt's vector is the
//! same bits alone, in a batch with generation, in chunks, and after the prefix cache holds
//! its prompt; generation is unchanged beside it; no KV is kept after.

use minivllm::engine::llm_engine::{EngineArgs, PromptInput};
use minivllm::entrypoints::llm::LLM;
use minivllm::sampling_params::{PoolingParams, PoolingType, SamplingParams};

use crate::common;
use crate::common::greedy;

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
];

fn llm(chunk: Option<usize>) -> LLM {
    LLM::new(&EngineArgs {
        model: common::test_model_path().to_str().unwrap().to_string(),
        max_model_len: Some(256),
        kv_cache_memory: 64 << 20,
        threads: Some(2),
        max_num_batched_tokens: chunk,
        ..Default::default()
    })
    .unwrap()
}

const LAST: PoolingParams = PoolingParams {
    pooling_type: PoolingType::Last,
    normalize: true,
};
const MEAN: PoolingParams = PoolingParams {
    pooling_type: PoolingType::Mean,
    normalize: false,
};

fn embed(llm: &mut LLM, prompts: &[&str], pooling: PoolingParams) -> Vec<Vec<f32>> {
    let prompts = prompts.iter().map(|p| PromptInput::Text(p.to_string()));
    (llm.embed(prompts, pooling, false).unwrap())
        .into_iter()
        .map(|o| {
            assert!(o.finished);
            o.outputs.embedding
        })
        .collect()
}

#[test]
fn vectors_are_the_same_alone_batched_chunked_and_cached() {
    let mut plain = llm(None);
    for pooling in [LAST, MEAN] {
        let alone: Vec<Vec<f32>> = PROMPTS
            .iter()
            .map(|p| embed(&mut plain, &[p], pooling).remove(0))
            .collect();
        let hidden = plain.engine().model().config().hidden_size;
        for v in &alone {
            assert_eq!(v.len(), hidden);
            assert!(v.iter().all(|x| x.is_finite()));
        }
        assert_ne!(alone[0], alone[1]);
        // Batched together, then again with the prompts in the prefix cache.
        assert_eq!(embed(&mut plain, &PROMPTS, pooling), alone, "{pooling:?}");
        assert_eq!(embed(&mut plain, &PROMPTS, pooling), alone, "{pooling:?}");
        // In prompt chunks of 7 tokens: the mean is summed over the chunks.
        let mut chunked = llm(Some(7));
        assert_eq!(embed(&mut chunked, &PROMPTS, pooling), alone, "{pooling:?}");
    }
    let unit = embed(&mut plain, &PROMPTS[..1], LAST).remove(0);
    let norm: f32 = unit.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    let last = PoolingParams {
        normalize: false,
        ..LAST
    };
    let raw = embed(&mut plain, &PROMPTS[..1], last).remove(0);
    let raw_norm: f32 = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    for (u, r) in unit.iter().zip(&raw) {
        assert!((u * raw_norm - r).abs() <= 1e-4 * r.abs().max(1.0));
    }
}

#[test]
fn embeddings_run_beside_generation_and_change_none_of_it() {
    let mut llm = llm(Some(16));
    let alone_vectors = embed(&mut llm, &PROMPTS, MEAN);
    let alone_text = common::run_to_completion(
        llm.engine_mut(),
        &[vec![1, 2, 3, 4, 5], vec![9, 8, 7]],
        &greedy(12),
    );
    let engine = llm.engine_mut();
    let free = engine.kv_blocks().0;
    for (i, ids) in [vec![1, 2, 3, 4, 5], vec![9, 8, 7]].into_iter().enumerate() {
        engine
            .add_request(format!("g{i}"), PromptInput::from(ids), greedy(12), 0)
            .unwrap();
    }
    for (i, p) in PROMPTS.iter().enumerate() {
        let params = SamplingParams {
            pooling: Some(MEAN),
            max_tokens: Some(1),
            ..SamplingParams::default()
        };
        engine
            .add_request(format!("e{i}"), PromptInput::Text(p.to_string()), params, 0)
            .unwrap();
    }
    let (mut texts, mut vectors) = (vec![Vec::new(); 2], vec![Vec::new(); 3]);
    let mut steps = 0;
    while engine.has_unfinished_requests() {
        steps += 1;
        for o in engine.step().unwrap().into_iter().filter(|o| o.finished) {
            let i: usize = o.request_id[1..].parse().unwrap();
            match (o.request_id.as_bytes()[0], o.pooled) {
                (b'g', None) => texts[i] = o.outputs[0].token_ids.clone(),
                (b'e', Some(v)) => {
                    assert!(o.outputs.is_empty(), "an embedding has no completions");
                    vectors[i] = v;
                }
                other => panic!("unexpected output {other:?}"),
            }
        }
    }
    assert_eq!(texts, alone_text);
    assert_eq!(vectors, alone_vectors);
    assert!(
        steps > 3,
        "the prompts ran in chunks beside the decodes: {steps} steps"
    );
    assert_eq!(engine.kv_blocks().0, free, "no KV kept after the requests");
}

#[test]
fn embedding_requests_refuse_what_does_not_apply() {
    let mut llm = llm(None);
    let params = SamplingParams {
        pooling: Some(LAST),
        n: 2,
        ..SamplingParams::default()
    };
    let err = (llm.engine_mut())
        .add_request("x", PromptInput::Text("Hi".into()), params, 0)
        .unwrap_err();
    assert!(err.to_string().contains("embedding"), "{err}");
}
