#!/usr/bin/env bash
# The project's test command: fetches the test model if needed, then runs every test.
# Extra arguments go to `cargo test` (e.g. `./scripts/test.sh -p minivllm-kernels`).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet -p minivllm-cli -- download-default-model >/dev/null
cargo test --workspace "$@"
# The scalar kernels end to end: the same reference checks with SIMD switched off.
MINIVLLM_ISA=scalar cargo test -p minivllm --test model_reference
