"""The local stack: `slaq engine` and `slaq sidecar` in front of it, as child processes.

Used by `slaq up` (serve until interrupted) and by the demo (one stack per scheduler). Startup
shows progress; a child that dies or never gets ready stops the whole stack and its log tail is
shown. Every child is stopped by its pid (process group), the sidecar first so it drains.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from slaq.api.runtime import ENGINE_TABLE_ENV, READY_PATH
from slaq.local.errors import StartupError
from slaq.local.processes import Child, free_port, last_log_line, log_tail, slaq_command, start_child, wait_ready
from slaq.local.tenants import engine_table_beside

ENGINE_START_TIMEOUT_S = 600.0  # the tiny model needs ~1 min on 2 idle cores; a real model downloads first
SIDECAR_DRAIN_S = 10


@dataclass(frozen=True)
class StackOptions:
    host: str = "127.0.0.1"
    port: int = 8000  # the sidecar's port; 0 picks a free one
    metrics_port: int = 0  # the sidecar's metrics port; 0 picks a free one
    model: str | None = None  # None: the tiny built-in model on CPU
    scheduler: str = "slaq"
    engine_args: tuple[str, ...] = ()  # further `slaq engine` flags
    tenant_table: Path | None = None  # None: no sidecar, clients talk to the engine directly
    start_timeout_s: float = ENGINE_START_TIMEOUT_S
    served_model_name: str | None = None
    # The pool's spec.scheduler as validated wire JSON, handed to the engine and the sidecar alike
    # (as the operator does in a pod); None: both use the defaults.
    scheduler_config: str | None = None
    sidecar_args: tuple[str, ...] = ()  # further `slaq sidecar` flags


@dataclass
class LocalStack:
    options: StackOptions
    workdir: Path
    engine: Child | None = None
    sidecar: Child | None = None
    engine_port: int = 0
    port: int = 0
    metrics_port: int = 0
    _owns_workdir: bool = field(default=False, repr=False)

    @property
    def _host(self) -> str:
        return "127.0.0.1" if self.options.host in ("0.0.0.0", "") else self.options.host

    @property
    def url(self) -> str:
        """Where clients send requests: the sidecar, or the engine when there is none."""
        return f"http://{self._host}:{self.port}" if self.sidecar else f"http://127.0.0.1:{self.engine_port}"

    @property
    def metrics_url(self) -> str:
        """Where /metrics and /slaq/usage are: the sidecar's metrics port, or the engine when there is no sidecar."""
        return f"http://{self._host}:{self.metrics_port}" if self.sidecar else f"http://127.0.0.1:{self.engine_port}"

    @property
    def served_model_name(self) -> str:
        from slaq.engine.tiny_model import SERVED_NAME

        return self.options.served_model_name or self.options.model or SERVED_NAME

    @property
    def children(self) -> list[Child]:
        return [c for c in (self.sidecar, self.engine) if c is not None]

    def _scheduler_args(self) -> list[str]:
        config = self.options.scheduler_config
        return [] if config is None else ["--scheduler-config", config]

    def engine_command(self) -> list[str]:
        opts = self.options
        command = slaq_command("engine", "--host", "127.0.0.1", "--port", str(self.engine_port), "--scheduler", opts.scheduler)
        if opts.model:
            command += ["--model", opts.model]
        if opts.served_model_name:
            command += ["--served-model-name", opts.served_model_name]
        return command + self._scheduler_args() + list(opts.engine_args)

    def sidecar_command(self) -> list[str]:
        opts = self.options
        return slaq_command(
            "sidecar", "--host", opts.host, "--port", str(self.port), "--metrics-port", str(self.metrics_port),
            "--engine-url", f"http://127.0.0.1:{self.engine_port}",
            "--tenant-table", str(opts.tenant_table), "--drain-timeout", str(SIDECAR_DRAIN_S),
            "--served-model-name", self.served_model_name,
            # The engine's context bounds max_tokens and the body; request limits are the pool's defaults, as in a pod.
            "--max-model-len", str(self.max_model_len),
        ) + self._scheduler_args() + list(opts.sidecar_args)

    @property
    def max_model_len(self) -> int:
        """The engine's context length: its --max-model-len, or the tiny model's."""
        from slaq.engine.launcher import TINY_MAX_MODEL_LEN
        from slaq.sidecar.fields import MAX_TOKENS_LIMIT

        args = list(self.options.engine_args)
        for i, arg in enumerate(args):
            if arg == "--max-model-len" and i + 1 < len(args):
                return int(args[i + 1])
            if arg.startswith("--max-model-len="):
                return int(arg.split("=", 1)[1])
        return TINY_MAX_MODEL_LEN if self.options.model in (None, "slaq-tiny") else MAX_TOKENS_LIMIT

    def start(self, progress: Callable[[float, str], None] | None = None, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Start the engine (and sidecar), wait until ready; on failure everything started is stopped."""
        opts = self.options
        self.engine_port = free_port()
        engine_cmd = self.engine_command()
        try:
            # The engine's scheduler reads tenants' KV shares from the engine's cut of the table the sidecar serves.
            engine_env = ({**os.environ, ENGINE_TABLE_ENV: str(engine_table_beside(opts.tenant_table))}
                          if opts.tenant_table is not None else None)
            self.engine = start_child("engine", engine_cmd, self.workdir / f"engine-{opts.scheduler}.log",
                                      f"http://127.0.0.1:{self.engine_port}/health", env=engine_env)
            if opts.tenant_table is not None:
                self.port = opts.port or free_port(opts.host)
                self.metrics_port = opts.metrics_port or free_port(opts.host)
                self.sidecar = start_child("sidecar", self.sidecar_command(), self.workdir / "sidecar.log", f"http://{self._host}:{self.port}{READY_PATH}",
                                           stop_timeout_s=SIDECAR_DRAIN_S + 10)
            engine = self.engine

            def tick(elapsed: float) -> None:
                if progress is not None:
                    progress(elapsed, last_log_line(engine.log_path))

            # The sidecar's /ready follows the engine, so it is the last to answer.
            wait_ready(self.children[::-1], opts.start_timeout_s, tick, should_stop)
        except BaseException:
            self.stop()
            raise

    def failed_child(self) -> Child | None:
        return next((c for c in self.children if not c.running()), None)

    def stop(self) -> None:
        for child in self.children:  # sidecar first: it drains in-flight requests to the engine
            child.stop()

    def __enter__(self) -> "LocalStack":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def new_workdir(prefix: str = "slaq-up-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


class StatusLine:
    """One rewritten line on a terminal; periodic plain lines when output is a file or a pipe."""

    def __init__(self, stream: TextIO | None = None, every_s: float = 10.0) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.every_s = every_s
        self._last = -every_s
        self._width = 0

    def show(self, text: str) -> None:
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
            self.stream.flush()
        elif time.monotonic() - self._last >= self.every_s:
            self._last = time.monotonic()
            print(text, file=self.stream, flush=True)

    def done(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r" + text + " " * max(0, self._width - len(text)) + "\n")
            self._width = 0
            self.stream.flush()
        else:
            print(text, file=self.stream, flush=True)


def describe_failure(error: StartupError) -> str:
    child = error.child
    if child is None:
        return str(error)
    return f"{error}\n--- last lines of the {child.name} log ({child.log_path}) ---\n{log_tail(child.log_path)}"
