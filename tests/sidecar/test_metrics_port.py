"""The metrics port: sidecar and engine series per scrape, usage with SLO outcomes, nothing on the tenant port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from slaq.local.processes import answers
from slaq.sidecar.metrics_port import engine_families
from slaq.sidecar.server import ConfigError, SidecarOptions, serve
from tests.sidecar.conftest import write_table
from tests.sidecar.tables import abc_table, bearer
from slaq.local.processes import free_port
from slaq.testing.fake_engine import fake_user
from tests.support.polling import wait_for

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}

VLLM_TEXT = """# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 123.0
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 4.2
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 1.0
# HELP slaq_engine_preemptions_total Preemptions by tier.
# TYPE slaq_engine_preemptions_total counter
slaq_engine_preemptions_total{tier="batch"} 2.0
"""


def test_engine_families_keeps_vllm_and_slaq_engine_lines_only() -> None:
    kept = engine_families(VLLM_TEXT).splitlines()
    assert kept == [line for line in VLLM_TEXT.splitlines() if "vllm:" in line or "slaq_engine_" in line]
    assert not any("python_gc" in line or "process_cpu" in line for line in kept)
    assert engine_families("# HELP process_x y\nprocess_x 1\n") == ""


def test_tenant_port_serves_neither_metrics_nor_usage(sidecar) -> None:
    for path in ("/metrics", "/slaq/usage"):
        response = sidecar.client.get(path, headers=bearer("vip"))
        assert response.status_code == 404 and response.json()["reason"] == "not_found", path
    assert sidecar.metrics.get("/metrics").status_code == 200
    assert sidecar.metrics.get("/slaq/usage").status_code == 200


def test_metrics_port_serves_no_api(sidecar) -> None:
    assert sidecar.metrics.post("/v1/chat/completions", json=CHAT, headers=bearer("vip")).status_code == 405
    assert sidecar.metrics.get("/v1/models", headers=bearer("vip")).status_code == 404
    assert len(sidecar.app.core.usage_report()["tenants"]) == 0  # nothing was admitted through it


def test_engine_series_are_fetched_on_every_scrape(sidecar, fake_upstream) -> None:
    engine, _ = fake_upstream
    sidecar.client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=bearer("std"))
    engine.waiting_gauge = 7
    text = sidecar.metrics.get("/metrics").text
    assert 'vllm:num_requests_waiting{model_name="fake-model"} 7' in text
    assert 'slaq_ttft_seconds_count{tenant="std",tier="standard"} 1.0' in text
    assert "slaq_sidecar_engine_up 1.0" in text
    engine.waiting_gauge = 2  # the very next scrape shows the engine's value now, not a cached one
    assert 'vllm:num_requests_waiting{model_name="fake-model"} 2' in sidecar.metrics.get("/metrics").text


def test_unreachable_engine_leaves_the_sidecar_series_and_says_so(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1])
    for client in sidecar.app.engine.clients:
        client._base_url = httpx.URL("http://127.0.0.1:9")  # nothing listens on the discard port
    text = sidecar.metrics.get("/metrics").text
    assert "slaq_sidecar_engine_up 0.0" in text and "slaq_queue_depth" in text
    assert "vllm:" not in text


def test_usage_reports_slo_outcomes_per_tenant(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], abc_table(std={"ttft_ms": 100.0, "tpot_ms": 1000.0}), served_model_name="fake-model")
    for _ in range(2):
        assert sidecar.client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=bearer("std")).status_code == 200
    slow = {**CHAT, "stream": True, "user": fake_user(delay_ms=400)}  # the first token after 400 ms misses the 100 ms TTFT
    assert sidecar.client.post("/v1/chat/completions", json=slow, headers=bearer("std")).status_code == 200
    std = sidecar.metrics.get("/slaq/usage").json()["tenants"]["std"]
    assert (std["sloMetPerMinute"], std["sloMissedPerMinute"]) == (2, 1)
    text = sidecar.metrics.get("/metrics").text
    assert 'slaq_slo_outcomes_total{outcome="met",tenant="std",tier="standard"} 2.0' in text
    assert 'slaq_slo_outcomes_total{outcome="ttft_missed",tenant="std",tier="standard"} 1.0' in text


def test_metrics_port_equal_to_the_tenant_port_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--metrics-port"):
        serve(SidecarOptions(host="127.0.0.1", port=18123, metrics_port=18123, engine_url="http://127.0.0.1:9", tenant_table=tmp_path / "t.json"))


def test_the_process_keeps_metrics_off_the_tenant_port_and_logs_each_request(tmp_path: Path, fake_upstream) -> None:
    """`slaq sidecar` as a pod runs it: two ports, and JSON access lines on standard output."""
    table = tmp_path / "tenants.json"
    write_table(table, abc_table())
    port, metrics_port = free_port(), free_port()
    out = open(tmp_path / "stdout", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "slaq", "sidecar", "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
         "--engine-url", fake_upstream[1], "--tenant-table", str(table), "--served-model-name", "fake-model"],
        stdout=out, stderr=subprocess.DEVNULL,
    )
    url, metrics_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}"
    try:
        wait_for(lambda: answers(url + "/ready", 1.0), 60.0, "sidecar process ready")
        assert httpx.post(url + "/v1/chat/completions", json=CHAT, headers=bearer("vip"), timeout=10).status_code == 200
        assert httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-wrong"}, timeout=10).status_code == 401
        assert httpx.get(url + "/metrics", timeout=10).status_code == 404
        text = httpx.get(metrics_url + "/metrics", timeout=10).text
        assert "vllm:num_requests_waiting" in text and 'slaq_requests_total{code="200",tenant="vip",tier="critical"} 1.0' in text

        def access_lines() -> list[dict]:
            lines = (tmp_path / "stdout").read_text().splitlines()
            return [json.loads(line) for line in lines if line.startswith("{")]

        wait_for(lambda: len(access_lines()) >= 3, 10.0, "three access lines")
        answered, refused, probed = access_lines()[:3]
        assert (answered["tenant"], answered["tier"], answered["status"], answered["path"]) == ("vip", "critical", 200, "/v1/chat/completions")
        assert (refused["tenant"], refused["status"], refused["reason"]) == (None, 401, "unauthorized")
        assert (probed["path"], probed["status"], probed["reason"]) == ("/metrics", 404, "not_found")
    finally:
        process.terminate()
        process.wait(timeout=30)
        out.close()


def test_a_taken_metrics_port_is_a_clear_error(tmp_path: Path, fake_upstream) -> None:
    table = tmp_path / "tenants.json"
    write_table(table, abc_table())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "slaq", "sidecar", "--host", "127.0.0.1", "--port", str(free_port()),
             "--metrics-port", str(busy), "--engine-url", fake_upstream[1], "--tenant-table", str(table)],
            capture_output=True, text=True, timeout=60,
        )
    assert result.returncode == 2 and f"cannot listen on 127.0.0.1:{busy}" in result.stderr


def test_attainment_targets_and_quota_refusals_are_exported(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], abc_table(std={"requests_per_minute": 1.0, "attainment_target": 0.95}), served_model_name="fake-model")
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("std")).status_code == 200
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("std")).status_code == 429
    text = sidecar.metrics.get("/metrics").text
    assert 'slaq_attainment_target{tenant="std",tier="standard"} 0.95' in text
    assert 'slaq_attainment_target{tenant="vip",tier="critical"} 0.99' in text
    assert 'tenant="free"' not in text.split("# HELP slaq_attainment_target")[1].split("# HELP")[0]  # no objectives, no target
    assert 'slaq_quota_refusals_total{quota="request_rate",tenant="std",tier="standard"} 1.0' in text
