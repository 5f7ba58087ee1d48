"""A real `redis-server` on 127.0.0.1 for the tests and the quota store benchmark (Debian's
redis-server, installed by scripts/setup.sh): no persistence, a free port, stopped by its pid.
`kill()`, `pause()`/`resume()` and `restart()` are the failures the quota store's fallback is
tested and measured against."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    def __init__(self, workdir: Path, binary: str) -> None:
        self.workdir = workdir
        self.binary = binary
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> "RedisServer":
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--daemonize", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode} (port {self.port})")
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on port {self.port} within 10 s")

    def kill(self) -> None:
        """SIGKILL: the store dies mid-work."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def pause(self) -> None:
        """SIGSTOP: the store still accepts connections (the kernel does) and answers nothing: a slow store."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def restart(self) -> None:
        """A fresh, empty store on the same port (as a restarted Redis without persistence)."""
        self.start()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGCONT)  # a paused server must run to exit
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
