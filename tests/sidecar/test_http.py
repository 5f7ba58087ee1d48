"""The sidecar over HTTP against the fake upstream: proxying, enrichment and every refusal path."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.sidecar.conftest import write_table
from slaq.testing.fake_engine import fake_user
from tests.support.polling import wait_for
from tests.sidecar.tables import abc_table, bearer

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
COMPLETION = {"model": "fake-model", "prompt": "hello", "max_tokens": 5}


def refusal(response: httpx.Response, status: int, reason: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["reason"] == reason, body
    assert body["error"]["message"]
    return body


def test_streaming_completion_passes_through_and_is_enriched(sidecar, fake_upstream) -> None:
    engine, _ = fake_upstream
    body = {**COMPLETION, "stream": True}
    with sidecar.client.stream("POST", "/v1/completions", json=body, headers={**bearer("free"), "x-vllm-priority": "-1000000", "x-request-id": "mine"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        request_id = response.headers["x-request-id"]
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert len(events) == 6 and events[-1] == "data: [DONE]"  # no usage chunk: the client did not ask for it
    sent = engine.received[-1]
    assert sent["priority"] == 2 and sent["vllm_xargs"]["slaq_tier"] == "batch"
    assert sent["stream_options"] == {"include_usage": True}  # the sidecar settles tokens from the engine's usage
    assert set(engine.received_headers[-1]) <= {"content-type", "accept", "x-request-id", "host", "content-length", "accept-encoding", "connection", "user-agent"}
    assert engine.received_headers[-1]["x-request-id"] == request_id != "mine" and "x-vllm-priority" not in engine.received_headers[-1]


def test_non_streaming_chat(sidecar, fake_upstream) -> None:
    response = sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip"))
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 5
    assert fake_upstream[0].received[-1]["priority"] == 0


def test_streaming_chat_records_ttft_and_tokens(sidecar) -> None:
    with sidecar.client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=bearer("std")) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    metrics = sidecar.metrics.get("/metrics").text
    assert 'slaq_tokens_total{direction="out",tenant="std",tier="standard"} 5.0' in metrics
    assert 'slaq_ttft_seconds_count{tenant="std",tier="standard"} 1.0' in metrics
    assert 'slaq_queue_depth{tier="critical"} 0.0' in metrics
    assert "slaq_sidecar_added_seconds_count 1.0" in metrics
    assert "slaq_sla_risk " in metrics


def test_models_requires_a_key_and_proxies(sidecar) -> None:
    refusal(sidecar.client.get("/v1/models"), 401, "unauthorized")
    assert sidecar.client.get("/v1/models", headers=bearer("vip")).json()["data"][0]["id"] == "fake-model"


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer sk-stolen"}, {"authorization": "Token x"}])
def test_unauthorized(sidecar, headers) -> None:
    response = sidecar.client.post("/v1/chat/completions", json=CHAT, headers=headers)
    refusal(response, 401, "unauthorized")
    assert response.headers["www-authenticate"] == "Bearer"


def test_request_rate_429_with_retry_after(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], abc_table(std={"requests_per_minute": 2.0}))
    for _ in range(2):
        assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("std")).status_code == 200
    response = sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("std"))
    refusal(response, 429, "request_rate")
    assert int(response.headers["retry-after"]) == 30
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip")).status_code == 200
    usage = sidecar.metrics.get("/slaq/usage").json()
    assert usage["pool"] == "ns/pool" and usage["tenants"]["std"]["refusedPerMinute"] == 1


def test_token_rate_429_counts_reserved_max_tokens(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], abc_table(std={"tokens_per_minute": 1000.0}))
    response = sidecar.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 990}, headers=bearer("std"))
    assert response.status_code == 200  # 990 reserved, 5 produced: the rest flows back
    assert sidecar.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 900}, headers=bearer("std")).status_code == 200
    # two requests used 2 x (7 + 16) tokens: ~954 left, so a 980-token reservation does not fit
    refusal(sidecar.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 980}, headers=bearer("std")), 429, "token_rate")


async def test_concurrency_429_and_batch_shed_503_when_saturated(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1], abc_table(std={"max_concurrency": 20}), max_queue_depth=4)
    sidecar.app.core.gate.max_in_flight = 2  # the fake engine never queues: cap what reaches it
    slow = {**CHAT, "stream": True}
    async with httpx.AsyncClient(base_url=sidecar.url, timeout=30) as client:
        async def call(tenant: str, delay_ms: int = 1500) -> httpx.Response:
            return await client.post("/v1/chat/completions", json={**slow, "user": fake_user(delay_ms=delay_ms)}, headers=bearer(tenant))

        holders = [asyncio.create_task(call("std")) for _ in range(4)]  # 2 at the engine, 2 queued
        await asyncio.to_thread(wait_for, lambda: len(sidecar.app.core.queue) == 2, 10.0, "two queued")
        shed = await call("free", 0)
        refusal(shed, 503, "shedding")
        assert int(shed.headers["retry-after"]) >= 1
        more = [asyncio.create_task(call("std")) for _ in range(16)]
        responses = await asyncio.gather(*holders, *more)
    reasons = [r.json()["reason"] for r in responses if r.status_code != 200]
    assert "concurrency" in reasons or "queue_full" in reasons
    assert all(r.status_code in (200, 429, 503) for r in responses)
    metrics = sidecar.metrics.get("/metrics").text
    assert 'slaq_rejections_total{reason="shedding",tier="batch"} 1.0' in metrics


def test_engine_error_keeps_its_status_and_gains_a_reason(sidecar) -> None:
    response = sidecar.client.post("/v1/chat/completions", json={**CHAT, "user": fake_user(status=400)}, headers=bearer("vip"))
    body = refusal(response, 400, "engine_400")
    assert body["error"]["message"] == "fake engine refused"




def test_a_stream_the_engine_breaks_ends_with_an_error_event_not_done(sidecar) -> None:
    body = {**COMPLETION, "stream": True}
    with sidecar.client.stream("POST", "/v1/completions", json={**body, "user": fake_user(**{"break": 1})}, headers=bearer("vip")) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    assert json.loads(events[0])["choices"][0]["text"] == "tok "  # the token sent before the break got through
    last = json.loads(events[-1])
    assert last["reason"] == "engine_stream_broken" and last["error"]["code"] == 502, last
    wait_for(lambda: sidecar.app.core.quotas.in_flight("vip") == 0, what="the broken request to be settled")
    assert 'slaq_requests_total{code="502",tenant="vip",tier="critical"} 1.0' in sidecar.metrics.get("/metrics").text


def test_unreachable_engine(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1])
    fake_upstream[0].healthy = False
    wait_for(lambda: sidecar.client.get("/ready").status_code == 503, what="not ready")
    assert sidecar.client.get("/ready").json()["engine"] is False
    assert sidecar.client.get("/health").status_code == 200
    fake_upstream[0].healthy = True
    wait_for(lambda: sidecar.client.get("/ready").status_code == 200, what="ready again")


def test_no_engine_listening_is_503_engine_unavailable(start_sidecar, fake_upstream, tmp_path) -> None:
    sidecar = start_sidecar(fake_upstream[1])
    for client in sidecar.app.engine.clients:
        client._base_url = httpx.URL("http://127.0.0.1:9")  # nothing listens on the discard port
    response = sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip"))
    refusal(response, 503, "engine_unavailable")
    assert sidecar.app.core.gate.in_flight == 0 and sidecar.app.core.quotas.in_flight("vip") == 0


def test_table_reload_keeps_in_flight_and_applies_to_new_requests(sidecar) -> None:
    with sidecar.client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True, "user": fake_user(delay_ms=100)},
                               headers=bearer("vip")) as response:
        lines = response.iter_lines()
        first = next(lines)
        table = abc_table("r2")
        table.tenants = [t for t in table.tenants if t.name != "vip"]
        write_table(sidecar.table_path, table)
        wait_for(lambda: sidecar.metrics.get("/slaq/usage").json()["tableRevision"] == "r2", what="reload")
        rest = [line for line in lines if line]
    assert first.startswith("data: ") and rest[-1] == "data: [DONE]"
    refusal(sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("vip")), 401, "unauthorized")
    assert sidecar.client.post("/v1/chat/completions", json=CHAT, headers=bearer("std")).status_code == 200


async def test_client_leaving_the_queue_frees_its_place(start_sidecar, fake_upstream) -> None:
    sidecar = start_sidecar(fake_upstream[1])
    core = sidecar.app.core
    core.gate.max_in_flight = 1
    async with httpx.AsyncClient(base_url=sidecar.url, timeout=30) as client:
        holder = asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "stream": True, "user": fake_user(delay_ms=800)}, headers=bearer("std")))
        await asyncio.to_thread(wait_for, lambda: core.gate.in_flight == 1, 10.0, "holder released")
        leaver = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=bearer("std")))
        await asyncio.to_thread(wait_for, lambda: len(core.queue) == 1, 10.0, "queued")
        leaver.cancel()
        await asyncio.to_thread(wait_for, lambda: len(core.queue) == 0, 10.0, "left the queue")
        assert (await holder).status_code == 200
    wait_for(lambda: core.quotas.in_flight("std") == 0, what="settled")


def test_unknown_route_and_wrong_method(sidecar) -> None:
    refusal(sidecar.client.get("/v1/embeddings"), 404, "not_found")
    refusal(sidecar.client.get("/v1/chat/completions", headers=bearer("vip")), 405, "method_not_allowed")
