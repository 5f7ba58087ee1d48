"""Session fixture `slaq_engine`: one real `slaq engine` (tiny model, CPU, SLAScheduler) per test session.

Tests that use it are marked `@pytest.mark.engine`. The process binds 127.0.0.1 on a free port,
is waited for until /health answers, and is stopped by pid at the end of the session (SIGTERM,
then SIGKILL). Its log goes to a file whose path is printed when the engine fails to come up.

Another engine than the tiny CPU one (scripts/gpu_check.sh runs the KV erase test on a GPU with a
Llama-3-8B geometry): `SLAQ_TEST_ENGINE_ARGS` adds `slaq engine` flags, `SLAQ_TEST_VLLM_ARGS` adds
vLLM flags (both shell-quoted), `SLAQ_TEST_ENGINE_START_S` waits longer for /health.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

# about a minute on 2 idle cores; over 4 when the machine is shared (load 15 seen); under the 600 s test timeout
START_TIMEOUT_S = float(os.environ.get("SLAQ_TEST_ENGINE_START_S", "420"))
STOP_TIMEOUT_S = 20.0
ENGINE_MAX_NUM_SEQS = 8


@dataclass(frozen=True)
class EngineHandle:
    base_url: str
    port: int
    pid: int
    model: str


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)  # the engine core is a child of the server process
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT_S)


def _wait_healthy(process: subprocess.Popen, base_url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"slaq engine exited with {process.returncode} before answering /health; log: {log_path}")
        try:
            if httpx.get(base_url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"slaq engine did not answer /health within {START_TIMEOUT_S:.0f}s; log: {log_path}")


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the series of `name` that carry `labels`; fails when there is none."""
    values = []
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] == name and all(f'{k}="{v}"' in series for k, v in labels.items()):
            values.append(float(value))
    if not values:
        raise AssertionError(f"{name}{labels} not on /metrics")
    return sum(values)


def engine_arguments(args: tuple[str, ...], environ: dict[str, str]) -> list[str]:
    """`args` (slaq engine flags, then `--` and vLLM flags) with the flags the environment adds."""
    ours, vllm = (list(args[:args.index("--")]), list(args[args.index("--") + 1:])) if "--" in args else (list(args), [])
    ours += shlex.split(environ.get("SLAQ_TEST_ENGINE_ARGS", ""))
    vllm += shlex.split(environ.get("SLAQ_TEST_VLLM_ARGS", ""))
    return ours + (["--", *vllm] if vllm else [])


@contextlib.contextmanager
def running_engine(*args: str, env: dict[str, str] | None = None) -> Iterator[EngineHandle]:
    """A `slaq engine` with these arguments (after host and port), up and healthy, stopped on exit."""
    port = _free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="slaq-engine-test-"))
    log_path = log_dir / "engine.log"
    environ = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PROMETHEUS_MULTIPROC_DIR=str(log_dir / "metrics"), **(env or {}))
    (log_dir / "metrics").mkdir()
    command = [sys.executable, "-m", "slaq", "engine", "--host", "127.0.0.1", "--port", str(port), *engine_arguments(args, environ)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environ, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(process, base_url, log_path)
    except BaseException:
        _stop(process)
        print(f"slaq engine log: {log_path}", file=sys.stderr)
        raise
    try:
        yield EngineHandle(base_url=base_url, port=port, pid=process.pid, model="slaq-tiny")
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def slaq_engine() -> Iterator[EngineHandle]:
    with running_engine("--max-num-seqs", str(ENGINE_MAX_NUM_SEQS), "--max-model-len", "512") as engine:
        yield engine
