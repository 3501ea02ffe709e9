#!/usr/bin/env python3
"""Replicas behind vllm-router: the prefix-cache hit rate of a multi-turn chat workload per
routing policy, against one replica serving it all (issue 45's figure).

Starts `--replicas` `minivllm serve` processes (one kernel thread each) with KV cache events,
then for each policy a `vllm-router` in front of them, and plays `--conversations` chats of
`--turns` turns: every turn sends the whole conversation so far, as chat clients do, so a
replica that served the conversation's last turn has all but the new message cached. The
hit rate is the share of prompt tokens found cached over the workload: the replies'
`usage.prompt_tokens_details.cached_tokens` over `usage.prompt_tokens`. Each policy starts
from fresh replicas; the one replica alone has as much KV cache as all of them together.

    .venv/bin/python scripts/router_bench.py --binary target/release/minivllm

Needs vllm-router in the venv (tests/python/requirements.txt pins it).
"""

import argparse
import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["rivers", "volcanoes", "chess openings", "bread baking", "comets", "violins",
          "tax law", "bees", "glaciers", "sailing", "origami", "jazz", "deserts", "clocks",
          "mushrooms", "bridges"]
QUESTIONS = ["Give me one surprising fact.", "Why does that happen?",
             "How would you explain it to a child?", "What is a common misconception?",
             "Summarise our chat in one sentence.", "What should I read next?"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc, what: str):
    """Until GET /health answers 200; exits if `proc` ends or a minute passes."""
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"{what} did not become healthy")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)


class Replica:
    def __init__(self, args, log_dir: Path, i: int, kv_mib: int):
        self.log = open(log_dir / f"replica{i}.log", "w+")
        config = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:0",
                  "replay_endpoint": "tcp://127.0.0.1:0"}
        self.proc = subprocess.Popen(
            [args.binary, "serve", "--model", args.model, "--served-model-name", "smol",
             "--port", "0", "--threads", "1", "--kv-cache-memory", f"{kv_mib}MiB",
             "--max-model-len", "2048", "--enable-prompt-tokens-details",
             "--kv-events-config", json.dumps(config)],
            stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 120
        while True:
            text = Path(self.log.name).read_text()
            m = re.search(r" on (http://[0-9.]+:[0-9]+)", text)
            e = re.search(r"KV cache events on (\S+), replay on (\S+)", text)
            if m and e:
                self.url, self.pub, self.replay = m.group(1), e.group(1), e.group(2)
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"replica {i} did not start:\n{text}")
            time.sleep(0.2)
        wait_healthy(self.url, self.proc, f"replica {i} ({self.log.name})")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def start_router(args, policy: str, replicas, log_dir: Path):
    port = free_port()
    cmd = [str(ROOT / ".venv/bin/vllm-router"), "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-port", str(free_port()), "--policy", policy, "--log-level", "debug",
           "--worker-urls", *[r.url for r in replicas]]
    if policy == "kv_aware":
        cmd += ["--kv-event-model", "smol"]
        for r in replicas:
            cmd += ["--kv-event-source", f"{r.url}={r.pub}",
                    "--kv-event-replay-source", f"{r.url}={r.replay}"]
    env = {**os.environ, "VLLM_ROUTER_TOKENIZER": str(ROOT / "tests/data/reference/smollm2-hf")}
    log = open(log_dir / f"router-{policy}.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, f"vllm-router ({policy}, {log.name})")
    time.sleep(1.0)  # its event subscribers connect after it answers
    return proc, url


def system_prompt(k: int) -> str:
    """A few hundred tokens of instructions, as assistants' system prompts run, each
    conversation's its own from the first token."""
    topic = TOPICS[k % len(TOPICS)]
    return (f"You are guide number {k}, an expert on {topic}. " + " ".join(
        f"Rule {i}: when asked about {topic}, be accurate, cite what is known, say what is "
        f"not, and keep the answer short and friendly." for i in range(1, 9)))


def play(url: str, args) -> tuple:
    """Plays the workload against `url`; returns (prompt tokens found cached, prompt tokens,
    wall time), the counts from the replies' `usage`."""
    convs = [[{"role": "system", "content": system_prompt(k)}] for k in range(args.conversations)]
    client = httpx.Client(timeout=300)
    counts = [0, 0]

    def turn(k: int, t: int):
        convs[k].append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
        r = client.post(f"{url}/v1/chat/completions", json={
            "model": "smol", "messages": convs[k], "max_tokens": args.max_tokens,
            "temperature": 0})
        r.raise_for_status()
        usage = r.json()["usage"]
        counts[0] += usage["prompt_tokens_details"]["cached_tokens"]
        counts[1] += usage["prompt_tokens"]
        convs[k].append({"role": "assistant",
                         "content": r.json()["choices"][0]["message"]["content"]})

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        for t in range(args.turns):
            list(pool.map(lambda k: turn(k, t), range(args.conversations)))
    return counts[0], counts[1], time.monotonic() - started


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default=str(ROOT / "target/release/minivllm"))
    p.add_argument("--model", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--conversations", type=int, default=32)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--kv-cache-mib", type=int, default=128,
                   help="KV cache per replica, in MiB (the one replica alone gets as much as "
                   "all of them together): small enough that a replica cannot keep every chat")
    p.add_argument("--policies", default="kv_aware,cache_aware,round_robin")
    args = p.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="router_bench."))
    rows = []
    for policy in ["one replica"] + args.policies.split(","):
        n = 1 if policy == "one replica" else args.replicas
        kv_mib = args.kv_cache_mib * (args.replicas if n == 1 else 1)
        replicas = [Replica(args, log_dir, i, kv_mib) for i in range(n)]
        router = None
        try:
            url = replicas[0].url
            if n > 1:
                router, url = start_router(args, policy, replicas, log_dir)
            hits, queries, wall = play(url, args)
            rows.append((policy, n, hits / queries if queries else 0.0, queries, wall))
            print(f"{policy:>12}: hit rate {rows[-1][2]:.1%} of {int(queries)} prompt tokens, "
                  f"{wall:.1f} s", flush=True)
        finally:
            if router:
                router.terminate()
                router.wait(timeout=30)
            for r in replicas:
                r.stop()
    print(f"\n{args.conversations} conversations x {args.turns} turns, {args.max_tokens} tokens "
          f"a reply, {args.concurrency} at a time, {args.kv_cache_mib} MiB of KV cache per "
          f"replica ({args.kv_cache_mib * args.replicas} MiB for the one alone; logs in "
          f"{log_dir})\n")
    print("| routing | replicas | prefix-cache hit rate | prompt tokens | wall time |")
    print("|---|---|---|---|---|")
    for policy, n, rate, queries, wall in rows:
        print(f"| {policy} | {n} | {rate:.1%} | {int(queries)} | {wall:.1f} s |")


if __name__ == "__main__":
    main()
