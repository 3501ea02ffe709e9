#!/usr/bin/env bash
# Step time and communication share at several tensor-parallel sizes, side by side in one
# run, and each rank's peak memory. Needs a release build with MPI:
#   cargo build --release -p minivllm-cli --features mpi
#   scripts/bench_tensor_parallel.sh [MODEL] [SIZES] [extra bench latency flags...]
# SIZES is a space-separated list (default "1 3" for SmolLM2, whose 9 heads split 3 ways);
# the cores are shared out: each of N ranks gets cores/N threads (at least 1).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
SIZES=${2:-1 3}
shift $(( $# > 2 ? 2 : $# ))
BIN=${MINIVLLM:-target/release/minivllm}
CORES=$(nproc)
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $CORES cores; model $MODEL"
for n in $SIZES; do
  threads=$(( CORES / n > 0 ? CORES / n : 1 ))
  log=$(mktemp)
  echo "== tensor parallel $n ($n ranks x $threads threads)"
  # One rank runs alone: mpirun would bind it to one core, whatever its threads.
  launcher=(mpirun --allow-run-as-root --oversubscribe -n "$n")
  [ "$n" -gt 1 ] || launcher=()
  "${launcher[@]}" /usr/bin/time -f "rank peak RSS %M KiB" \
    "$BIN" bench latency --model "$MODEL" --tensor-parallel-size "$n" --threads "$threads" \
    --num-iters 3 --num-iters-warmup 1 "$@" 2>"$log"
  grep -h "peak RSS" "$log" | sort | uniq -c
  rm -f "$log"
done
