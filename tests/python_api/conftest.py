"""Fixtures of the Python API tests: one `LLM` on the test model for the whole session.

The package is the one installed in the running interpreter (`pip install .` at the repo
root; scripts/test.sh does it). `MINIVLLM_BIN` (default target/debug/minivllm) is the command
line whose output the package must reproduce, `MINIVLLM_TEST_MODEL` (default
models/SmolLM2-135M-Instruct.Q4_1.gguf) the model; both relative to the repo root.
"""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The settings every LLM of these tests and the CLI runs they are compared with share.
ENGINE = {"max_model_len": 1024, "kv_cache_memory": "256MiB"}


def _path_from_env(var: str, default: str) -> str:
    p = Path(os.environ.get(var, default))
    return str(p if p.is_absolute() else ROOT / p)


@pytest.fixture(scope="session")
def model() -> str:
    path = _path_from_env("MINIVLLM_TEST_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.fail(f"no test model at {path}: run `minivllm download-default-model`")
    return path


@pytest.fixture(scope="session")
def binary() -> str:
    path = _path_from_env("MINIVLLM_BIN", "target/debug/minivllm")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no minivllm binary at {path}: run `cargo build -p minivllm-cli`")
    return path


@pytest.fixture(scope="session")
def llm(model: str):
    from minivllm import LLM

    return LLM(model=model, **ENGINE)
