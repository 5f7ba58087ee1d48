"""Child processes of `slaq up`: stopped by pid with their whole group, failures carry the log tail."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from slaq.local.errors import StartupError
from slaq.local.processes import free_port, start_child, wait_ready
from slaq.local.stack import describe_failure

# A parent that forks a grandchild (as vLLM's server forks its engine core) and writes its pid.
FORKING = """
import os, sys, time
pid = os.fork()
if pid == 0:
    time.sleep(300)
    os._exit(0)
open(sys.argv[1], "w").write(str(pid))
print("parent up", flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _forker(tmp_path: Path):
    """A started FORKING child and its grandchild's pid."""
    pid_file = tmp_path / "grandchild.pid"
    child = start_child("forker", [sys.executable, "-c", FORKING, str(pid_file)], tmp_path / "f.log", "http://127.0.0.1:1/")
    deadline = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return child, int(pid_file.read_text())


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_stop_ends_the_child_and_its_grandchild(tmp_path: Path) -> None:
    child, grandchild = _forker(tmp_path)
    assert child.running() and _alive(grandchild)
    child.stop(timeout_s=5)
    assert not child.running()
    _wait_gone(grandchild)


def test_a_child_that_exits_while_starting_is_reported_with_its_log(tmp_path: Path) -> None:
    code = "import sys; print('loading weights'); print('error: no such model', file=sys.stderr); sys.exit(3)"
    child = start_child("engine", [sys.executable, "-c", code], tmp_path / "e.log", f"http://127.0.0.1:{free_port()}/health")
    with pytest.raises(StartupError) as caught:
        wait_ready([child], timeout_s=30)
    assert "engine exited with status 3" in str(caught.value)
    text = describe_failure(caught.value)
    assert "error: no such model" in text and "loading weights" in text


def test_a_child_that_never_gets_ready_times_out_and_is_named(tmp_path: Path) -> None:
    child = start_child("sidecar", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s.log",
                        f"http://127.0.0.1:{free_port()}/ready")
    try:
        with pytest.raises(StartupError, match="sidecar was not ready after 1s"):
            wait_ready([child], timeout_s=1.0, poll_s=0.1)
    finally:
        child.stop(timeout_s=5)
    assert not child.running()


def test_a_child_killed_alone_still_takes_its_grandchild_down_when_stopped(tmp_path: Path) -> None:
    """The engine's server killed by a fault leaves vLLM's EngineCore behind in its group: stop() ends it."""
    import signal

    child, grandchild = _forker(tmp_path)
    os.kill(child.pid, signal.SIGKILL)  # the server process alone, as a fault would
    child.process.wait(timeout=10)
    assert _alive(grandchild)
    child.stop(timeout_s=5)
    _wait_gone(grandchild)
