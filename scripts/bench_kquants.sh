#!/usr/bin/env bash
# Side by side on K-quant files made by llama.cpp's own llama-quantize from the F32 GGUF of the
# test model, so both engines read the same bytes: llama-bench (pp512, tg128),
# llama-batched-bench (64 x 128+128), then minivllm bench latency / throughput on each file.
# Needs the peer build (../shared/benchmarks/llamacpp-peer.sh build, which also makes the F32
# file) and `cargo build --release`. Usage: scripts/bench_kquants.sh [Q4_K_M Q5_K_M Q6_K ...]
set -euo pipefail
cd "$(dirname "$0")/.."
PEER=${PEER_DIR:-/tmp/llamacpp-peer}
B=$(dirname "$(find "$PEER" -name llama-bench -type f | head -1)")
F32=$PEER/models/SmolLM2-135M-Instruct.F32.gguf
M=target/release/minivllm
OUT=${OUT:-/tmp/kq}
mkdir -p "$OUT"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), threads 2"
[ $# -gt 0 ] || set -- Q4_K_M Q5_K_M Q6_K
for t in "$@"; do
  m=$OUT/smol-$t.gguf
  [ -s "$m" ] || LD_LIBRARY_PATH=$B "$B/llama-quantize" "$F32" "$m" "$t" 2 >/dev/null 2>&1
  echo "=== $t ($(stat -c %s "$m") bytes)"
  LD_LIBRARY_PATH=$B "$B/llama-bench" -m "$m" -t 2 -p 512 -n 128 -r 3 -o md 2>/dev/null | grep -E "pp512|tg128"
  LD_LIBRARY_PATH=$B "$B/llama-batched-bench" -m "$m" -t 2 -c 17000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 64 \
    2>/dev/null | grep -E '^\|' | tail -1
  "$M" bench latency --model "$m" --threads 2 --input-len 512 --output-len 1 2>&1 | grep -E "^(prefill|weights|ISA)"
  "$M" bench latency --model "$m" --threads 2 --input-len 16 --output-len 128 2>&1 | grep -E "^decode"
  "$M" bench throughput --model "$m" --threads 2 --num-prompts 64 --input-len 128 --output-len 128 2>&1 | grep -E "output tokens/s"
done
