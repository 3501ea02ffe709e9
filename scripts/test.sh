#!/usr/bin/env bash
# The project's test command: fetches the test model if needed, then runs every test.
# Extra arguments go to `cargo test` (e.g. `./scripts/test.sh -p minivllm-kernels`).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet -p minivllm-cli -- download-default-model >/dev/null
cargo test --workspace "$@"
# The scalar kernels end to end: the same reference checks with SIMD switched off.
MINIVLLM_ISA=scalar cargo test -p minivllm --test model_reference
# The OpenAI-compatible server through OpenAI's own Python client (tests/python, in .venv).
# MINIVLLM_BIN picks the server binary (default target/debug/minivllm), MINIVLLM_TEST_MODEL
# the model (default models/SmolLM2-135M-Instruct.Q4_1.gguf).
./scripts/python_env.sh
cargo build -q -p minivllm-cli
.venv/bin/python -m pytest -q tests/python
