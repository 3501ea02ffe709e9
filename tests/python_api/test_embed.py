"""`LLM.embed` and `LLM.encode` as in vLLM: pooled final hidden states, batched, with the
pooling of `pooler_config`; checked against the server's `/v1/embeddings` tests' reference
(the last hidden state through the tied embedding matrix gives transformers' logprobs)."""

import json
import math

import pytest

from minivllm import LLM, EmbeddingRequestOutput, PoolingParams, PoolingRequestOutput
from pytest_support import QUANTISED_LOGPROB_TOL, ROOT

TEXTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def test_embed_as_vllm(llm):
    outs = llm.embed(TEXTS, use_tqdm=False)
    assert [type(o) for o in outs] == [EmbeddingRequestOutput] * 3
    for o in outs:
        assert o.finished and len(o.outputs.embedding) == o.outputs.hidden_size == 576
        assert abs(norm(o.outputs.embedding) - 1) < 1e-5
        assert o.prompt_token_ids
    alone = [llm.embed(t, use_tqdm=False)[0].outputs.embedding for t in TEXTS]
    assert alone == [o.outputs.embedding for o in outs]
    encoded = llm.encode(TEXTS, use_tqdm=False)
    assert [type(o) for o in encoded] == [PoolingRequestOutput] * 3
    assert [o.outputs.data for o in encoded] == alone
    # Token ids work as prompts too.
    ids = outs[0].prompt_token_ids
    assert llm.embed({"prompt_token_ids": ids}, use_tqdm=False)[0].outputs.embedding == alone[0]


def test_unnormalised_last_hidden_state_gives_transformers_logprobs(llm, model):
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    emb = next(t for t in gguf.GGUFReader(model).tensors if t.name == "token_embd.weight")
    head = gguf.quants.dequantize(emb.data, emb.tensor_type).astype(np.float64)
    cases = json.loads((ROOT / "tests/data/reference/smollm2_greedy_hf.json").read_text())["results"]
    raw = [c for c in cases if c["kind"] == "raw"]
    outs = llm.embed([{"prompt_token_ids": c["prompt_ids"]} for c in raw],
                     PoolingParams(normalize=False), use_tqdm=False)
    for case, out in zip(raw, outs):
        logits = head @ np.asarray(out.outputs.embedding, dtype=np.float64)
        logprobs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        for t in case["steps"][0]["top5"]:
            assert abs(logprobs[t["id"]] - t["logprob"]) < QUANTISED_LOGPROB_TOL, (case["prompt"], t)


def test_mean_pooling_and_refusals(model):
    mean = LLM(model, kv_cache_memory="64MiB", max_model_len=256,
               pooler_config={"pooling_type": "MEAN"})
    try:
        m = mean.embed(TEXTS[0], use_tqdm=False)[0].outputs.embedding
        assert abs(norm(m) - 1) < 1e-5
        # Generation still works beside it.
        assert mean.generate("Hello", use_tqdm=False)[0].outputs[0].text
        with pytest.raises(ValueError, match="dimensions"):
            mean.embed("x", PoolingParams(dimensions=8), use_tqdm=False)
        with pytest.raises(TypeError, match="PoolingParams"):
            mean.embed("x", {"normalize": False}, use_tqdm=False)
    finally:
        del mean
    with pytest.raises(ValueError, match="CLS"):
        LLM(model, kv_cache_memory="64MiB", max_model_len=256, pooler_config={"pooling_type": "CLS"})


def test_num_cached_tokens_counts_prefix_cache_hits(llm):
    from minivllm import SamplingParams

    prompt = "The history of the city begins with a small settlement on the river bank. " * 4
    params = SamplingParams(max_tokens=1, temperature=0)
    first = llm.generate(prompt + "One", params, use_tqdm=False)[0]
    again = llm.generate(prompt + "Two", params, use_tqdm=False)[0]
    assert again.num_cached_tokens >= 32 and again.num_cached_tokens % 16 == 0
    assert again.num_cached_tokens > first.num_cached_tokens


def test_request_metrics_are_in_order(llm):
    import time

    from minivllm import RequestMetrics, SamplingParams

    before = time.time()
    out = llm.generate("Hello there", SamplingParams(max_tokens=5, temperature=0), use_tqdm=False)[0]
    after = time.time()
    m = out.metrics
    assert isinstance(m, RequestMetrics)
    assert before <= m.arrival_time <= m.first_scheduled_time <= m.first_token_time
    assert m.first_token_time <= m.last_token_time <= m.finished_time <= after
    assert m.time_in_queue >= 0


def test_a_request_behind_another_waits_in_the_queue(model):
    """With one sequence at a time, the second of two prompts starts once the first has
    finished, and its metrics say so: its time in the queue covers the first one's run."""
    from minivllm import LLM, SamplingParams

    one_at_a_time = LLM(model=model, max_num_seqs=1, max_model_len=1024, kv_cache_memory="64MiB")
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    first, second = (o.metrics for o in one_at_a_time.generate(
        ["Hello there", "Goodbye now"], params, use_tqdm=False))
    assert second.first_scheduled_time >= first.finished_time
    assert second.time_in_queue >= first.finished_time - second.arrival_time
    assert second.time_in_queue > first.time_in_queue


def test_engine_args_from_the_command_line_as_vllms_examples(model):
    import dataclasses

    from minivllm import LLM, EngineArgs, SamplingParams
    from minivllm.utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    parser.add_argument("--temperature", type=float, default=0.0)
    parser = EngineArgs.add_cli_args(parser)
    args = parser.parse_args(["--model", model, "--max-model-len", "256",
                              "--kv_cache_memory_bytes", str(64 << 20),
                              "--no-enable-prefix-caching", "--speculative-config",
                              '{"method": "ngram", "num_speculative_tokens": 2}'])
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.max_model_len == 256 and engine_args.enable_prefix_caching is False
    assert engine_args.speculative_config["method"] == "ngram"
    llm = LLM(**dataclasses.asdict(engine_args))
    try:
        out = llm.generate("Hello", SamplingParams(temperature=args.temperature, max_tokens=4),
                           use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 4
    finally:
        del llm
