#!/usr/bin/env python3
"""What calling the engine from Python costs: `bench throughput`'s workload through
`minivllm.LLM.generate` and through the `minivllm` binary, alternated in one run.

    pip install .   # the release build of the package
    cargo build --release -p minivllm-cli
    python scripts/bench_python.py --binary target/release/minivllm --rounds 3

Both load the same model with the same engine defaults (a fresh engine per round, so that no
prefix cache carries over) and time only the generation of
`--num-prompts` random prompts of `--input-len` tokens, `--output-len` tokens each (greedy,
ignore_eos), as `minivllm bench throughput` does; the prompts are the binary's own (the same
generator). Prints each round and the ratio of the medians.
"""

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time

from minivllm import LLM, SamplingParams


def random_prompts(n: int, length: int, vocab: int):
    """`bench.rs::random_prompts`: the same 64-bit LCG, so both sides run the same tokens."""
    seed = 0x9E3779B97F4A7C15
    mask = (1 << 64) - 1
    prompts = []
    for _ in range(n):
        row = []
        for _ in range(length):
            seed = (seed * 6364136223846793005 + 1442695040888963407) & mask
            row.append((seed >> 33) % vocab)
        prompts.append(row)
    return prompts


def cli_round(args) -> float:
    cmd = [
        args.binary, "bench", "throughput", "--model", args.model, "--json",
        "--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len),
        "--output-len", str(args.output_len),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    return report["output_tokens_per_second"], report


def python_round(llm: LLM, prompts, args) -> float:
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=args.output_len)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    secs = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outs) / secs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default="target/release/minivllm")
    p.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    cli, py = [], []
    env = None
    for r in range(args.rounds):
        tps, report = cli_round(args)
        cli.append(tps)
        env = {k: report[k] for k in ("cpu", "isa", "threads", "peak_rss_mb") if k in report}
        # A fresh engine each round, as the binary's: a reused one would find the prompts
        # in its prefix cache.
        llm = LLM(model=args.model)
        prompts = random_prompts(args.num_prompts, args.input_len, llm.get_tokenizer().vocab_size)
        py.append(python_round(llm, prompts, args))
        del llm
        print(f"round {r + 1}: binary {cli[-1]:.1f} output tok/s, Python {py[-1]:.1f} output tok/s", flush=True)
    c, q = statistics.median(cli), statistics.median(py)
    print(f"median: binary {c:.1f}, Python {q:.1f} output tok/s; Python/binary = {q / c:.3f} "
          f"({(1 - q / c) * 100:+.1f} % cost)")
    # ru_maxrss is in KiB on Linux.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6
    print(f"Python {platform.python_version()}, its peak RSS {rss:.0f} MB; binary: {env or ''}")


if __name__ == "__main__":
    sys.exit(main())
