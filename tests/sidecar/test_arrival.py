"""TTFT from the door (arrival.py, issue 39): a request's clock starts when its first byte reached
the host, so a slow body and a busy event loop show in the TTFT histogram, the access log and the
SLO outcome; a request sent at once is the control."""

from __future__ import annotations

import io
import json
import socket
import threading
import time

import pytest

from slaq.sidecar.arrival import ARRIVED, door_wait_s, first_byte_stamp, since_last_data_s
from tests.sidecar.tables import KEYS
from tests.support.access_log import access_lines, capture
from tests.support.polling import wait_for

WAIT_S = 0.6  # the door wait the tests make; the fake engine answers in milliseconds
STREAM = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "stream": True}


def _head(body: bytes) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nhost: pod\r\nauthorization: Bearer {KEYS['vip']}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()


def _read_all(conn: socket.socket) -> bytes:
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def _ttft_sum(sidecar) -> float:
    text = sidecar.metrics.get("/metrics").text
    line = next(line for line in text.splitlines() if line.startswith('slaq_ttft_seconds_sum{tenant="vip"'))
    return float(line.rsplit(" ", 1)[1])


def _send(sidecar, *, body_after_s: float = 0.0) -> bytes:
    """One streaming VIP request over a raw socket; the body `body_after_s` after the head."""
    body = json.dumps(STREAM).encode()
    with socket.create_connection(("127.0.0.1", sidecar.server.port), timeout=10) as conn:
        if body_after_s:
            conn.sendall(_head(body))
            time.sleep(body_after_s)
            conn.sendall(body)
        else:
            conn.sendall(_head(body) + body)
        return _read_all(conn)


def _one_line(sidecar, buffer: io.StringIO, before: int) -> dict:
    wait_for(lambda: len(access_lines(buffer)) == before + 1, what="the request's access line")
    return access_lines(buffer)[-1]


def test_a_body_sent_late_counts_in_ttft_histogram_access_log_and_slo(sidecar) -> None:
    buffer = capture(sidecar)
    prompt = _send(sidecar)  # the control: head and body at once
    assert b" 200 " in prompt.split(b"\r\n", 1)[0] and b"[DONE]" in prompt
    line = _one_line(sidecar, buffer, 0)
    assert line["ttft_s"] < WAIT_S and line["slo"] == "met"
    before = _ttft_sum(sidecar)

    late = _send(sidecar, body_after_s=WAIT_S)
    assert b"[DONE]" in late
    line = _one_line(sidecar, buffer, 1)
    assert WAIT_S <= line["ttft_s"] <= line["e2e_s"]
    assert line["pipe_ahead"] == 0 and 0 <= line["handover_s"] < WAIT_S  # the door wait is before the release, not in the handover
    assert line["slo"] == "ttft_missed"  # the tenant's 50 ms objective, lost at the door
    assert _ttft_sum(sidecar) - before >= WAIT_S


def test_a_request_held_in_the_kernel_while_the_loop_is_busy_counts_from_its_receipt(sidecar) -> None:
    """The event loop blocked for WAIT_S: the request sits in the kernel, unread; its TTFT still
    counts from when the host received it (TCP_INFO), not from when the loop read it."""
    if not hasattr(socket, "TCP_INFO"):
        pytest.skip("no TCP_INFO on this platform: the stamp is the read")
    buffer = capture(sidecar)
    _send(sidecar)  # warm: the first request of the server pays for imports
    _one_line(sidecar, buffer, 0)
    loop = sidecar.app._tasks[0].get_loop()
    blocking = threading.Event()

    def block() -> None:
        blocking.set()
        time.sleep(WAIT_S)

    loop.call_soon_threadsafe(block)
    assert blocking.wait(5)
    answer = _send(sidecar)  # sent while the loop sleeps
    assert b"[DONE]" in answer
    line = _one_line(sidecar, buffer, 1)
    assert line["ttft_s"] >= WAIT_S - 0.1, line  # the kernel's clock ticks in ms; the send follows the block by a little
    assert line["slo"] == "ttft_missed"


def test_the_stamp_is_backdated_by_the_kernels_receipt() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as client:
        client.sendall(b"x")
        time.sleep(0.3)
        conn, _ = server.accept()
        with conn:
            if since_last_data_s(conn) is None:
                pytest.skip("no TCP_INFO on this platform")
            assert since_last_data_s(conn) >= 0.25
            assert time.monotonic() - first_byte_stamp(conn) >= 0.25


def test_without_tcp_info_the_stamp_is_now_and_without_a_stamp_there_is_no_door_wait() -> None:
    assert abs(first_byte_stamp(None) - time.monotonic()) < 0.05
    assert since_last_data_s(None) is None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        assert since_last_data_s(unix) is None
    assert door_wait_s({}) == 0.0
    assert 0.2 <= door_wait_s({ARRIVED: time.monotonic() - 0.2}) < 1.0
