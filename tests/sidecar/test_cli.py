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


def test_a_request_cut_when_the_drain_runs_out_ends_before_the_sidecar_closes_its_clients(tmp_path: Path, fake_upstream) -> None:
    """uvicorn cancels the requests still running when its graceful shutdown times out and goes on
    to the app's shutdown without waiting for them. The request's work must end there, its flight
    finished (quota settled, line logged), before the engine client and the quota store close: an
    orphaned work would finish later, against closed clients, or never."""
    import io

    from slaq.sidecar.server import SidecarOptions, build_app
    from tests.sidecar.conftest import SidecarThread
    from tests.support.access_log import access_lines

    table = tmp_path / "tenants.json"
    write_table(table, abc_table())
    app = build_app(SidecarOptions(host="127.0.0.1", port=0, engine_url=fake_upstream[1], tenant_table=table, served_model_name="fake-model"))
    buffer = io.StringIO()
    app.access.attach(buffer)
    at_close: list[int] = []
    close_engine = app.engine.aclose

    async def aclose() -> None:
        at_close.append(app.core.gate.in_flight)
        await close_engine()

    app.engine.aclose = aclose  # type: ignore[method-assign]
    thread = SidecarThread(app)
    thread.config.timeout_graceful_shutdown = 1
    thread.start()
    try:
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 50, "stream": True, "user": fake_user(delay_ms=200)}
        with httpx.stream("POST", thread.url + "/v1/completions", json=body, headers=bearer("std"), timeout=30) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            app.core.draining = True
            thread.server.should_exit = True  # SIGTERM's effect; the stream needs 10 s, the drain allows 1
            try:
                for _ in lines:
                    pass
            except httpx.HTTPError:
                pass  # cut
        thread.thread.join(30)
        assert not thread.thread.is_alive()
    finally:
        thread.stop()
    assert at_close == [0]  # the cut request had ended when the engine client closed
    assert [(line["tenant"], line["status"], line["reason"]) for line in access_lines(buffer)] == [("std", 503, "drain_timeout")]
    assert access_lines(buffer)[0]["output_tokens"] > 0  # charged what went out before the cut
