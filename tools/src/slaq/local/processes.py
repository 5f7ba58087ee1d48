"""Child processes of `slaq up`: started in their own session, logged to a file, stopped by pid.

Each child gets its own process group (vLLM's server forks an engine core process), so stopping
one signals the whole group: SIGTERM, a grace period, then SIGKILL. Nothing is found by name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import httpx

from slaq.local.errors import StartupError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def slaq_command(*args: str) -> list[str]:
    """`slaq ARGS` run with this interpreter, so a venv without the console script on PATH still works."""
    return [sys.executable, "-m", "slaq", *args]


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def last_log_line(path: Path, width: int = 70) -> str:
    tail = log_tail(path, 1).strip()
    return tail if len(tail) <= width else tail[: width - 1] + "…"


@dataclass
class Child:
    """One started child: its name (for messages), pid, log file and readiness URL."""

    name: str
    process: subprocess.Popen
    log_path: Path
    ready_url: str
    stop_timeout_s: float = 20.0
    _log_handle: object = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.running():
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:
                pass

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM to the group, wait, then SIGKILL; returns the exit status."""
        timeout_s = self.stop_timeout_s if timeout_s is None else timeout_s
        if self.running():
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.process.wait(timeout=10.0)
        # Grandchildren (vLLM's engine core) can outlive their parent for a moment.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return self.process.returncode


def start_child(name: str, command: Sequence[str], log_path: Path, ready_url: str,
                env: Mapping[str, str] | None = None, stop_timeout_s: float = 20.0, append_log: bool = False) -> Child:
    """`append_log`: a restarted child adds to its predecessor's log instead of replacing it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab" if append_log else "wb") as log:
        process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=dict(os.environ if env is None else env), start_new_session=True)
    return Child(name, process, log_path, ready_url, stop_timeout_s)


def answers(url: str, timeout_s: float = 2.0) -> bool:
    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(children: Sequence[Child], timeout_s: float, on_tick: Callable[[float], None] | None = None,
               should_stop: Callable[[], bool] = lambda: False, poll_s: float = 0.5) -> None:
    """Until every child's ready URL answers 200; StartupError names the child that exited or timed out."""
    started = time.monotonic()
    pending = list(children)
    while pending:
        for child in list(pending):
            if not child.running():
                raise StartupError(child, f"{child.name} exited with status {child.process.returncode} while starting")
            if answers(child.ready_url):
                pending.remove(child)
        if not pending:
            return
        elapsed = time.monotonic() - started
        if should_stop():
            raise StartupError(pending[0], "interrupted while starting")
        if elapsed > timeout_s:
            raise StartupError(pending[0], f"{pending[0].name} was not ready after {timeout_s:.0f}s")
        if on_tick is not None:
            on_tick(elapsed)
        time.sleep(poll_s)
