"""A real HAProxy (Debian's haproxy, installed by scripts/setup.sh) in front of local pods, for tests:
a config rendered from the frontends asked for, each frontend on a free port of 127.0.0.1, run in
the foreground (`-db`) and stopped by its pid.

`render_config` is pure; `HAProxy` starts the binary on it, checks the config first (`-c`), and
waits until every frontend accepts connections.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

BALANCES = ("leastconn", "roundrobin")


@dataclass(frozen=True)
class Server:
    name: str
    host: str
    port: int
    weight: int = 1  # HAProxy's weight (1-256): its share of a roundrobin backend's requests

    def __post_init__(self) -> None:
        if not 1 <= self.weight <= 256:
            raise ValueError(f"server {self.name}: weight must lie in 1..256, got {self.weight}")


@dataclass(frozen=True)
class Frontend:
    """One listening port and its backend: `balance` over `servers`."""

    name: str
    port: int
    balance: str
    servers: tuple[Server, ...]

    def __post_init__(self) -> None:
        if self.balance not in BALANCES:
            raise ValueError(f"frontend {self.name}: balance must be one of {BALANCES}, got {self.balance!r}")
        if not self.servers:
            raise ValueError(f"frontend {self.name}: no servers")


def render_config(frontends: list[Frontend], *, timeout_s: int = 300) -> str:
    """An HAProxy config: HTTP mode, 127.0.0.1 only, no health checks (a test stops and starts the
    servers behind it on purpose), each response naming the server that answered (`x-served-by`).

    `http-server-close`: a connection to a server per request. A pooled idle connection races the
    sidecar's keep-alive close (uvicorn's 5 s): HAProxy sends a request on it as it closes and,
    the request not being the first of its client connection, closes the client's connection
    without an answer (the client sees "server disconnected"; once in five runs of
    e2e/test_quota_skew.py). What a router's pooling does to the sidecar is not what these tests
    measure."""
    lines = [
        "global",
        "    maxconn 4096",
        "defaults",
        "    mode http",
        "    option http-server-close",
        "    timeout connect 5s",
        f"    timeout client {timeout_s}s",
        f"    timeout server {timeout_s}s",
    ]
    for f in frontends:
        lines += [
            f"frontend {f.name}",
            f"    bind 127.0.0.1:{f.port}",
            f"    default_backend {f.name}_pods",
            f"backend {f.name}_pods",
            f"    balance {f.balance}",
            "    http-response set-header x-served-by %[srv_name]",
        ]
        lines += [f"    server {s.name} {s.host}:{s.port} weight {s.weight}" for s in f.servers]
    return "\n".join(lines) + "\n"


class HAProxy:
    def __init__(self, workdir: Path, frontends: list[Frontend], binary: str | None = None) -> None:
        self.binary = binary or shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.frontends = {f.name: f for f in frontends}
        self.config_path = workdir / "haproxy.cfg"
        self.log_path = workdir / "haproxy.log"
        self.config_path.write_text(render_config(frontends), encoding="utf-8")
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, frontend: str) -> str:
        return f"http://127.0.0.1:{self.frontends[frontend].port}"

    def start(self) -> "HAProxy":
        check = subprocess.run([self.binary, "-c", "-f", str(self.config_path)], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused {self.config_path}: {check.stdout}{check.stderr}")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([self.binary, "-db", "-f", str(self.config_path)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10.0
        for frontend in self.frontends.values():
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"haproxy exited with {self.process.returncode}; log: {self.log_path}")
                try:
                    socket.create_connection(("127.0.0.1", frontend.port), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"haproxy did not listen on 127.0.0.1:{frontend.port} within 10 s; log: {self.log_path}")
                    time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)  # hard stop: close every connection now
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
