"""What both Python test suites (tests/python, tests/python_api) need: the repo root, and
the `minivllm` binary and test model as session fixtures.

`MINIVLLM_BIN` (default target/debug/minivllm) and `MINIVLLM_TEST_MODEL` (default
models/SmolLM2-135M-Instruct.Q4_1.gguf) pick them, relative to the repo root. Each suite's
conftest.py puts tests/ on sys.path and imports the fixtures from here.
"""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# How far the test model's last hidden state, through its dequantised tied embedding matrix,
# may put a top-5 next-token logprob from transformers': the Q4_1 layers (activations
# rounded to 8 bits per block, as llama.cpp does) move one by up to 0.17 on the AVX2 and
# scalar kernels (under 0.15 on AVX-512 VNNI, which sums in another order), and by up to
# 0.58 over every reference step (tests/integration/model_reference.rs bounds them at 1.0).
# The hidden state of another position, or a normalised one, misses by whole units.
QUANTISED_LOGPROB_TOL = 0.3


def path_from_env(var: str, default: str) -> str:
    p = Path(os.environ.get(var, default))
    return str(p if p.is_absolute() else ROOT / p)


@pytest.fixture(scope="session")
def binary() -> str:
    path = path_from_env("MINIVLLM_BIN", "target/debug/minivllm")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no minivllm binary at {path}: run `cargo build -p minivllm-cli`")
    return path


@pytest.fixture(scope="session")
def model() -> str:
    path = path_from_env("MINIVLLM_TEST_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.fail(f"no test model at {path}: run `minivllm download-default-model`")
    return path
