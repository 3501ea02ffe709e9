"""Replicas and a prefill/decode split across "hosts": network namespaces on one bridge,
each with its own address, as machines on one LAN (the tensor-parallel test's method, with a
bridge so that every host reaches every other and this one reaches them all). The router
runs here, in the test's own namespace. Needs root and iproute2; MINIVLLM_SKIP=netns opts
out.

- prefill on one host, decode on another, through `vllm-router --vllm-pd-disaggregation`:
  one server's tokens, the KV crossing the link;
- a multi-turn chat workload over three replicas: `kv_aware` on our KV events finds as much
  of it cached as one replica does alone, `round_robin` far less (issue 45's bar, small);
- a replica killed mid-run: the router sends its requests to the others, and every request
  is answered."""
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from pytest_support import ROOT, serve_logged, skip_or_fail, vllm_router
from test_pd_disaggregation import PROMPT, completion, kv_config, metric

sys.path.insert(0, str(ROOT / "scripts"))
import router_bench  # noqa: E402 - the benchmark's workload, played small here

SMOL_TOKENIZER = str(ROOT / "tests/data/reference/smollm2-hf")


class Hosts:
    """`n` network namespaces with a veth each on one bridge in this namespace, which has
    the subnet's .254. Removed when closed."""

    def __init__(self, n: int):
        pid = os.getpid()
        self.bridge = f"mvbr{pid % 100000}"
        net = f"10.{150 + pid % 50}.{(pid >> 6) % 256}"
        self.names = [f"mvh{pid % 100000}{i}" for i in range(n)]
        self.addrs = [f"{net}.{i + 1}" for i in range(n)]
        steps = [["link", "add", self.bridge, "type", "bridge"],
                 ["addr", "add", f"{net}.254/24", "dev", self.bridge],
                 ["link", "set", self.bridge, "up"]]
        for name, addr in zip(self.names, self.addrs):
            here, there = f"{name}h", f"{name}n"
            steps += [["netns", "add", name],
                      ["link", "add", here, "type", "veth", "peer", "name", there],
                      ["link", "set", here, "master", self.bridge],
                      ["link", "set", here, "up"],
                      ["link", "set", there, "netns", name],
                      ["-n", name, "addr", "add", f"{addr}/24", "dev", there],
                      ["-n", name, "link", "set", there, "up"],
                      ["-n", name, "link", "set", "lo", "up"]]
        for step in steps:
            out = subprocess.run(["ip", *step], capture_output=True, text=True)
            if out.returncode != 0:
                self.close()
                skip_or_fail("netns", f"network namespaces cannot be made here "
                             f"(ip {' '.join(step)}: {out.stderr.strip()})")

    def serve(self, i: int, binary: str, model: str, *flags: str):
        """`minivllm serve` on host `i`, bound to its address: (running, base url)."""
        running = serve_logged(["ip", "netns", "exec", self.names[i], binary, "serve",
                                "--model", model, "--served-model-name", "smol",
                                "--host", self.addrs[i], "--port", "0", "--threads", "1",
                                "--kv-cache-memory", "128MiB", "--max-model-len", "1024", *flags])
        url, logs = next(running)
        return running, url, logs

    def crash(self, i: int):
        """Kills every process of host `i` outright, as a machine that fails."""
        pids = subprocess.run(["ip", "netns", "pids", self.names[i]], capture_output=True,
                              text=True, check=True).stdout.split()
        assert pids, f"nothing runs on host {i}"
        subprocess.run(["kill", "-9", *pids], check=True)

    def rx_bytes(self, i: int) -> int:
        name = self.names[i]
        out = subprocess.run(["ip", "netns", "exec", name, "cat",
                              f"/sys/class/net/{name}n/statistics/rx_bytes"],
                             capture_output=True, text=True, check=True)
        return int(out.stdout)

    def close(self):
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@pytest.fixture
def hosts():
    made = []

    def make(n: int) -> Hosts:
        made.append(Hosts(n))
        return made[-1]

    yield make
    for h in made:
        h.close()


def test_prefill_and_decode_on_two_hosts(hosts, binary: str, model: str):
    h = hosts(2)
    prefill = h.serve(0, binary, model, "--kv-transfer-config", json.dumps(
        {"kv_connector": "TcpConnector", "kv_role": "kv_producer", "kv_port": 0,
         "kv_connector_extra_config": {"kv_ip": h.addrs[0]}}))
    decode = h.serve(1, binary, model, "--kv-transfer-config", kv_config("kv_consumer"))
    one = h.serve(1, binary, model)
    try:
        with vllm_router("--vllm-pd-disaggregation", "--prefill", prefill[1],
                         "--decode", decode[1]) as (base, logs):
            body = {"model": "smol", "prompt": PROMPT * 4, "max_tokens": 16, "temperature": 0}
            received = h.rx_bytes(1)
            assert completion(base, body) == completion(one[1], body), logs()
            # The decode host took the prompt's KV over the link: 30 layers' keys and values
            # in f16 are about 23 kB a token.
            pulled = metric(decode[1], "vllm:external_prefix_cache_hits_total")
            assert pulled > 100, pulled
            assert h.rx_bytes(1) - received > pulled * 20_000
    finally:
        for running, *_ in (prefill, decode, one):
            running.close()


def replicas(h: Hosts, binary: str, model: str, n: int):
    events = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://*:0",
                         "replay_endpoint": "tcp://*:0"})
    out = []
    for i in range(n):
        running, url, logs = h.serve(i, binary, model, "--kv-events-config", events,
                                     "--enable-prompt-tokens-details")
        line = next(l for l in logs().splitlines() if l.startswith("KV cache events on "))
        pub, replay = line.removeprefix("KV cache events on ").split(", replay on ")
        # Bound on every interface: the router reaches them at the host's address.
        at = lambda e: e.replace("*", h.addrs[i]).replace("0.0.0.0", h.addrs[i])  # noqa: E731
        out.append((running, url, at(pub), at(replay)))
    return out


def test_kv_aware_routing_over_three_hosts_caches_as_one_replica(hosts, binary: str, model: str):
    h = hosts(3)
    # Ten chats, not a multiple of three: round-robin then sends each turn of a chat to
    # another replica than the last.
    workload = type("Workload", (), {"conversations": 10, "turns": 3, "max_tokens": 8,
                                     "concurrency": 3})
    rates = {}
    for policy in ["one replica", "kv_aware", "round_robin"]:
        started = replicas(h, binary, model, 1 if policy == "one replica" else 3)
        try:
            if policy == "one replica":
                hits, queries, _ = router_bench.play(started[0][1], workload)
            else:
                args = ["--policy", policy, "--worker-urls", *[r[1] for r in started]]
                if policy == "kv_aware":
                    args += ["--kv-event-model", "smol"]
                    for _, url, pub, replay in started:
                        args += ["--kv-event-source", f"{url}={pub}",
                                 "--kv-event-replay-source", f"{url}={replay}"]
                env = {**os.environ, "VLLM_ROUTER_TOKENIZER": SMOL_TOKENIZER}
                with vllm_router(*args, env=env) as (base, _):
                    time.sleep(1.0)  # its event subscribers connect after it answers
                    hits, queries, _ = router_bench.play(base, workload)
            rates[policy] = hits / queries
        finally:
            for running, *_ in started:
                running.close()
    print(f"prefix-cache hit rates: {rates}")
    assert rates["kv_aware"] >= rates["one replica"] - 0.05, rates
    assert rates["round_robin"] < rates["kv_aware"] - 0.2, rates


def test_a_replica_killed_mid_run_leaves_every_request_answered(hosts, binary: str, model: str):
    h = hosts(3)
    started = [h.serve(i, binary, model) for i in range(3)]
    try:
        with vllm_router("--policy", "round_robin", "--worker-urls",
                         *[s[1] for s in started]) as (base, logs):
            def ask(k: int):
                r = httpx.post(f"{base}/v1/completions", timeout=120, json={
                    "model": "smol", "prompt": f"Request {k}: tell me about rivers.",
                    "max_tokens": 32, "temperature": 0})
                return r.status_code, r.text

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                pending = [pool.submit(ask, k) for k in range(24)]
                while sum(f.done() for f in pending) < 4:
                    time.sleep(0.05)
                h.crash(1)
                answers = [f.result() for f in pending]
            failed = [a for a in answers if a[0] != 200]
            assert not failed, (failed[:3], logs())
            # The others still answer once the router knows the replica is gone.
            assert all(ask(100 + k)[0] == 200 for k in range(6)), logs()
    finally:
        for running, *_ in started:
            running.close()
