#!/usr/bin/env bash
# Prefill/decode disaggregation against one server at the same load, as `vllm bench serve`
# reports it (issue 45): one `minivllm serve` with both cores, then a prefill server and a
# decode server with one core each behind `vllm-router --vllm-pd-disaggregation`.
#
#   scripts/pd_bench.sh [MODEL.gguf]      (after cargo build --release -p minivllm-cli)
#
# Needs vllm-router in .venv (tests/python/requirements.txt) and vLLM's `vllm bench serve`
# (PEER_DIR's venv from ../shared/benchmarks/vllm-peer.sh install, with the model's HF
# folder it converts: HF=). INPUT_LEN, OUTPUT_LEN, PROMPTS, CONCURRENCY set the load.
set -euo pipefail
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PEER_DIR=${PEER_DIR:-/tmp/vllm-peer}
HF=${HF:-$(ls -d "$PEER_DIR"/hf/"$(basename "$MODEL" .gguf)"-* | head -1)}
INPUT_LEN=${INPUT_LEN:-512} OUTPUT_LEN=${OUTPUT_LEN:-128} PROMPTS=${PROMPTS:-32} CONCURRENCY=${CONCURRENCY:-8}
MV=target/release/minivllm
OUT=$(mktemp -d /tmp/pd_bench.XXXXXX)
client() {
  "$PEER_DIR/venv/bin/vllm" bench serve --backend openai --endpoint /v1/completions --tokenizer "$HF" \
    --dataset-name random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" \
    --num-prompts "$PROMPTS" --max-concurrency "$CONCURRENCY" --ignore-eos --seed 1 --model m \
    --base-url "$1" >"$OUT/$2.txt" 2>&1
}
wait_up() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.2; done; return 1; }
serve() { "$MV" serve --model "$MODEL" --served-model-name m --port "$1" "${@:2}" >"$OUT/serve$1.log" 2>&1 & }
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

serve 18901 --threads 2; pids+=($!); wait_up 18901
client http://127.0.0.1:18901 one
kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true; pids=()

serve 18902 --threads 1 --kv-transfer-config '{"kv_connector": "TcpConnector", "kv_role": "kv_producer", "kv_port": 0}'; pids+=($!)
serve 18903 --threads 1 --kv-transfer-config '{"kv_connector": "TcpConnector", "kv_role": "kv_consumer"}'; pids+=($!)
wait_up 18902; wait_up 18903
.venv/bin/vllm-router --host 127.0.0.1 --port 18904 --prometheus-port 18905 --vllm-pd-disaggregation \
  --prefill http://127.0.0.1:18902 --decode http://127.0.0.1:18903 >"$OUT/router.log" 2>&1 & pids+=($!)
wait_up 18904
client http://127.0.0.1:18904 pd

echo "$PROMPTS x ($INPUT_LEN in, $OUTPUT_LEN out), concurrency $CONCURRENCY, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs); logs in $OUT"
echo "| setup | output tok/s | mean TTFT ms | median TTFT ms | mean TPOT ms | median TPOT ms |"
echo "|---|---|---|---|---|---|"
for run in one pd; do
  f=$OUT/$run.txt
  get() { grep -m1 "$1" "$f" | awk '{print $NF}'; }
  name=$([ $run = one ] && echo "one server, 2 threads" || echo "prefill + decode servers, 1 thread each, vllm-router")
  echo "| $name | $(get 'Output token throughput') | $(get 'Mean TTFT') | $(get 'Median TTFT') | $(get 'Mean TPOT') | $(get 'Median TPOT') |"
done
