"""Prefill/decode disaggregation through `vllm-router --vllm-pd-disaggregation` (from PyPI):
a `kv_producer` server prefills each request (one token), a `kv_consumer` server pulls its
prompt KV over TCP and decodes. The tokens must be one server's, greedy and seeded, chat and
completions, streamed or not; the decode server's metrics show it computed no prompt."""
import json
import subprocess

import httpx

from pytest_support import serve_logged, vllm_router

PROMPT = ("The history of the city begins with a small settlement on the river bank, where "
          "fishermen and traders met to exchange goods. Over the centuries the village grew")


def start(binary: str, model: str, *flags: str):
    running = serve_logged([binary, "serve", "--model", model, "--served-model-name", "smol",
                            "--port", "0", "--threads", "1", "--kv-cache-memory", "64MiB",
                            "--max-model-len", "512", *flags])
    url, _ = next(running)
    return running, url


def kv_config(role: str) -> str:
    return json.dumps({"kv_connector": "TcpConnector", "kv_role": role, "kv_port": 0})


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return float(next(l for l in text.splitlines() if l.startswith(name)).split()[-1])


def completion(base: str, body: dict) -> str:
    """The text of a completion or chat completion, streamed or not."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    if not body.get("stream"):
        r = httpx.post(base + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        return c["message"]["content"] if "message" in c else c["text"]
    text = ""
    with httpx.stream("POST", base + path, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    text += c.get("text") or c.get("delta", {}).get("content") or ""
    return text


def test_vllm_router_splits_prefill_and_decode_with_one_servers_tokens(binary: str, model: str):
    one, one_url = start(binary, model)
    prefill, p_url = start(binary, model, "--kv-transfer-config", kv_config("kv_producer"))
    decode, d_url = start(binary, model, "--kv-transfer-config", kv_config("kv_consumer"))
    try:
        with vllm_router("--vllm-pd-disaggregation", "--prefill", p_url,
                         "--decode", d_url) as (base, logs):
            chat = {"model": "smol", "messages": [{"role": "user", "content": PROMPT}],
                    "max_tokens": 24, "temperature": 0}
            # Each prompt differs from the others within its first block, so the decode
            # server's prefix cache never holds what a pull should bring.
            again = [{"role": "user", "content": "Tell me more. " + PROMPT}]
            bodies = [
                chat,
                {**chat, "messages": again, "stream": True, "temperature": 0.8, "seed": 11},
                {"model": "smol", "prompt": PROMPT, "max_tokens": 24, "temperature": 0},
                {"model": "smol", "prompt": "In short: " + PROMPT, "max_tokens": 24,
                 "temperature": 0.8, "seed": 5, "stream": True},
            ]
            names = ["vllm:external_prefix_cache_hits_total", "vllm:prefix_cache_hits_total",
                     "vllm:prompt_tokens_total"]
            for body in bodies:
                before = [metric(d_url, n) for n in names]
                want = completion(one_url, body)
                got = completion(base, body)
                assert got == want, (body, logs())
                # The decode server ran the prompt's last token only: the rest was pulled,
                # or found in its prefix cache (the chat template's first block).
                pulled, hits, prompt = (metric(d_url, n) - b for n, b in zip(names, before))
                assert pulled > 0 and pulled + hits == prompt - 1, (body, pulled, hits, prompt)
            # The prefill server generated one token per request, the decode server the rest.
            assert metric(p_url, "vllm:generation_tokens_total") == len(bodies)
    finally:
        for running in (one, prefill, decode):
            running.close()


def test_prefill_answers_say_where_the_kv_waits_and_it_is_pulled_once(binary: str, model: str):
    prefill, p_url = start(binary, model, "--kv-transfer-config", kv_config("kv_both"))
    decode, d_url = start(binary, model, "--kv-transfer-config", kv_config("kv_consumer"),
                          "--enable-prompt-tokens-details")
    try:
        body = {"model": "smol", "prompt": PROMPT, "max_tokens": 1, "temperature": 0,
                "kv_transfer_params": {"do_remote_decode": True}}
        r = httpx.post(f"{p_url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        kv = r.json()["kv_transfer_params"]
        assert kv["do_remote_prefill"] and not kv["do_remote_decode"]
        assert kv["remote_host"] == "127.0.0.1" and kv["remote_port"] > 0 and kv["tp_size"] == 1
        body = {**body, "max_tokens": 8, "kv_transfer_params": kv}
        r = httpx.post(f"{d_url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        prompt_tokens = r.json()["usage"]["prompt_tokens"]
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_tokens - 1
        again = httpx.post(f"{d_url}/v1/completions", json=body, timeout=60)
        assert again.status_code == 502 and "no KV" in again.text, again.text
        # A server without the role refuses the field, naming it.
        r = httpx.post(f"{d_url}/v1/completions", timeout=60, json={
            **body, "kv_transfer_params": {"do_remote_decode": True}})
        assert r.status_code == 400 and "kv_producer" in r.text, r.text
    finally:
        prefill.close()
        decode.close()


def test_a_bad_kv_transfer_config_stops_the_start_naming_it(binary: str, model: str):
    r = subprocess.run([binary, "serve", "--model", model, "--port", "0", "--kv-transfer-config",
                        json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "TcpConnector" in r.stderr, r.stderr
