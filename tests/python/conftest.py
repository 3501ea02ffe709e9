"""Fixtures of the Python client tests: one `minivllm serve` for the whole session.

The binary is `MINIVLLM_BIN` (default target/debug/minivllm) and the model `MINIVLLM_TEST_MODEL`
(default models/SmolLM2-135M-Instruct.Q4_1.gguf), both relative to the repo root. With
`MINIVLLM_TENSOR_PARALLEL=N` the server is N tensor-parallel ranks started by `mpirun` (a build
with the `mpi` feature), and the tests hold it to what one process answers.
"""

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_support import binary, model  # noqa: E402,F401 - the shared fixtures

SERVED_MODEL_NAME = "smol"
MAX_MODEL_LEN = 2048
STARTUP_TIMEOUT_S = 120
TENSOR_PARALLEL = int(os.environ.get("MINIVLLM_TENSOR_PARALLEL", "1"))


def _bound_url(logs: str):
    # `serving <name> on http://127.0.0.1:PORT`: with --port 0 the server picks a free port
    # itself and says which, so no other process can take it first.
    m = re.search(r" on (http://[0-9.]+:[0-9]+)", logs)
    return m.group(1) if m else None


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


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


def serve(cmd):
    """Runs `cmd` (a `minivllm serve --port 0`), yields its base url once healthy, stops it
    after."""
    # stderr goes to a file, not a pipe nobody reads, so the server never blocks on its logs;
    # we read it through a descriptor of our own, so reading never moves the server's writes.
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "serve.log", "a") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)

        def logs() -> str:
            return (Path(tmp) / "serve.log").read_text(errors="replace")

        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            url = None
            while url is None or not _healthy(url):
                url = url or _bound_url(logs())
                if proc.poll() is not None:
                    pytest.fail(f"minivllm serve exited with {proc.returncode}:\n{logs()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"minivllm serve not healthy in {STARTUP_TIMEOUT_S} s:\n{logs()}")
                time.sleep(0.1)
            yield url
        finally:
            # A signal mpirun can pass on: killed outright, it would leave its ranks behind.
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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
