//! Prefill/decode disaggregation between two engines of the test model in one process: a
//! prefill engine keeps a request's prompt KV, a decode engine pulls it over TCP and runs
//! on from it, giving the tokens one engine gives, greedy and seeded, without prefilling.

use crate::common;

use minivllm::config::{KvLoadFailurePolicy, KvRole, KvTransferConfig};
use minivllm::distributed::kv_transfer::KvTransferParams;
use minivllm::engine::async_engine::{collect, AsyncEngine, AsyncEngineError};
use minivllm::engine::llm_engine::{EngineArgs, EngineError, LLMEngine, PromptInput};
use minivllm::outputs::RequestOutput;
use minivllm::sampling_params::SamplingParams;

const PROMPT: &str = "The history of the city begins with a small settlement on the river \
bank, where fishermen and traders met to exchange goods. Over the centuries the village grew";
/// Another prompt, different from the first token on: the decode engine's prefix cache
/// holds nothing of it after the first.
const OTHER: &str = "Snow covers the pine forest under a pale moon, and far below the ridge \
a river winds past villages whose lights go out one by one as the night grows colder";

fn engine(role: Option<KvRole>, on_failure: KvLoadFailurePolicy) -> AsyncEngine {
    let kv_transfer_config = role.map(|r| {
        let mut c = KvTransferConfig::from_json(
            r#"{"kv_connector": "TcpConnector", "kv_role": "kv_both", "kv_port": 0}"#,
        )
        .unwrap();
        c.kv_role = Some(r);
        c.kv_load_failure_policy = on_failure;
        c
    });
    let args = EngineArgs {
        model: common::test_model_path().to_str().unwrap().to_string(),
        max_model_len: Some(512),
        kv_cache_memory: 64 << 20,
        threads: Some(1),
        kv_transfer_config,
        ..EngineArgs::default()
    };
    AsyncEngine::new(LLMEngine::from_engine_args(&args).expect("engine starts"))
}

async fn run(
    e: &AsyncEngine,
    id: &str,
    prompt: &str,
    params: SamplingParams,
) -> Result<RequestOutput, AsyncEngineError> {
    let kind = params.output_kind;
    let rx = e.generate(id, PromptInput::from(prompt), params, 0).await?;
    Ok(collect(rx, kind).await.expect("an output"))
}

fn params(seed: Option<u64>, max_tokens: usize, kv: Option<KvTransferParams>) -> SamplingParams {
    SamplingParams {
        temperature: if seed.is_some() { 0.9 } else { 0.0 },
        seed,
        max_tokens: Some(max_tokens),
        kv_transfer_params: kv,
        ..SamplingParams::default()
    }
}

/// The prefill half as a router runs it: one token, the KV kept, where it waits.
async fn prefill(p: &AsyncEngine, id: &str, prompt: &str) -> KvTransferParams {
    let keep = KvTransferParams {
        do_remote_decode: true,
        ..Default::default()
    };
    let out = run(p, id, prompt, params(None, 1, Some(keep)))
        .await
        .unwrap();
    let kv = out
        .kv_transfer_params
        .expect("a prefill that stopped at its length keeps its KV");
    assert!(kv.do_remote_prefill && kv.remote().is_some(), "{kv:?}");
    kv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_engine_runs_on_the_pulled_kv_as_one_engine_would() {
    let one = engine(None, KvLoadFailurePolicy::Fail);
    let p = engine(Some(KvRole::KvProducer), KvLoadFailurePolicy::Fail);
    let d = engine(Some(KvRole::KvConsumer), KvLoadFailurePolicy::Fail);
    for (i, (seed, prompt)) in [(None, PROMPT), (Some(7), OTHER)].into_iter().enumerate() {
        let prompt_len = one.tokenizer().encode(prompt, false).unwrap().len();
        let want = run(&one, &format!("one{i}"), prompt, params(seed, 24, None))
            .await
            .unwrap();
        let kv = prefill(&p, &format!("p{i}"), prompt).await;
        let before = d.stats();
        let pulled = Some(kv.clone());
        let got = run(&d, &format!("d{i}"), prompt, params(seed, 24, pulled))
            .await
            .unwrap();
        assert_eq!(
            got.outputs[0].token_ids, want.outputs[0].token_ids,
            "seed {seed:?}"
        );
        // Every prompt token but the last came in the pull (none from the prefix cache):
        // only that token is run again (its logits give the first sample), then each
        // generated token but the last.
        let after = d.stats();
        let external = after.external_prefix_cache_hits - before.external_prefix_cache_hits;
        assert_eq!(external as usize, prompt_len - 1, "seed {seed:?}");
        let ran = after.num_computed_tokens - before.num_computed_tokens;
        assert_eq!(ran, 1 + 23, "seed {seed:?}: the decode engine prefilled");
        assert_eq!(got.num_cached_tokens, prompt_len - 1);
        // A payload is pulled once.
        let again = run(&d, &format!("again{i}"), prompt, params(seed, 4, Some(kv))).await;
        assert!(
            matches!(again, Err(AsyncEngineError::Engine(EngineError::KvTransfer(ref m))) if m.contains("no KV")),
            "{again:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_of_another_prompt_or_gone_is_recomputed_under_recompute_and_refused_under_fail() {
    let p = engine(Some(KvRole::KvBoth), KvLoadFailurePolicy::Fail);
    let recompute = engine(Some(KvRole::KvConsumer), KvLoadFailurePolicy::Recompute);
    let fail = engine(Some(KvRole::KvConsumer), KvLoadFailurePolicy::Fail);
    let other = "A completely different prompt about the sea and its ships.";
    let want = run(&p, "want", other, params(None, 12, None))
        .await
        .unwrap();
    // Another prompt's KV: checked against the tokens, never used.
    let kv = prefill(&p, "p0", PROMPT).await;
    let got = run(&recompute, "r0", other, params(None, 12, Some(kv)))
        .await
        .unwrap();
    assert_eq!(got.outputs[0].token_ids, want.outputs[0].token_ids);
    assert_eq!(got.num_cached_tokens, 0);
    let kv = prefill(&p, "p1", PROMPT).await;
    let refused = run(&fail, "f0", other, params(None, 12, Some(kv.clone()))).await;
    assert!(
        matches!(refused, Err(AsyncEngineError::Engine(EngineError::KvTransfer(ref m))) if m.contains("prompt tokens differ")),
        "{refused:?}"
    );
    // A prefill server that is gone.
    let gone = KvTransferParams {
        remote_port: Some(1),
        ..kv
    };
    let got = run(&recompute, "r1", other, params(None, 12, Some(gone)))
        .await
        .unwrap();
    assert_eq!(got.outputs[0].token_ids, want.outputs[0].token_ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_asking_for_a_role_the_engine_lacks_are_refused() {
    let plain = engine(None, KvLoadFailurePolicy::Fail);
    let consumer = engine(Some(KvRole::KvConsumer), KvLoadFailurePolicy::Fail);
    let keep = KvTransferParams {
        do_remote_decode: true,
        ..Default::default()
    };
    for e in [&plain, &consumer] {
        let r = run(e, "x", PROMPT, params(None, 1, Some(keep.clone()))).await;
        let Err(AsyncEngineError::Engine(EngineError::Validation(v))) = r else {
            panic!("{r:?}");
        };
        assert!(v.message().contains("kv_producer"), "{}", v.message());
    }
    let wide = SamplingParams {
        n: 2,
        ..params(None, 1, Some(keep))
    };
    let r = run(&consumer, "y", PROMPT, wide).await;
    assert!(
        matches!(r, Err(AsyncEngineError::Engine(EngineError::Validation(_)))),
        "{r:?}"
    );
}
