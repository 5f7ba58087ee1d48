"""Headers at the edge: singleton headers, head caps, failed authentication slowed and its access
lines sampled, and a hung engine answered for (sidecar/README.md, Security model)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from slaq.local.processes import free_port
from slaq.sidecar.auth_failures import AuthFailureLimits, AuthFailures, FailureLines
from slaq.sidecar.connections import ConnectionLimits
from tests.sidecar.tables import KEYS, bearer
from tests.support.access_log import access_lines, capture
from tests.support.polling import wait_for

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
WRONG = {"authorization": "Bearer sk-wrong-0123456789"}


def refusal(response: httpx.Response, status: int, reason: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["reason"] == reason and body["error"]["message"], body
    return body


# singleton headers ----------------------------------------------------------------------------

@pytest.mark.parametrize("order", ["bad-then-good", "good-then-bad"])
def test_two_authorization_headers_are_refused_whatever_their_order(sidecar, fake_upstream, order: str) -> None:
    engine, _ = fake_upstream
    good, bad = bearer("vip")["authorization"], WRONG["authorization"]
    pair = [good, bad] if order == "good-then-bad" else [bad, good]
    before = len(engine.received)
    response = sidecar.client.post("/v1/chat/completions", json=CHAT, headers=[("authorization", value) for value in pair])
    body = refusal(response, 400, "duplicate_header")
    assert "authorization" in body["error"]["message"]
    assert len(engine.received) == before  # nothing reached the engine
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip")).status_code == 200  # one copy: served


@pytest.mark.parametrize("name", ["content-type", "content-length", "host", "x-llm-d-inference-fairness-id"])
def test_other_singleton_headers_twice_are_refused(sidecar, name: str) -> None:
    value = {"content-type": "application/json", "content-length": str(len(json.dumps(CHAT))), "host": "pod",
             "x-llm-d-inference-fairness-id": "vip"}[name]
    with socket.create_connection(("127.0.0.1", sidecar.server.port), timeout=10) as conn:
        body = json.dumps(CHAT).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: pod\r\nauthorization: Bearer {KEYS['vip']}\r\n"
                f"content-length: {len(body)}\r\n{name}: {value}\r\n")
        if name not in ("host", "content-length"):
            head += f"{name}: {value}\r\n"
        conn.sendall(head.encode() + b"\r\n" + body)
        status, reply = _read_response(conn)
    if name == "content-length":  # llhttp refuses a second Content-Length itself, before any app sees the request
        assert (status, reply) == (400, b"Invalid HTTP request received.")
    else:
        assert status == 400 and json.loads(reply)["reason"] == "duplicate_header", reply


def test_repeatable_headers_are_not_refused(sidecar) -> None:
    headers = [*bearer("vip").items(), ("accept", "application/json"), ("accept", "text/event-stream"), ("x-forwarded-for", "10.0.0.1"),
               ("x-forwarded-for", "10.0.0.2")]
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200


def _read_response(conn: socket.socket) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 response with a content-length, read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), body[:length]


# head caps ------------------------------------------------------------------------------------

def test_a_70_kb_header_is_431_with_a_json_reason_and_the_connection_closed(sidecar, fake_upstream) -> None:
    engine, _ = fake_upstream
    before = len(engine.received)
    response = sidecar.client.post("/v1/chat/completions", json=CHAT, headers={**bearer("vip"), "x-padding": "a" * 70_000})
    body = refusal(response, 431, "headers_too_large")
    assert "16384 bytes" in body["error"]["message"] and response.headers["connection"] == "close"
    assert len(engine.received) == before
    # Under the cap (the default 16 KiB, request line and every header counted): served.
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers={**bearer("vip"), "x-padding": "a" * 15_000}).status_code == 200
    refusal(sidecar.metrics.get("/metrics", headers={"x-padding": "a" * 70_000}), 431, "headers_too_large")


def test_3000_headers_are_431_and_100_are_served(sidecar) -> None:
    many = [*bearer("vip").items(), *((f"x-h{i}", "1") for i in range(3000))]
    body = refusal(sidecar.client.post("/v1/chat/completions", json=CHAT, headers=many), 431, "headers_too_large")
    assert "more than 100 headers" in body["error"]["message"]
    # httpx adds host, accept, accept-encoding, connection, user-agent, content-length and content-type: 7 + 1 + 92 = 100.
    enough = [*bearer("vip").items(), *((f"x-h{i}", "1") for i in range(92))]
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers=enough).status_code == 200


def test_a_head_that_never_ends_is_answered_431_at_the_byte_cap(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", connection_limits=ConnectionLimits(max_header_bytes=4096))
    with socket.create_connection(("127.0.0.1", sidecar.server.port), timeout=10) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: pod\r\nx-endless: ")
        sent, status, reply = 0, None, b""
        conn.settimeout(0.2)
        while status is None and sent < 10_000_000:  # far past the cap: the sidecar answers long before
            try:
                conn.sendall(b"a" * 8192)
                sent += 8192
            except OSError:  # closed by the sidecar after its answer
                break
            try:
                reply = conn.recv(65536)
            except TimeoutError:
                continue
            status = int(reply.split()[1]) if reply else 0
        conn.settimeout(10)
        if status is None:
            reply = conn.recv(65536)
            status = int(reply.split()[1])
    assert status == 431 and sent < 1_000_000, (status, sent)
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["reason"] == "headers_too_large"


def test_the_caps_are_configurable(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model",
                            connection_limits=ConnectionLimits(max_header_bytes=2048, max_headers=20))
    refusal(sidecar.client.post("/v1/chat/completions", json=CHAT, headers={**bearer("vip"), "x-padding": "a" * 3000}), 431, "headers_too_large")
    refusal(sidecar.client.post("/v1/chat/completions", json=CHAT, headers=[*bearer("vip").items(), *((f"x-h{i}", "1") for i in range(20))]),
            431, "headers_too_large")
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers={**bearer("vip"), "x-padding": "a" * 1000}).status_code == 200


def test_the_flags_reach_the_options() -> None:
    from slaq.sidecar import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["sidecar", "--max-header-bytes", "8192", "--max-headers", "50", "--auth-failure-limit", "0",
                              "--auth-failure-window", "30s", "--auth-failure-log-lines", "2", "--engine-health-timeout", "0.5"])
    assert (args.max_header_bytes, args.max_headers, args.auth_failure_limit, args.auth_failure_window, args.auth_failure_log_lines,
            args.engine_health_timeout) == (8192, 50, 0, 30.0, 2, 0.5)
    defaults = parser.parse_args(["sidecar"])
    assert (defaults.max_header_bytes, defaults.max_headers, defaults.auth_failure_limit, defaults.auth_failure_window,
            defaults.auth_failure_log_lines) == (16384, 100, 10, 10.0, 10)


# failed authentication ------------------------------------------------------------------------

def test_auth_failures_allow_limit_per_window_then_say_when() -> None:
    failures = AuthFailures(AuthFailureLimits(limit=3, window_s=10.0))
    for t in (0.0, 1.0, 2.0):
        assert failures.retry_after("a", t) is None
        failures.failed("a", t)
    assert failures.retry_after("a", 2.5) == pytest.approx(7.5)  # until the failure at 0.0 leaves the window
    assert failures.retry_after("b", 2.5) is None  # per address
    assert failures.retry_after("a", 10.0) is None
    failures.failed("a", 10.0)  # one more try, then wait for the one at 1.0
    assert failures.retry_after("a", 10.0) == pytest.approx(1.0)
    failures.prune(30.0)
    assert len(failures) == 0
    assert AuthFailures(AuthFailureLimits(limit=0)).retry_after("a", 0.0) is None


def test_failure_lines_write_the_first_then_one_summary_per_window() -> None:
    lines = FailureLines(lines=2, window_s=10.0)
    written = [lines.admit("a", t, "unauthorized" if t < 3 else "auth_throttled") for t in range(6)]
    assert written == [True, True, False, False, False, False]
    assert lines.admit("b", 1.0, "unauthorized")  # per address
    assert lines.flush(9.9) == []
    assert lines.flush(10.0) == [{"client": "a", "from": 0.0, "until": 10.0, "suppressed": 4, "reasons": {"auth_throttled": 3, "unauthorized": 1}}]
    assert lines.flush(100.0) == []  # b left nothing out: no summary
    assert lines.admit("a", 100.0, "unauthorized")  # a new window


def test_an_address_with_too_many_failed_keys_is_throttled_and_others_are_not(start_sidecar, fake_upstream) -> None:
    # The sidecar trusts 127.0.0.1 as a proxy, so X-Forwarded-For names two client addresses.
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", trusted_proxies="127.0.0.1",
                            auth_failures=AuthFailureLimits(limit=3, window_s=60.0))
    guesser, other = {"x-forwarded-for": "10.0.0.1"}, {"x-forwarded-for": "10.0.0.2"}
    for _ in range(3):
        refusal(sidecar.client.post("/v1/chat/completions", json=CHAT, headers={**WRONG, **guesser}), 401, "unauthorized")
    throttled = sidecar.client.post("/v1/chat/completions", json=CHAT, headers={**bearer("vip"), **guesser})
    refusal(throttled, 429, "auth_throttled")  # even a right key: the address is refused before its key is looked at
    assert 50 <= int(throttled.headers["retry-after"]) <= 60
    refusal(sidecar.client.get("/v1/models", headers={**bearer("vip"), **guesser}), 429, "auth_throttled")
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers={**bearer("vip"), **other}).status_code == 200
    refusal(sidecar.client.post("/v1/chat/completions", json=CHAT, headers={**WRONG, **other}), 401, "unauthorized")
    assert 'slaq_rejections_total{reason="auth_throttled",tier="none"} 2.0' in sidecar.metrics.get("/metrics").text


def test_the_throttle_lifts_when_the_window_passes(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", auth_failures=AuthFailureLimits(limit=2, window_s=1.0))
    for _ in range(2):
        refusal(sidecar.client.post("/v1/chat/completions", json=CHAT, headers=WRONG), 401, "unauthorized")
    refusal(sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip")), 429, "auth_throttled")
    wait_for(lambda: sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip")).status_code == 200,
             what="served once the failures left the window")


def test_a_flood_of_wrong_keys_writes_a_few_lines_and_a_summary(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", auth_failures=AuthFailureLimits(limit=5, window_s=1.0, log_lines=3))
    buffer = capture(sidecar)
    statuses = [sidecar.client.post("/v1/chat/completions", json=CHAT, headers=WRONG).status_code for _ in range(40)]
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) <= {401, 429} and 429 in statuses
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers={**bearer("vip")}).status_code in (200, 429)
    summaries = wait_for(lambda: [line for line in access_lines(buffer) if line["event"] == "access_suppressed"], what="a summary line")
    requests = [line for line in access_lines(buffer) if line["event"] == "request" and line["reason"] in ("unauthorized", "auth_throttled")]
    assert len(requests) <= 3 * 2  # at most two windows started within the flood on a slow machine
    assert sum(s["suppressed"] for s in summaries) + len(requests) >= 40 - 3  # every failure written or counted
    summary = summaries[0]
    assert summary["client"] == "127.0.0.1" and set(summary["reasons"]) <= {"unauthorized", "auth_throttled"}
    assert summary["suppressed"] == sum(summary["reasons"].values()) and summary["from"] < summary["until"]


def test_without_sampling_every_failed_key_is_a_line(start_sidecar, fake_upstream) -> None:
    # The negative control: the same flood with sampling off writes a line each.
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model",
                            auth_failures=AuthFailureLimits(limit=0, window_s=60.0, log_lines=1000))
    buffer = capture(sidecar)
    for _ in range(20):
        sidecar.client.post("/v1/chat/completions", json=CHAT, headers=WRONG)
    wait_for(lambda: len(access_lines(buffer)) == 20, what="twenty access lines")
    assert {line["reason"] for line in access_lines(buffer)} == {"unauthorized"}


# a hung engine --------------------------------------------------------------------------------

@pytest.fixture
def engine_process():
    """The fake engine in a process of its own, so that it can be stopped (SIGSTOP) like a hung engine."""
    port = free_port()
    code = ("import uvicorn; from slaq.testing.fake_engine import FakeEngine; "
            f"uvicorn.run(FakeEngine(), host='127.0.0.1', port={port}, log_level='warning')")
    process = subprocess.Popen([sys.executable, "-c", code], env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return process.poll() is not None

    wait_for(up, what="the fake engine process up", timeout_s=30)
    assert process.poll() is None
    try:
        yield process, url
    finally:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_hung_engine_gets_new_requests_answered_503_and_recovers(start_sidecar, engine_process) -> None:
    process, url = engine_process
    sidecar = start_sidecar(url, served_model_name="fake-model", engine_health_timeout_s=0.5)
    client = httpx.Client(base_url=sidecar.url, timeout=30.0)  # a hang would show as this timing out
    try:
        assert client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip")).status_code == 200
        process.send_signal(signal.SIGSTOP)
        # Sent before the sidecar noticed: ended once the health check fails, not left to the 300 s engine-idle timeout.
        first = client.post("/v1/chat/completions", json=CHAT, headers=bearer("std"))
        refusal(first, 503, "engine_unavailable")
        assert first.headers["retry-after"] == "1"
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.json()["engine"] is False
        started = time.monotonic()
        later = client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip"))
        print(f"a new request to a pod whose engine is stopped: answered in {time.monotonic() - started:.3f} s")
        refusal(later, 503, "engine_unavailable")
        assert sidecar.app.core.gate.in_flight == 0 and sidecar.app.core.quotas.in_flight("vip") == 0  # reservations refunded
        # The scaling gauge keeps its capacity estimate while the engine is down (protected_load.py).
        assert sidecar.app.core.engine_ready is False
        capacity = sidecar.app.core.protected.capacity
        sidecar.app.core.protected_load()
        assert sidecar.app.core.protected.capacity == capacity

        process.send_signal(signal.SIGCONT)
        wait_for(lambda: client.get("/ready").status_code == 200, what="ready again once the engine answers")
        assert sidecar.app.core.engine_ready is True
        assert client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip")).status_code == 200
    finally:
        client.close()


# a defect inside the sidecar ----------------------------------------------------------------------

def test_a_defect_inside_the_sidecar_is_a_json_500_with_the_request_id_and_the_pod_serves_on(sidecar, caplog) -> None:
    """Not a refusal but a bug (here: building the engine's body fails once): the client gets the
    refusals' JSON shape (500 internal_error, its request id), not the server's bare 500; the traceback
    is logged under that id, the access log and slaq_requests_total say 500, and nothing leaks."""
    core = sidecar.app.core
    enriched_body = core.enriched_body
    failures = iter([RuntimeError("a defect")])

    def fails_once(*args, **kwargs):
        for failure in failures:
            raise failure
        return enriched_body(*args, **kwargs)

    core.enriched_body = fails_once
    buffer = capture(sidecar)
    failed = sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip"))
    refusal(failed, 500, "internal_error")
    request_id = failed.headers["x-request-id"]
    assert request_id in failed.json()["error"]["message"]
    assert any(request_id in record.getMessage() and record.exc_info for record in caplog.records)
    line = wait_for(lambda: [entry for entry in access_lines(buffer) if entry.get("request_id") == request_id], what="its access line")[0]
    assert (line["status"], line["reason"]) == (500, "internal_error")
    assert 'slaq_requests_total{code="500",tenant="vip",tier="critical"} 1.0' in sidecar.metrics.get("/metrics").text
    assert core.gate.in_flight == 0 and core.quotas.in_flight("vip") == 0
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip")).status_code == 200
