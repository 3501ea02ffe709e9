"""Fixtures of the Python client tests: one `minivllm serve` for the whole session.

The binary is `MINIVLLM_BIN` (default target/debug/minivllm) and the model `MINIVLLM_TEST_MODEL`
(default models/SmolLM2-135M-Instruct.Q4_1.gguf), both relative to the repo root. With
`MINIVLLM_TENSOR_PARALLEL=N` the server is N tensor-parallel ranks started by `mpirun` (a build
with the `mpi` feature), and the tests hold it to what one process answers.
"""

import os
import sys
from pathlib import Path

import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_support import binary, model, serve  # noqa: E402,F401 - the shared fixtures

SERVED_MODEL_NAME = "smol"
MAX_MODEL_LEN = 2048
TENSOR_PARALLEL = int(os.environ.get("MINIVLLM_TENSOR_PARALLEL", "1"))


@pytest.fixture(scope="session")
def server_url(binary: str, model: str):
    """Starts the server, waits for GET /health, yields its base url, kills it at teardown."""
    cmd = [
        binary, "serve",
        "--model", model,
        "--served-model-name", SERVED_MODEL_NAME,
        "--port", "0",
        "--kv-cache-memory", "128MiB",
        "--max-model-len", str(MAX_MODEL_LEN),
    ]
    if TENSOR_PARALLEL > 1:
        n = str(TENSOR_PARALLEL)
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", n, *cmd,
               "--tensor-parallel-size", n, "--threads", "1"]
    yield from serve(cmd)


@pytest.fixture(scope="session")
def client(server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def async_client(server_url: str) -> openai.AsyncOpenAI:
    # Function-scoped: an AsyncOpenAI's connection pool belongs to the event loop that used it,
    # and each async test runs its own loop with asyncio.run.
    return openai.AsyncOpenAI(
        base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120
    )
