"""`slaq up` as a user runs it: the banner's curl works as printed, KV blocks handed from one tenant to
another are erased and counted, Ctrl-C stops both children, and a child that fails to start stops
everything and shows its log."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from slaq.local.processes import free_port
from tests.support.engine import metric_sum

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 420.0
# A KV cache of 9 usable blocks (128 tokens each on CPU), so one tenant's requests soon get blocks
# another tenant's wrote: the live check of the KV erase counter.
SMALL_KV_CACHE = ("--", "--max-model-len", "512", "--", "--num-gpu-blocks-override", "10")
STANDARD_KEY = "sk-demo-standard-0123456789abcdef"


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _group_alive(pgid: int, grace_s: float = 10.0) -> bool:
    deadline = time.monotonic() + grace_s  # a killed grandchild is reaped by init a moment later
    while _group_members(pgid):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.2)
    return False


def _read_until(log: Path, process: subprocess.Popen, pattern: str, timeout_s: float) -> str:
    """The output `process` wrote to `log`, once a line matches `pattern`."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if re.search(pattern, text):
            return text
        if process.poll() is not None:
            break
        time.sleep(0.3)
    raise AssertionError(f"no {pattern!r} within {timeout_s:.0f}s (exit {process.poll()}); output:\n{text[-3000:]}")


def _access_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"time"')]


@pytest.mark.engine
def test_up_serves_the_printed_curl_and_ctrl_c_stops_both_children(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "up.log"
    with open(log, "w") as out_file:
        process = subprocess.Popen([sys.executable, "-u", "-m", "slaq", "up", "--port", str(port), "--metrics-port", str(metrics_port), *SMALL_KV_CACHE],
                                   cwd=ROOT, stdout=out_file, stderr=subprocess.STDOUT, start_new_session=True)
    children: list[int] = []
    try:
        out = _read_until(log, process, r"Ctrl-C stops both processes", START_TIMEOUT_S)
        assert f"http://127.0.0.1:{port}" in out and "starting the engine" in out
        children = _children(process.pid)
        assert len(children) == 2, children
        curl = out[out.index("curl ", out.index("Try it as tenant")): out.index("\n\nCtrl-C")]
        assert "sk-demo-vip-0123456789abcdef" in curl
        answer = subprocess.run(["bash", "-c", curl + " -sS --fail-with-body"], capture_output=True, text=True, timeout=120)
        assert answer.returncode == 0, answer.stdout + answer.stderr
        body = json.loads(answer.stdout)
        assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 16
        refused = subprocess.run(["bash", "-c", curl.replace("sk-demo-vip-0123456789abcdef", "sk-wrong") + " -s -o /dev/null -w '%{http_code}'"],
                                 capture_output=True, text=True, timeout=60)
        assert refused.stdout == "401"
        stream = subprocess.run(["bash", "-c", curl.replace('"max_tokens": 16', '"max_tokens": 4, "stream": true') + " -sS --fail-with-body"],
                                capture_output=True, text=True, timeout=120)
        assert stream.returncode == 0 and "data: [DONE]" in stream.stdout, stream.stdout + stream.stderr
        # Metrics: on the metrics port, the sidecar's series and the engine's; none on the tenant port.
        assert f"curl http://127.0.0.1:{metrics_port}/metrics" in out
        metrics = subprocess.run(["curl", "-sS", f"http://127.0.0.1:{metrics_port}/metrics"], capture_output=True, text=True, timeout=60).stdout
        assert "vllm:num_requests_waiting{" in metrics and "slaq_engine_" in metrics
        assert 'slaq_ttft_seconds_count{tenant="vip",tier="critical"} 1.0' in metrics
        tenant_metrics = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://127.0.0.1:{port}/metrics"],
                                        capture_output=True, text=True, timeout=60)
        assert tenant_metrics.stdout == "404"
        # Audit: slaq up passes the sidecar's JSON access lines through, one per request, naming the tenant.
        _read_until(log, process, r'"path":"/metrics","status":404', 30.0)
        lines = _access_lines(log.read_text())
        assert [(line["tenant"], line["status"]) for line in lines] == [("vip", 200), (None, 401), ("vip", 200), (None, 404)]
        assert lines[2]["stream"] is True and lines[2]["ttft_s"] > 0 and lines[0]["output_tokens"] == 16
        _standard_reuses_vips_blocks_and_they_are_counted_erased(port, metrics_port)
        os.kill(process.pid, signal.SIGINT)  # what Ctrl-C sends
        assert process.wait(timeout=90) == 0
        assert "stopped (pids" in log.read_text()
        for child in children:  # each child led its own process group; nothing of it is left
            assert not _group_alive(child), f"process group {child} still has processes"
    finally:
        if process.poll() is None:
            process.kill()
        for child in children:
            if _group_members(child):
                os.killpg(child, signal.SIGKILL)


def _erased_on_reuse(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=60.0).text
    try:
        return metric_sum(text, "slaq_engine_kv_erased_blocks_total", reason="reuse")
    except AssertionError:  # no block erased yet: the labelled series appears on its first count
        return 0.0


def _standard_reuses_vips_blocks_and_they_are_counted_erased(port: int, metrics_port: int) -> None:
    """vip's requests above wrote a few blocks; standard's 2-block prompts use up the never-used
    blocks, then get vip's, which the engine zeroes first and counts (about the 4th request)."""
    assert _erased_on_reuse(metrics_port) == 0.0  # vip alone so far: nothing changed hands
    rng = random.Random(14)
    for _ in range(12):
        body = {"model": "slaq-tiny", "prompt": [rng.randrange(3, 500) for _ in range(200)], "max_tokens": 8}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120.0,
                            headers={"Authorization": f"Bearer {STANDARD_KEY}"})
        assert answer.status_code == 200, answer.text
        if _erased_on_reuse(metrics_port) > 0:
            return
    raise AssertionError("12 requests of tenant standard never got a block tenant vip had written (or it was not counted)")


def test_up_stops_everything_and_shows_the_log_when_the_engine_cannot_start() -> None:
    port = free_port()
    result = subprocess.run([sys.executable, "-m", "slaq", "up", "--port", str(port), "--", "--max-num-seqs", "lots"],
                            cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "engine exited with status 2 while starting" in result.stderr
    assert "--max-num-seqs: invalid int value: 'lots'" in result.stderr  # the tail of the engine's own log
    # The sidecar it had started is gone: nothing listens on the port any more.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_up_names_a_missing_tenants_path() -> None:
    result = subprocess.run([sys.executable, "-m", "slaq", "up", "--tenants", "/nonexistent/tenants"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--tenants: /nonexistent/tenants does not exist" in result.stderr
