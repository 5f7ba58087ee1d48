"""The sidecar as the tenant boundary: what a hostile tenant sends, and what reaches the engine.

Each test is one row of issue 25's table (a hostile request that worked through the old denylist
proxy), against the fake engine here; the rows that need vLLM itself are in test_engine_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from slaq.api.pool import RequestLimitsSpec
from slaq.sidecar.connections import ConnectionLimits
from slaq.sidecar.errors import InvalidField, SidecarError
from slaq.sidecar.fields import ALLOWLISTS, BodyLimits, allowlist_markdown, salted_uuid
from slaq.sidecar.payload import parse_payload
from slaq.sidecar.proxy import ENGINE_REQUEST_HEADERS, REQUEST_ID_HEADER, forward_request_headers
from slaq.sidecar.service import CoreConfig, SidecarCore
from slaq.sidecar.tenants import TenantDirectory
from tests.sidecar.tables import KEYS, abc_table, bearer
from slaq.testing.fake_engine import fake_user
from tests.support.polling import wait_for

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
COMPLETION = {"model": "fake-model", "prompt": "hello", "max_tokens": 5}
SET_BY_THE_SIDECAR = {"priority", "cache_salt", "vllm_xargs"}
ISSUE_FIELDS = ["kv_transfer_params", "ec_transfer_params", "request_id", "session_id", "mm_processor_kwargs", "media_io_kwargs",
                "chat_template_kwargs", "chat_template", "structured_outputs", "priority", "cache_salt", "vllm_xargs", "prompt_embeds"]


def limits(**spec) -> BodyLimits:
    return BodyLimits(RequestLimitsSpec(**spec), max_model_len=512)


# -- body allowlist -----------------------------------------------------------------------------
@pytest.mark.parametrize("field", ISSUE_FIELDS)
@pytest.mark.parametrize("kind,body", [("chat", CHAT), ("completions", COMPLETION)])
def test_a_field_outside_the_allowlist_is_refused_naming_it(kind: str, body: dict, field: str) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_payload(json.dumps({**body, field: {"x": 1}}).encode(), kind, None, limits())  # type: ignore[arg-type]
    assert refused.value.field == field and field in refused.value.message


@pytest.mark.parametrize("kind,body,problem", [
    ("completions", {**COMPLETION, "max_tokens": 513}, "max_tokens"),
    ("completions", {**COMPLETION, "n": 5}, "n"),
    ("completions", {**COMPLETION, "prompt": ["a"] * 9}, "prompt"),
    ("completions", {**COMPLETION, "use_beam_search": True}, "use_beam_search"),
    ("completions", {**COMPLETION, "stop": ["s"] * 9}, "stop"),
    ("completions", {**COMPLETION, "logit_bias": {str(i): 1 for i in range(65)}}, "logit_bias"),
    ("completions", {**COMPLETION, "logprobs": 6}, "logprobs"),
    ("completions", {**COMPLETION, "stream_interval": 0}, "stream_interval"),
    ("chat", {**CHAT, "top_logprobs": 6}, "top_logprobs"),
    ("chat", {**CHAT, "max_completion_tokens": 10**6}, "max_completion_tokens"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": "x"}] * 257}, "messages"),
    ("chat", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}] * 65}, "tools"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": "x", "media_io_kwargs": {}}]}, "messages[0].media_io_kwargs"),
    ("chat", {**CHAT, "stream_options": {"include_usage": True, "secret": 1}}, "stream_options"),
])
def test_bounds_come_from_the_pool(kind: str, body: dict, problem: str) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_payload(json.dumps(body).encode(), kind, None, limits())  # type: ignore[arg-type]
    assert refused.value.field == problem


def test_beam_search_and_larger_n_where_the_pool_allows_them() -> None:
    payload = parse_payload(json.dumps({**COMPLETION, "use_beam_search": True, "n": 8}).encode(), "completions", None,
                            limits(allow_beam_search=True, max_n=8))
    assert payload.n == 8


def test_n_times_prompts_is_the_number_of_completions() -> None:
    payload = parse_payload(json.dumps({**COMPLETION, "prompt": ["a", "b", "c"], "n": 2}).encode(), "completions", None, limits())
    assert payload.n == 6


def test_multimodal_uuids_are_rewritten_under_the_tenants_salt() -> None:
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}, "uuid": "cat"}
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": [part]}]}).encode()
    a = parse_payload(body, "chat", None, limits(), cache_salt="salt-a").body["messages"][0]["content"][0]["uuid"]
    b = parse_payload(body, "chat", None, limits(), cache_salt="salt-b").body["messages"][0]["content"][0]["uuid"]
    assert a == salted_uuid("cat", "salt-a") and b == salted_uuid("cat", "salt-b") and a != b and "cat" not in (a, b)


@pytest.mark.parametrize("kind", ["image_url", "video_url", "audio_url"])
@pytest.mark.parametrize("url", ["https://example.invalid/cat.png", "http://127.0.0.1:9090/slaq/usage", "file:///etc/passwd"])
def test_media_by_url_must_be_inline_the_engine_fetches_nothing_for_a_tenant(kind: str, url: str) -> None:
    part = {"type": kind, kind: {"url": url}}
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": [part]}]}).encode()
    with pytest.raises(InvalidField) as refused:
        parse_payload(body, "chat", None, limits())
    assert refused.value.field == f"messages[0].content[0].{kind}.url"


def test_embeddings_as_content_parts_are_refused() -> None:
    part = {"type": "image_embeds", "image_embeds": "AAAA"}
    with pytest.raises(InvalidField, match=r"messages\[0\]\.content\[0\]"):
        parse_payload(json.dumps({**CHAT, "messages": [{"role": "user", "content": [part]}]}).encode(), "chat", None, limits())


def test_the_docs_table_is_the_allowlist() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "sidecar" / "README.md").read_text(encoding="utf-8")
    assert allowlist_markdown() in doc


# -- property: nothing outside the allowlist is forwarded ------------------------------------------
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 600), st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.text(max_size=8), st.lists(st.integers(0, 50), max_size=4), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
_FIELD_NAMES = st.one_of(st.sampled_from(sorted(set(ALLOWLISTS["chat"]) | set(ALLOWLISTS["completions"]))), st.sampled_from(ISSUE_FIELDS),
                         st.text(min_size=1, max_size=12))
_HEADER_NAMES = st.one_of(st.sampled_from(["x-vllm-priority", "x-request-id", "x-data-parallel-rank", "x-session-id", "endpoint-load-metrics-format",
                                           "content-type", "accept", "traceparent", "authorization", "x-llm-d-slo-ttft-ms"]),
                          st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True))


def _core() -> SidecarCore:
    return SidecarCore(CoreConfig(limits=limits()), TenantDirectory.from_table(abc_table()))


def test_a_body_refused_for_the_token_rate_costs_a_request_of_the_rate() -> None:
    """Refused for its tokens only once it was parsed and counted: without a request charged for it, a
    tenant out of tokens could have the pod parse its bodies for free, as often as it liked."""
    core = SidecarCore(CoreConfig(limits=limits()), TenantDirectory.from_table(abc_table(free={"requests_per_minute": 3.0, "tokens_per_minute": 100.0})))
    identity = core.identify(bearer("free"))
    body = json.dumps({**COMPLETION, "max_tokens": 90}).encode()
    core.check_in(identity, "completions", body)  # admitted: the bucket is nearly empty now
    reasons = []
    for _ in range(3):
        with pytest.raises(SidecarError) as refused:
            core.check_in(identity, "completions", body)
        reasons.append(refused.value.reason)
    assert reasons == ["token_rate", "token_rate", "request_rate"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["chat", "completions"]), extra=st.dictionaries(_FIELD_NAMES, _VALUES, max_size=6),
       headers=st.dictionaries(_HEADER_NAMES, st.text(alphabet="abc-019", max_size=8), max_size=6), stream=st.booleans())
def test_nothing_forwarded_holds_a_field_or_header_outside_the_allowlist(kind: str, extra: dict, headers: dict, stream: bool) -> None:
    core = _core()
    body = {**(CHAT if kind == "chat" else COMPLETION), **extra, "stream": stream}
    identity = core.identify(bearer("free"))
    try:
        flight = core.check_in(identity, kind, json.dumps(body).encode())  # type: ignore[arg-type]
    except InvalidField as refused:
        assert refused.field == "n" or refused.field in body or refused.field.split("[", 1)[0] in body
        return
    sent = json.loads(core.enriched_body(flight))
    assert set(sent) <= set(ALLOWLISTS[kind]) | SET_BY_THE_SIDECAR
    assert sent["priority"] == 2 and sent["vllm_xargs"]["slaq_tier"] == "batch"
    forwarded = forward_request_headers(headers, "id-1")
    assert set(forwarded) <= set(ENGINE_REQUEST_HEADERS) | {REQUEST_ID_HEADER} and forwarded[REQUEST_ID_HEADER] == "id-1"


def test_the_property_has_teeth() -> None:
    """Negative control: the old pass-through (strip three fields) forwards what the property refuses."""
    from slaq.api.contract import CLIENT_FIELDS_STRIPPED

    body = {**COMPLETION, "kv_transfer_params": {"do_remote_prefill": True}}
    old = {k: v for k, v in body.items() if k not in CLIENT_FIELDS_STRIPPED}
    assert not set(old) <= set(ALLOWLISTS["completions"]) | SET_BY_THE_SIDECAR


# -- fan-out, refunds, accounting (HTTP, fake engine) ------------------------------------------------
def test_n_and_prompt_batches_count_against_concurrency(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], abc_table(free={"max_concurrency": 8}), served_model_name="fake-model",
                            request_limits=RequestLimitsSpec(max_n=16, max_prompt_batch=64))
    refused = sidecar.client.post("/v1/completions", json={**COMPLETION, "n": 16}, headers=bearer("free"))
    assert refused.status_code == 400 and refused.json()["reason"] == "invalid_field" and "n:" in refused.json()["error"]["message"]
    batch = sidecar.client.post("/v1/completions", json={**COMPLETION, "prompt": ["p"] * 9}, headers=bearer("free"))
    assert batch.status_code == 400
    core = sidecar.app.core

    async def two_of_four() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=sidecar.url, timeout=30) as client:
            slow = {**COMPLETION, "n": 4, "stream": True, "user": fake_user(delay_ms=300)}
            first = asyncio.create_task(client.post("/v1/completions", json=slow, headers=bearer("free")))
            await asyncio.to_thread(wait_for, lambda: core.quotas.in_flight("free") == 4, 10.0, "four completions in flight")
            second = asyncio.create_task(client.post("/v1/completions", json=slow, headers=bearer("free")))
            await asyncio.to_thread(wait_for, lambda: core.quotas.in_flight("free") == 8, 10.0, "eight completions in flight")
            third = await client.post("/v1/completions", json={**COMPLETION, "n": 1}, headers=bearer("free"))
            return [await first, await second, third]

    first, second, third = asyncio.run(two_of_four())
    assert (first.status_code, second.status_code, third.status_code) == (200, 200, 429)
    assert third.json()["reason"] == "concurrency" and core.quotas.in_flight("free") == 0


def _tokens_left(core: SidecarCore, tenant: str) -> float:
    state = core.quotas._states[tenant]
    state.tokens._refill(core.clock())
    return state.tokens.level


def test_an_engine_refusal_refunds_the_reservation(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], abc_table(std={"tokens_per_minute": 600.0}), served_model_name="fake-model")
    for _ in range(5):  # each reserves 2 x 200 tokens: without the refund the third is refused for 40 s
        response = sidecar.client.post("/v1/completions", json={**COMPLETION, "n": 2, "max_tokens": 200, "user": fake_user(status=400)},
                                       headers=bearer("std"))
        assert response.status_code == 400 and response.json()["reason"] == "engine_400"
    assert _tokens_left(sidecar.app.core, "std") > 590


def test_an_unreachable_engine_refunds_the_reservation(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], abc_table(std={"tokens_per_minute": 600.0}), served_model_name="fake-model")
    sidecar.app.engine.base_url = "http://127.0.0.1:1"
    for client in sidecar.app.engine.clients:
        client.base_url = "http://127.0.0.1:1"
    for _ in range(3):
        assert sidecar.client.post("/v1/completions", json={**COMPLETION, "max_tokens": 250}, headers=bearer("std")).status_code == 503
    assert _tokens_left(sidecar.app.core, "std") > 590


def test_an_engine_that_times_out_keeps_the_reservation(start_sidecar, fake_upstream) -> None:
    """Past the engine-idle timeout the engine may have worked on the request all along (a long
    non-streamed answer): 504, and the reservation is charged, not refunded as for an unreachable engine."""
    slow_engine = ConnectionLimits(header_s=5.0, body_s=5.0, write_idle_s=5.0, engine_idle_s=0.3, max_connections=64)
    sidecar = start_sidecar(fake_upstream[1], abc_table(std={"tokens_per_minute": 600.0}), served_model_name="fake-model",
                            connection_limits=slow_engine)
    response = sidecar.client.post("/v1/completions", json={**COMPLETION, "max_tokens": 250, "user": fake_user(delay_ms=1500)},
                                   headers=bearer("std"))
    assert response.status_code == 504 and response.json()["reason"] == "engine_timeout", response.text
    assert _tokens_left(sidecar.app.core, "std") < 450  # 250 reserved (a refund would leave > 590)


def test_a_client_that_leaves_while_queued_is_refunded(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], abc_table(std={"tokens_per_minute": 6000.0}), served_model_name="fake-model")
    core = sidecar.app.core
    core.gate.max_in_flight = 1

    async def leave_the_queue() -> None:
        async with httpx.AsyncClient(base_url=sidecar.url, timeout=30) as client:
            holder = asyncio.create_task(client.post("/v1/completions", json={**COMPLETION, "stream": True, "user": fake_user(delay_ms=400)},
                                                     headers=bearer("vip")))
            await asyncio.to_thread(wait_for, lambda: core.gate.in_flight == 1, 10.0, "holder released")
            leaver = asyncio.create_task(client.post("/v1/completions", json={**COMPLETION, "max_tokens": 2000}, headers=bearer("std")))
            await asyncio.to_thread(wait_for, lambda: len(core.queue) == 1, 10.0, "leaver queued")
            leaver.cancel()
            await asyncio.gather(leaver, return_exceptions=True)
            await holder

    asyncio.run(leave_the_queue())
    wait_for(lambda: core.quotas.in_flight("std") == 0, 10.0, "leaver settled")
    assert _tokens_left(core, "std") > 5990


def test_a_request_shed_from_the_queue_is_refunded(start_sidecar, fake_upstream) -> None:
    """A batch request whose objective passes while it waits is shed (503 ttft_unreachable): the
    engine never had it, so its reservation flows back as for a client that left the queue."""
    sidecar = start_sidecar(fake_upstream[1], abc_table(free={"ttft_ms": 300.0, "tokens_per_minute": 6000.0}), served_model_name="fake-model")
    core = sidecar.app.core
    core.gate.max_in_flight = 1

    async def shed_while_queued() -> httpx.Response:
        async with httpx.AsyncClient(base_url=sidecar.url, timeout=30) as client:
            holder = asyncio.create_task(client.post("/v1/completions", json={**COMPLETION, "stream": True, "user": fake_user(delay_ms=400)},
                                                     headers=bearer("vip")))
            await asyncio.to_thread(wait_for, lambda: core.gate.in_flight == 1, 10.0, "holder released")
            shed = await client.post("/v1/completions", json={**COMPLETION, "max_tokens": 2000}, headers=bearer("free"))
            await holder
            return shed

    shed = asyncio.run(shed_while_queued())
    assert shed.status_code == 503 and shed.json()["reason"] == "ttft_unreachable", shed.text
    wait_for(lambda: core.quotas.in_flight("free") == 0, 10.0, "the shed request settled")
    assert _tokens_left(core, "free") > 5990  # charged, 2,000 would be gone


def test_a_stream_is_charged_the_engines_usage_and_the_client_sees_no_usage_chunk(sidecar, fake_upstream) -> None:
    with sidecar.client.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True, "max_tokens": 12, "prompt": "x" * 400},
                               headers=bearer("vip")) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert all('"usage"' not in event for event in events) and events[-1] == "[DONE]"
    assert fake_upstream[0].received[-1]["stream_options"] == {"include_usage": True}
    # The fake engine's usage says 7 prompt tokens; the estimate (chars / 4) would have charged 100.
    settled = ('slaq_tokens_total{direction="in",tenant="vip",tier="critical"} 7.0', 'slaq_tokens_total{direction="out",tenant="vip",tier="critical"} 12.0')
    wait_for(lambda: all(line in sidecar.metrics.get("/metrics").text for line in settled), 10.0, "tokens settled from the engine's usage")
    asked = sidecar.client.post("/v1/completions", json={**COMPLETION, "stream": True, "stream_options": {"include_usage": True}}, headers=bearer("vip"))
    assert '"usage"' in asked.text


def test_a_tenant_at_its_limit_is_refused_before_its_body_is_read(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], abc_table(free={"requests_per_minute": 1.0}), served_model_name="fake-model")
    assert sidecar.client.post("/v1/completions", json=COMPLETION, headers=bearer("free")).status_code == 200
    with socket.create_connection(("127.0.0.1", sidecar.server.port), timeout=10) as sock:
        # A head announcing 4 MiB and no body: the refusal comes without the body.
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEYS['free']}\r\n"
                     f"content-type: application/json\r\ncontent-length: {4 << 20}\r\n\r\n".encode())
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 429") and b"request_rate" in answer


def test_refused_bodies_cost_the_sender_its_request_rate(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], abc_table(free={"requests_per_minute": 2.0}), served_model_name="fake-model")
    for bad in ({**COMPLETION, "kv_transfer_params": {}}, {**COMPLETION, "n": 0}):
        assert sidecar.client.post("/v1/completions", json=bad, headers=bearer("free")).status_code == 400
    refused = sidecar.client.post("/v1/completions", json=COMPLETION, headers=bearer("free"))
    assert refused.status_code == 429 and refused.json()["reason"] == "request_rate"


def test_the_body_cap_follows_the_pools_context(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", max_model_len=512)  # 512 x 16 B < 64 KiB floor
    assert sidecar.app.max_body_bytes == 64 * 1024
    big = sidecar.client.post("/v1/completions", json={**COMPLETION, "prompt": "x" * (70 * 1024)}, headers=bearer("std"))
    assert big.status_code == 413 and big.json()["reason"] == "body_too_large"


# -- slow clients ------------------------------------------------------------------------------------
FAST = ConnectionLimits(header_s=0.5, body_s=0.5, write_idle_s=0.5, engine_idle_s=5.0, max_connections=64)


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before closing the connection; fails if it is still open after `seconds`."""
    sock.settimeout(seconds)
    received = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk


def test_partial_heads_and_silent_connections_are_closed(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", connection_limits=FAST)
    silent = [socket.create_connection(("127.0.0.1", sidecar.server.port)) for _ in range(5)]
    partial = [socket.create_connection(("127.0.0.1", sidecar.server.port)) for _ in range(5)]
    for sock in partial:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
    started = time.monotonic()
    for sock in silent + partial:
        assert _closed_within(sock, 5.0) == b""
        sock.close()
    assert time.monotonic() - started < 5.0
    assert sidecar.client.post("/v1/completions", json=COMPLETION, headers=bearer("vip")).status_code == 200  # keep-alive still works


def test_a_body_that_never_finishes_gets_408(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", connection_limits=FAST)
    with socket.create_connection(("127.0.0.1", sidecar.server.port)) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEYS['std']}\r\n"
                     f"content-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"prompt\":".encode())
        answer = _closed_within(sock, 5.0)
    assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout" in answer


def test_a_408_closes_the_connection_at_once(start_sidecar, fake_upstream) -> None:
    """The rest of a timed-out body would be parsed as the next request: the 408 closes the connection
    (with a 5 s head timeout, an open connection would stay up 5 s more)."""
    limits = ConnectionLimits(header_s=5.0, body_s=0.5, write_idle_s=5.0, engine_idle_s=5.0, max_connections=64)
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", connection_limits=limits)
    with socket.create_connection(("127.0.0.1", sidecar.server.port)) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEYS['std']}\r\n"
                     f"content-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"prompt\":".encode())
        sent = time.monotonic()
        answer = _closed_within(sock, 10.0)
    assert answer.startswith(b"HTTP/1.1 408") and b"connection: close" in answer.lower()
    assert time.monotonic() - sent < 3.0


def test_a_client_that_never_reads_is_cut_off_and_frees_its_slot(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", connection_limits=FAST)
    body = json.dumps({**COMPLETION, "stream": True, "max_tokens": 16, "user": fake_user(tokens=20000)}).encode()
    sock = socket.create_connection(("127.0.0.1", sidecar.server.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEYS['std']}\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(body)}\r\n\r\n".encode() + body)
    try:
        wait_for(lambda: sidecar.app.core.quotas.in_flight("std") == 1, 10.0, "the stream started")
        wait_for(lambda: sidecar.app.core.quotas.in_flight("std") == 0, 20.0, "the unread stream cut off")
    finally:
        sock.close()
    assert sidecar.client.post("/v1/completions", json=COMPLETION, headers=bearer("vip")).status_code == 200


async def test_two_big_pathological_bodies_do_not_stall_a_vip_request(start_sidecar, fake_upstream) -> None:
    """4 MiB of one-element lists each (half a second of json.loads apiece on this machine, on the event
    loop, under the old 16 MiB cap): with the pool's cap they are cut off at 64 KiB, unparsed.
    Timing-sensitive by nature: the bound is loose (VIP alone takes ~20 ms here)."""
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", max_model_len=1024)
    pathological = b'{"model":"fake-model","max_tokens":5,"prompt":[' + b",".join([b"[1]"] * 1_000_000) + b"]}"
    async with httpx.AsyncClient(base_url=sidecar.url, timeout=60) as client:
        async def big() -> int:
            try:
                return (await client.post("/v1/completions", content=pathological, headers={**bearer("free"), "content-type": "application/json"})).status_code
            except httpx.HTTPError:  # the sidecar answered 413 and closed while the body was still going out
                return 413

        async def vip() -> float:
            started = time.perf_counter()
            assert (await client.post("/v1/completions", json=COMPLETION, headers=bearer("vip"))).status_code == 200
            return time.perf_counter() - started

        await vip()  # a warm connection
        bigs = [asyncio.create_task(big()) for _ in range(2)]
        times = [await vip() for _ in range(8)]
        statuses = await asyncio.gather(*bigs)
    assert statuses == [413, 413]
    assert max(times) < 0.5, f"VIP took {max(times) * 1000:.0f} ms beside the big bodies"


def test_the_connection_limit_answers_503_beyond_it(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model",
                            connection_limits=ConnectionLimits(header_s=5.0, max_connections=4))
    held = [socket.create_connection(("127.0.0.1", sidecar.server.port)) for _ in range(4)]
    try:
        time.sleep(0.2)
        with httpx.Client(base_url=sidecar.url, timeout=10) as fresh:
            assert fresh.post("/v1/completions", json=COMPLETION, headers=bearer("vip")).status_code == 503
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: httpx.post(sidecar.url + "/v1/completions", json=COMPLETION, headers=bearer("vip"), timeout=10).status_code == 200,
             10.0, "served again once the held connections closed")


def test_the_request_id_is_returned_and_logged(sidecar, fake_upstream) -> None:
    import io
    import logging

    buffer = io.StringIO()
    sidecar.app.access.attach(buffer)
    response = sidecar.client.post("/v1/completions", json=COMPLETION, headers={**bearer("vip"), "x-request-id": "client-chosen"})
    refused = sidecar.client.post("/v1/completions", json={**COMPLETION, "request_id": "mine"}, headers=bearer("vip"))
    wait_for(lambda: len(buffer.getvalue().splitlines()) == 2, 10.0, "two access lines")
    logged = [json.loads(line)["request_id"] for line in buffer.getvalue().splitlines()]
    assert sorted(logged) == sorted([response.headers["x-request-id"], refused.headers["x-request-id"]]) and "client-chosen" not in logged
    assert fake_upstream[0].received_headers[-1]["x-request-id"] == response.headers["x-request-id"]
    logging.getLogger("slaq.access").handlers = []
