#!/usr/bin/env bash
# The project's test command: fetches the test model if needed, then runs every test.
# Extra arguments go to `cargo test` (e.g. `./scripts/test.sh -p minivllm-kernels`), and then
# only `cargo test` runs.
set -euo pipefail
cd "$(dirname "$0")/.."

# Everything is built by this one cargo invocation: narrower ones (`-p`, `--test`, `build`)
# resolve features differently and would compile the crates again.
cargo_test() { cargo test --workspace "$@"; }
if [ $# -gt 0 ]; then
  cargo_test --no-run "$@"
  [ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] || cargo run --quiet -p minivllm-cli -- download-default-model
  cargo_test "$@"
  exit
fi
cargo_test --no-run
target/debug/minivllm download-default-model >/dev/null
cargo_test

# The scalar kernels end to end: the reference checks again, SIMD switched off, run from the
# test binary just built (as cargo would: from the package's folder).
reference_test=$(cargo_test --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "model_reference" and m.get("executable"):
        print(m["executable"])')
[ -n "$reference_test" ] || { echo "test.sh: no model_reference test binary found" >&2; exit 1; }
(cd crates/minivllm && MINIVLLM_ISA=scalar "$reference_test")

# The OpenAI-compatible server through OpenAI's own Python client (tests/python, in .venv).
# MINIVLLM_BIN picks the server binary (default target/debug/minivllm, built above),
# MINIVLLM_TEST_MODEL the model (default models/SmolLM2-135M-Instruct.Q4_1.gguf).
./scripts/python_env.sh
.venv/bin/python -m pytest -q tests/python
