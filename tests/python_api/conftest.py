"""Fixtures of the Python API tests: one `LLM` on the test model for the whole session.

The package is the one installed in the running interpreter (`pip install .` at the repo
root; scripts/test.sh does it). `MINIVLLM_BIN` (default target/debug/minivllm) is the command
line whose output the package must reproduce, `MINIVLLM_TEST_MODEL` (default
models/SmolLM2-135M-Instruct.Q4_1.gguf) the model; both relative to the repo root.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_support import binary, model  # noqa: E402,F401 - the shared fixtures

# The settings every LLM of these tests and the CLI runs they are compared with share.
ENGINE = {"max_model_len": 1024, "kv_cache_memory": "256MiB"}


@pytest.fixture(scope="session")
def llm(model: str):
    from minivllm import LLM

    return LLM(model=model, **ENGINE)
