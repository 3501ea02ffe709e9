"""`POST /v1/embeddings` through OpenAI's client: vectors (float and base64) pooled from the
final hidden states, checked against Hugging Face transformers' output for the same model:
the last token's unnormalised hidden state, times the model's (tied) embedding matrix
dequantised from the GGUF by llama.cpp's own `gguf` package, gives the next-token
log-probabilities transformers computed (tests/data/reference/smollm2_greedy_hf.json).
"""

import json

import numpy as np
import openai
import pytest

from conftest import SERVED_MODEL_NAME as MODEL, serve
from pytest_support import QUANTISED_LOGPROB_TOL, ROOT

REFERENCE = ROOT / "tests/data/reference/smollm2_greedy_hf.json"
TEXTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


def vector(item) -> np.ndarray:
    return np.asarray(item.embedding, dtype=np.float32)


def test_vectors_whole_batched_and_in_both_encodings(client):
    alone = [vector(client.embeddings.create(model=MODEL, input=t, encoding_format="float").data[0])
             for t in TEXTS]
    for v in alone:
        assert v.shape == (576,) and abs(np.linalg.norm(v) - 1) < 1e-5
    batch = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1, 2]
    for d, v in zip(batch.data, alone):
        assert np.array_equal(vector(d), v)
    # The client's default asks for base64 and decodes it with numpy: the same bits.
    b64 = client.embeddings.create(model=MODEL, input=TEXTS)
    for d, v in zip(b64.data, alone):
        assert np.array_equal(vector(d), v)
    tokens = sum(client.embeddings.create(model=MODEL, input=t).usage.prompt_tokens for t in TEXTS)
    assert batch.usage.prompt_tokens == batch.usage.total_tokens == tokens
    assert batch.model == MODEL and batch.object == "list"


def test_the_last_hidden_state_gives_transformers_next_token_logprobs(client, model):
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(model)
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    head = gguf.quants.dequantize(emb.data, emb.tensor_type)  # [vocab, hidden]
    cases = [c for c in json.loads(REFERENCE.read_text())["results"] if c["kind"] == "raw"]
    assert cases
    for case in cases:
        r = client.embeddings.create(model=MODEL, input=[case["prompt_ids"]],
                                     encoding_format="float", extra_body={"normalize": False})
        h = vector(r.data[0]).astype(np.float64)
        logits = head.astype(np.float64) @ h
        logprobs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        step = case["steps"][0]
        for t in step["top5"]:
            got = logprobs[t["id"]]
            assert abs(got - t["logprob"]) < QUANTISED_LOGPROB_TOL, (case["prompt"], t, got)
        if step["top1_top2_logit_margin"] > 0.5:
            assert int(np.argmax(logits)) == step["chosen_id"], case["prompt"]


@pytest.mark.parametrize("body, param", [
    ({"input": "hi", "dimensions": 64}, "dimensions"),
    ({"input": []}, "input"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ({"input": [[10 ** 9]]}, None),
])
def test_bad_requests_get_a_400(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL, **body)
    if param:
        assert e.value.param == param, e.value.body


@pytest.fixture(scope="module")
def mean_server(binary: str, model: str):
    server = serve([
        binary, "serve", "--model", model, "--served-model-name", MODEL, "--port", "0",
        "--kv-cache-memory", "64MiB", "--max-model-len", "512",
        "--pooler-config", '{"pooling_type": "MEAN", "normalize": true}',
    ])
    url = next(server)
    yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    server.close()


def test_mean_pooling_from_the_pooler_config(mean_server, client):
    mean = client_vectors(mean_server)
    last = client_vectors(client)
    for m, l in zip(mean, last):
        assert abs(np.linalg.norm(m) - 1) < 1e-5 and not np.allclose(m, l, atol=1e-3)
    # Batched or alone, the same bits.
    alone = [vector(mean_server.embeddings.create(model=MODEL, input=t).data[0]) for t in TEXTS]
    assert all(np.array_equal(a, m) for a, m in zip(alone, mean))
    # Beside generation.
    mean_server.completions.create(model=MODEL, prompt="Hello", max_tokens=5)
    again = client_vectors(mean_server)
    assert all(np.array_equal(a, m) for a, m in zip(again, mean))


def client_vectors(c):
    return [vector(d) for d in c.embeddings.create(model=MODEL, input=TEXTS).data]
