"""vLLM's KV cache events from `minivllm serve --kv-events-config`, read as vLLM's own
subscribers read them: a ZeroMQ SUB socket, payloads decoded by msgspec into vLLM 0.32's
schema (`vllm/distributed/kv_events.py`, written out below), block hashes checked against
vLLM's `sha256_cbor` chain computed here from its definition, replay through a DEALER as
routers ask for it; and `vllm-router`'s `kv_aware` policy (from PyPI) sending a prompt to the
replica whose cache holds it, learnt from these events alone."""

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import List, Optional, Union

import cbor2
import httpx
import msgspec
import pytest
import zmq

from pytest_support import ROOT, serve_logged, vllm_router

BLOCK = 16


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: List[Union[bytes, int]]
    parent_block_hash: Union[bytes, int, None]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list] = None
    group_idx: Optional[int] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: List[Union[bytes, int]]
    medium: Optional[str]
    group_idx: Optional[int] = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: List[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
# vLLM: NONE_HASH = sha256_cbor(PYTHONHASHSEED or "vllm-none-hash").
NONE_HASH = hashlib.sha256(
    cbor2.dumps(os.environ.get("PYTHONHASHSEED", "vllm-none-hash"), canonical=True)).digest()


def block_hash(parent: Optional[bytes], tokens) -> bytes:
    """vLLM's hash_block_tokens(sha256_cbor, parent, tokens)."""
    return hashlib.sha256(cbor2.dumps(
        (parent or NONE_HASH, tuple(tokens), None), canonical=True)).digest()


def events_config(**extra) -> str:
    return json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:0",
                       "replay_endpoint": "tcp://127.0.0.1:0", **extra})


def start(binary: str, model: str, *flags: str):
    """A server with KV events: (running generator, base url, PUB address, replay address)."""
    running = serve_logged([binary, "serve", "--model", model, "--served-model-name", "smol",
                            "--port", "0", *flags])
    url, logs = next(running)
    line = next(l for l in logs().splitlines() if l.startswith("KV cache events on "))
    pub, replay = line.removeprefix("KV cache events on ").split(", replay on ")
    return running, url, pub, replay


def drain(sock, quiet_s: float = 1.5) -> list:
    """Every message until none comes for `quiet_s`."""
    out = []
    while sock.poll(int(quiet_s * 1000)):
        out.append(sock.recv_multipart())
    return out


def complete(url: str, prompt, max_tokens: int = 1) -> dict:
    r = httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": "smol", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_events_are_vllms(binary: str, model: str):
    # 4 MiB holds 11 blocks of this model: enough for a prompt, and small enough to evict.
    running, url, pub, replay = start(
        binary, model, "--kv-cache-memory", "4MiB", "--max-model-len", "128",
        "--kv-events-config", events_config(topic="kv"))
    ctx = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.connect(pub)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        time.sleep(0.5)  # a SUB socket receives only once its subscription has arrived

        a = list(range(1000, 1040))  # two full blocks and 8 tokens
        b = a[:32] + list(range(2000, 2020))  # shares a's blocks, then one of its own
        complete(url, a)
        complete(url, b)
        live = drain(sub)
        assert [m[0] for m in live] == [b"kv"] * len(live)
        assert [int.from_bytes(m[1], "big") for m in live] == list(range(len(live)))
        batches = [DECODER.decode(m[2]) for m in live]
        assert all(x.data_parallel_rank == 0 and abs(x.ts - time.time()) < 60 for x in batches)
        events = [e for x in batches for e in x.events]
        h0 = block_hash(None, a[:16])
        h1 = block_hash(h0, a[16:32])
        h2 = block_hash(h1, b[32:48])
        assert events == [
            BlockStored(block_hashes=[h0, h1], parent_block_hash=None, token_ids=a[:32],
                        block_size=BLOCK, lora_id=None, medium="GPU", lora_name=None,
                        extra_keys=[None, None], group_idx=0),
            BlockStored(block_hashes=[h2], parent_block_hash=h1, token_ids=b[32:48],
                        block_size=BLOCK, lora_id=None, medium="GPU", lora_name=None,
                        extra_keys=[None], group_idx=0),
        ]

        # Prompts of 100 new tokens take 7 blocks each: a's and b's must make room.
        for k in range(3):
            complete(url, [3000 + 200 * k + i for i in range(100)])
        later = [DECODER.decode(m[2]) for m in drain(sub)]
        stored = {h for x in batches + later for e in x.events if isinstance(e, BlockStored)
                  for h in e.block_hashes}
        removed = [h for x in later for e in x.events if isinstance(e, BlockRemoved)
                   for h in e.block_hashes]
        assert {h0, h1, h2} <= set(removed), "a's and b's blocks were evicted"
        assert set(removed) <= stored and len(removed) == len(set(removed))
        assert all(e.group_idx == 0 and e.medium == "GPU" for x in later for e in x.events)

        # Replay, as routers ask after a gap: every batch from seq 1 on, then the end mark.
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay)
        dealer.send_multipart([b"", b"\x01"])  # any length, as vLLM's int.from_bytes reads it
        replayed = []
        while True:
            assert dealer.poll(5000), "no replay answer"
            frames = dealer.recv_multipart()
            assert len(frames) == 4 and frames[0] == b""
            if frames[2] == (-1).to_bytes(8, "big", signed=True):
                assert frames[1] == frames[3] == b""
                break
            replayed.append(frames[1:])
        assert replayed[0] == live[1] and len(replayed) == len(live) - 1 + len(later)
    finally:
        ctx.destroy(linger=0)
        running.close()


def test_a_bad_config_stops_the_start(binary: str, model: str):
    for config, says in [('{"endpoint": "ipc:///tmp/kv"}', "tcp://HOST:PORT"),
                         ('{"enable_kv_events": true}', "unknown field")]:
        p = subprocess.run([binary, "serve", "--model", model, "--kv-events-config", config],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and "--kv-events-config" in p.stderr and says in p.stderr


def prefix_queries(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return float(next(l for l in text.splitlines()
                      if l.startswith("vllm:prefix_cache_queries_total")).split()[-1])


def test_vllm_router_sends_a_prompt_where_our_events_say_it_is_cached(binary: str, model: str):
    replicas = [start(binary, model, "--threads", "1", "--kv-cache-memory", "64MiB",
                      "--max-model-len", "512", "--kv-events-config", events_config())
                for _ in range(2)]
    urls = [r[1] for r in replicas]
    args = ["--policy", "kv_aware", "--worker-urls", *urls, "--kv-event-model", "smol",
            "--log-level", "debug"]
    for _, url, pub, replay in replicas:
        args += ["--kv-event-source", f"{url}={pub}", "--kv-event-replay-source", f"{url}={replay}"]
    # The router tokenises prompts itself: SmolLM2's tokenizer.json, as the GGUF's.
    env = {**os.environ, "VLLM_ROUTER_TOKENIZER": str(ROOT / "tests/data/reference/smollm2-hf")}
    try:
        with vllm_router(*args, env=env) as (base, logs):
            time.sleep(1.0)  # its subscribers connect after it answers
            # One replica alone computes each prompt: only its events tell the router. Each
            # replica in turn, so that no fixed choice (a blind router takes the first of
            # two idle workers) can pass.
            for cached_on, text in [(1, "Lanterns glow in the harbour as boats return. "),
                                    (0, "Snow covers the pine forest under a pale moon. ")]:
                prompt = text * 6
                complete(urls[cached_on], prompt)
                time.sleep(0.5)
                before = [prefix_queries(u) for u in urls]
                for _ in range(3):
                    complete(base, prompt)
                after = [prefix_queries(u) for u in urls]
                other = 1 - cached_on
                assert after[other] == before[other] and after[cached_on] > before[cached_on], \
                    logs()
    finally:
        for running, *_ in replicas:
            running.close()
