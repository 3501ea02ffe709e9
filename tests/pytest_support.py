"""What both Python test suites (tests/python, tests/python_api) need: the repo root, and
the `minivllm` binary and test model as session fixtures.

`MINIVLLM_BIN` (default target/debug/minivllm) and `MINIVLLM_TEST_MODEL` (default
models/SmolLM2-135M-Instruct.Q4_1.gguf) pick them, relative to the repo root. Each suite's
conftest.py puts tests/ on sys.path and imports the fixtures from here.
"""

import contextlib
import os
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
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
STARTUP_TIMEOUT_S = 120


def opted_out(need: str) -> bool:
    """Whether the developer opted out of the tests that need `need` (`models`, `mpi`,
    `browser`, `netns`) by naming it in MINIVLLM_SKIP (space- or comma-separated), as the
    Rust tests read it (`minivllm::testing::opted_out`)."""
    names = os.environ.get("MINIVLLM_SKIP", "").replace(",", " ").split()
    return need in names


def skip_or_fail(need: str, missing: str):
    """For a test that cannot run because `missing` (named `need` in MINIVLLM_SKIP) is not
    here: a failure saying so, or a skip where the developer opted out of `need`. A test that
    passes without what it tests guards nothing, so skipping takes an explicit flag."""
    if opted_out(need):
        pytest.skip(f"{missing} (MINIVLLM_SKIP={need})")
    pytest.fail(f"{missing}. ./scripts/test.sh fetches the models and says what to install; "
                f"MINIVLLM_SKIP={need} skips the tests that need it", pytrace=False)


def path_from_env(var: str, default: str) -> str:
    p = Path(os.environ.get(var, default))
    return str(p if p.is_absolute() else ROOT / p)


def qwen_model() -> str:
    """Qwen2.5-Coder-0.5B-Instruct (`MINIVLLM_QWEN_MODEL`), for the tests of what the default
    model cannot do (tool calls in Hermes' format, a template that describes tools); fails,
    or skips with MINIVLLM_SKIP=models, when the file is not here."""
    path = path_from_env("MINIVLLM_QWEN_MODEL", "models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf")
    if not os.path.exists(path):
        skip_or_fail("models", f"no {path} (`minivllm download-model qwen2.5-coder-0.5b`)")
    return path


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


def serve(cmd):
    """Runs `cmd` (a `minivllm serve --port 0`), yields its base url once healthy, stops it
    after."""
    running = serve_logged(cmd)
    url, _ = next(running)
    try:
        yield url
    finally:
        running.close()


def serve_logged(cmd):
    """As `serve`, yielding (base url, a function returning the server's log so far)."""
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
            yield url, logs
        finally:
            # A signal mpirun can pass on: killed outright, it would leave its ranks behind.
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_router(*args: str, env=None):
    """`vllm-router` (from PyPI, in the test venv) with `args`, on a free port: yields (its
    base url, a function returning its log so far) once healthy; stopped after."""
    router_bin = Path(ROOT, ".venv/bin/vllm-router")
    assert router_bin.exists(), "vllm-router is in tests/python/requirements.txt"
    port = free_port()
    cmd = [str(router_bin), "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-port", str(free_port()), *args]
    with tempfile.TemporaryFile() as log:
        router = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

        def logs() -> str:
            log.seek(0)
            return log.read()[-4000:].decode(errors="replace")

        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while not _healthy(base):
                assert router.poll() is None, f"vllm-router exited:\n{logs()}"
                assert time.monotonic() < deadline, f"vllm-router not healthy in 60 s:\n{logs()}"
                time.sleep(0.2)
            yield base, logs
        finally:
            router.terminate()
            router.wait(timeout=30)
