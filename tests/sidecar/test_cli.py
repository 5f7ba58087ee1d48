"""`slaq sidecar` as the operator runs it: a process that drains in-flight requests on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.sidecar.conftest import write_table
from tests.support.polling import wait_for
from tests.sidecar.tables import abc_table, bearer
from slaq.local.processes import free_port
from slaq.testing.fake_engine import fake_user


def test_bad_scheduler_config_names_the_field(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "slaq", "sidecar", "--scheduler-config", '{"weights": {"urgency": 7}}'],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "--scheduler-config" in result.stderr and "urgency" in result.stderr


def test_scheduler_config_file_is_read(tmp_path: Path) -> None:
    from slaq.sidecar.server import parse_scheduler_config

    path = tmp_path / "sched.yaml"
    path.write_text("weights: {urgency: 0.9}\nagingBoundSeconds: 5\n")
    spec = parse_scheduler_config(str(path))
    assert spec.weights.urgency == 0.9 and spec.aging_bound_seconds == 5


def test_sigterm_drains_in_flight_then_exits(tmp_path: Path, fake_upstream) -> None:
    table = tmp_path / "tenants.json"
    write_table(table, abc_table())
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "slaq", "sidecar", "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(free_port()), "--engine-url", fake_upstream[1],
         "--tenant-table", str(table), "--drain-timeout", "20", "--served-model-name", "fake-model"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            try:
                return httpx.get(url + "/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 60.0, "sidecar process ready")
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 16, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json={**body, "user": fake_user(delay_ms=150)}, headers=bearer("std"), timeout=30) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            try:
                refused = httpx.post(url + "/v1/completions", json=body, headers=bearer("std"), timeout=2)
                assert refused.status_code == 503  # if a connection still gets through, it is refused
            except httpx.ConnectError:
                pass  # the listener is closed: new work goes elsewhere
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]" and len(rest) == 16  # 15 more tokens and [DONE]
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
