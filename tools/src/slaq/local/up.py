"""`slaq up`: the engine and the sidecar on this machine, serving the tenants of some manifests.

The sidecar's access-log lines (one JSON object per request) are passed through to standard
output as they are written; the rest of both processes' output stays in their log files.
"""

from __future__ import annotations

import json
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from slaq.local.errors import LocalError, StartupError
from slaq.local.processes import log_tail
from slaq.local.stack import LocalStack, StackOptions, StatusLine, describe_failure, new_workdir
from slaq.local.tenants import LocalTenants, local_pool, plan_local_table, read_tenants, write_table


@dataclass(frozen=True)
class UpOptions:
    tenants: tuple[Path, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    metrics_port: int = 0  # 0: a free port, printed in the banner
    model: str | None = None
    engine_args: tuple[str, ...] = ()
    scheduler_config: str | None = None  # validated wire JSON: the engine and the sidecar both get it


class StopFlag:
    """Set by SIGINT/SIGTERM; the main loop notices it and shuts the children down by pid."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    def __bool__(self) -> bool:
        return self.signum is not None

    def install(self) -> None:
        signal.signal(signal.SIGINT, self)
        signal.signal(signal.SIGTERM, self)


def curl_example(url: str, model: str, key: str) -> str:
    body = '{"model": "%s", "prompt": "Hello, slaq", "max_tokens": 16}' % model
    return (f"curl {url}/v1/completions \\\n"
            f"  -H 'Authorization: Bearer {key}' \\\n"
            f"  -H 'Content-Type: application/json' \\\n"
            f"  -d {shlex.quote(body)}")


def banner(stack: LocalStack, local: LocalTenants, started_s: float) -> str:
    tenant, key = local.example_key()
    lines = [
        f"slaq is ready after {started_s:.0f}s: {stack.url} (OpenAI API: /v1/completions, /v1/chat/completions)",
        f"  model      {stack.served_model_name}" + ("  (tiny built-in model, random weights, CPU)" if not stack.options.model else ""),
        f"  scheduler  {stack.options.scheduler}; tenants: "
        + ", ".join(f"{t.metadata.name} ({t.spec.tier.value})" for t in local.tenants),
        f"  health     {stack.url}/ready",
        f"  metrics    curl {stack.metrics_url}/metrics   (usage: {stack.metrics_url}/slaq/usage; not on the tenant port)",
        f"  audit      one JSON line per request below (from {stack.workdir / 'sidecar.log'})",
        f"  logs       {stack.workdir}",
        "",
        f"Try it as tenant {tenant}:",
        curl_example(stack.url, stack.served_model_name, key),
        "",
        "Ctrl-C stops both processes.",
    ]
    return "\n".join(lines)


class AccessLines:
    """Follows a log file from its start; each read hands back the complete access-log lines written since the last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[str]:
        try:
            with open(self.path, "rb") as log:
                log.seek(self._offset)
                data = log.read()
        except OSError:
            return []
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        return [line for line in (raw.decode("utf-8", "replace") for raw in complete) if is_access_line(line)]


def is_access_line(line: str) -> bool:
    from slaq.sidecar.access import EVENT

    if not line.startswith("{"):
        return False
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("event") == EVENT


def run_up(options: UpOptions) -> int:
    stop = StopFlag()
    stop.install()
    local = read_tenants(list(options.tenants))
    workdir = new_workdir()
    pool = local_pool(options.model or "slaq-tiny")
    table_path = write_table(plan_local_table(local, pool), workdir / "tenants.json")
    print(f"slaq up: {len(local.tenants)} tenants from {', '.join(map(str, options.tenants))} "
          f"→ tenant table {table_path} (key hashes only)", flush=True)
    stack = LocalStack(StackOptions(host=options.host, port=options.port, metrics_port=options.metrics_port, model=options.model,
                                    engine_args=options.engine_args, tenant_table=table_path,
                                    scheduler_config=options.scheduler_config), workdir)
    status = StatusLine()
    started = time.monotonic()
    what = options.model or "the tiny built-in model on CPU"
    try:
        stack.start(lambda elapsed, line: status.show(f"starting the engine ({what}) … {elapsed:4.0f}s  {line}"), lambda: bool(stop))
    except StartupError as exc:
        status.done("")
        if stop:
            print("slaq up: interrupted while starting; both processes stopped.", file=sys.stderr)
            return 130
        print(f"slaq up: {describe_failure(exc)}", file=sys.stderr)
        return 1
    status.done(f"engine and sidecar started ({time.monotonic() - started:.0f}s)")
    print(banner(stack, local, time.monotonic() - started), flush=True)
    access = AccessLines(stack.workdir / "sidecar.log")
    try:
        while not stop:
            for line in access.read():
                print(line, flush=True)
            failed = stack.failed_child()
            if failed is not None:
                print(f"slaq up: the {failed.name} exited with status {failed.process.returncode}; stopping.\n"
                      f"--- last lines of {failed.log_path} ---", file=sys.stderr)
                print(log_tail(failed.log_path), file=sys.stderr)
                return 1
            time.sleep(0.5)
        print("\nslaq up: stopping (sidecar drains in-flight requests, then the engine stops) …", flush=True)
        return 0
    finally:
        stack.stop()
        for line in access.read():  # the requests the sidecar drained while stopping
            print(line, flush=True)
        print(f"slaq up: stopped (pids {', '.join(str(c.pid) for c in stack.children)}); logs in {workdir}", flush=True)


def main(options: UpOptions) -> int:
    try:
        return run_up(options)
    except LocalError as exc:
        print(f"slaq up: {exc}", file=sys.stderr)
        return 2


def default_tenants() -> Path:
    from slaq.cli import repo_root

    examples = repo_root() / "crds" / "examples"
    return examples if examples.is_dir() else Path("crds/examples")


