"""A Mixture-of-Experts model through every entry point: the `minivllm` package, the command
line and the server give the same greedy tokens, and a decode step reads only the experts
its token chose.

The models are `scripts/make_moe_bench_gguf.py --shape tiny`, a 2-layer Qwen3-MoE with 8
experts (top 2) in llama.cpp's Q4_K_M formats, and `--shape gpt-oss-tiny`, gpt-oss's layer
(sinks, biases, a sliding layer, YaRN) with MXFP4 experts, both with random weights and the
test model's tokenizer and chat template, written for the session (no real MoE file reaches
this machine; the families are checked against transformers in the Rust tests).
"""

import contextlib
import json
import subprocess
import sys

import gguf
import openai
import pytest

from minivllm import LLM, SamplingParams

from conftest import ENGINE
from pytest_support import ROOT, serve

sys.path.insert(0, str(ROOT / "scripts"))
import make_moe_bench_gguf  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
MAX_TOKENS = 12


@pytest.fixture(scope="module", params=["tiny", "gpt-oss-tiny"])
def moe_model(request, tmp_path_factory, model: str) -> str:
    out = tmp_path_factory.mktemp("moe") / f"{request.param}.gguf"
    return str(make_moe_bench_gguf.write(request.param, None, model, out))


def cli_json(binary, moe_model):
    with_prompts = [a for p in PROMPTS for a in ("--prompt", p)]
    cmd = [
        binary, "generate", "--model", moe_model, "--json", "--temperature", "0",
        "--max-tokens", str(MAX_TOKENS), "--max-model-len", str(ENGINE["max_model_len"]),
        "--kv-cache-memory", ENGINE["kv_cache_memory"], *with_prompts,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_python_the_cli_and_the_server_give_the_same_tokens(binary, moe_model):
    llm = LLM(model=moe_model, **ENGINE)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    outputs = llm.generate(PROMPTS, greedy, use_tqdm=False)
    expected = cli_json(binary, moe_model)
    for out, want in zip(outputs, expected, strict=True):
        assert out.outputs[0].token_ids == want["outputs"][0]["token_ids"]
        assert out.outputs[0].text == want["outputs"][0]["text"]
        assert len(out.outputs[0].token_ids) == MAX_TOKENS
    del llm

    cmd = [
        binary, "serve", "--model", moe_model, "--served-model-name", "moe", "--port", "0",
        "--max-model-len", str(ENGINE["max_model_len"]),
        "--kv-cache-memory", ENGINE["kv_cache_memory"],
    ]
    with contextlib.closing(serve(cmd)) as running:
        url = next(running)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for prompt, out in zip(PROMPTS, outputs):
            kw = dict(model="moe", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
            whole = client.completions.create(**kw)
            assert whole.choices[0].text == out.outputs[0].text
            streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))
            assert streamed == whole.choices[0].text
        chat = client.chat.completions.create(
            model="moe", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
        )
        assert chat.choices[0].finish_reason == "length"
        assert chat.usage.completion_tokens == 8


def test_a_decode_step_reads_only_the_chosen_experts(binary, moe_model):
    """`bench latency` counts each layer's router and `k` of its experts, not all of them:
    the file's expert tensors times k / experts, plus every other matrix but the token
    embeddings (read a row per token). Our in-memory layout of the blocks differs from the
    file's by well under 1 %, but for MXFP4's, held with an f16 scale where the file has an
    E8M0 byte (18 bytes a block instead of 17)."""
    reader = gguf.GGUFReader(moe_model)
    arch = reader.fields["general.architecture"].contents()
    k = reader.fields[f"{arch}.expert_used_count"].contents()
    experts = reader.fields[f"{arch}.expert_count"].contents()
    dense = routed = 0
    for t in reader.tensors:
        if t.name == "token_embd.weight" or len(t.shape) == 1 or t.name.endswith(".bias"):
            continue  # read a row per token; norms and biases are not weight matrices
        nbytes = int(t.n_bytes)
        if t.tensor_type == gguf.GGMLQuantizationType.MXFP4:
            nbytes = nbytes * 18 // 17
        if "_exps" in t.name:
            routed += nbytes
        else:
            dense += nbytes
    want = dense + routed * k / experts
    cmd = [
        binary, "bench", "latency", "--model", moe_model, "--input-len", "8",
        "--output-len", "4", "--num-iters", "1", "--json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)["weight_bytes_per_step"]
    assert abs(got - want) / want < 0.01, (got, want, dense + routed)
