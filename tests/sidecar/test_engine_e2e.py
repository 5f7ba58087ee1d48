"""End to end through the sidecar to a real `slaq engine` (tiny model, CPU, SLAScheduler).

A recording passthrough sits between the sidecar and the engine, so the tests see exactly what
the engine received; the engine's own /metrics prove prefix-cache isolation between tenants.
"""

from __future__ import annotations

import asyncio
import json
from typing import Iterator

import httpx
import pytest

from slaq.sidecar.server import SidecarOptions, build_app
from tests.sidecar.conftest import RunningSidecar, write_table
from tests.support.polling import wait_for
from tests.sidecar.tables import abc_table, bearer
from slaq.testing.fake_engine import RecordingPassthrough, ServerThread

pytestmark = pytest.mark.engine

MODEL = "slaq-tiny"


@pytest.fixture(scope="module")
def wiretap(slaq_engine) -> Iterator[RecordingPassthrough]:
    tap = RecordingPassthrough(slaq_engine.base_url)
    server = ServerThread(tap).start()
    tap.url = server.url  # type: ignore[attr-defined]
    yield tap
    server.stop()


@pytest.fixture(scope="module")
def real(tmp_path_factory, wiretap, slaq_engine) -> Iterator[RunningSidecar]:
    from slaq.engine.tiny_model import ensure_tiny_model

    path = tmp_path_factory.mktemp("e2e") / "tenants.json"
    write_table(path, abc_table(std={"requests_per_minute": 600.0}))
    options = SidecarOptions(host="127.0.0.1", port=0, engine_url=wiretap.url, tenant_table=path,  # type: ignore[attr-defined]
                             served_model_name=MODEL, tokenizer=str(ensure_tiny_model()), max_queue_depth=2)
    app = build_app(options)
    running = RunningSidecar(app, path)
    running.client.timeout = httpx.Timeout(120.0)
    wait_for(lambda: running.client.get("/ready").status_code == 200, 60.0, "sidecar ready in front of the engine")
    yield running
    running.stop()


def engine_counter(engine_url: str, name: str) -> float:
    text = httpx.get(engine_url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


def test_tokenizer_counts_prompt_tokens(real) -> None:
    assert type(real.app.core.counter).__name__ == "TokenizerCounter"


def test_non_streaming_completion_and_chat(real) -> None:
    completion = real.client.post("/v1/completions", json={"model": MODEL, "prompt": "the quick brown fox", "max_tokens": 5}, headers=bearer("vip"))
    assert completion.status_code == 200, completion.text
    assert completion.json()["usage"]["completion_tokens"] == 5
    chat = real.client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}, headers=bearer("std"))
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "the quick brown fox"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]}),
])
def test_streaming_completion_and_chat(real, path: str, body: dict) -> None:
    before = real.metrics.get("/metrics").text.count("slaq_ttft_seconds_count")
    with real.client.stream("POST", path, json={**body, "model": MODEL, "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}, headers=bearer("vip")) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 6
    metrics = real.metrics.get("/metrics").text
    assert 'slaq_ttft_seconds_count{tenant="vip",tier="critical"}' in metrics and metrics.count("slaq_ttft_seconds_count") >= before
    assert 'slaq_slo_outcomes_total{outcome=' in metrics
    # The engine's series, fetched through the sidecar's metrics port (what a cluster's Prometheus scrapes).
    assert "vllm:num_requests_waiting{" in metrics and "vllm:kv_cache_usage_perc{" in metrics and "slaq_engine_queue_depth{" in metrics
    assert "python_gc_objects_collected_total" not in metrics


def test_client_priority_and_salt_never_reach_the_engine(real, wiretap) -> None:
    wiretap.received.clear()
    response = real.client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "jump the queue", "max_tokens": 3, "priority": -1000, "cache_salt": "guessed-salt",
              "vllm_xargs": {"slaq_tier": "critical", "slaq_tenant": "vip", "slaq_ttft_ms": 1}},
        headers=bearer("free"),
    )
    assert response.status_code == 200, response.text
    [sent] = wiretap.received
    free = next(t for t in abc_table().tenants if t.name == "free")
    assert sent["priority"] == 2
    assert sent["cache_salt"] == free.cache_salt
    assert sent["vllm_xargs"]["slaq_tier"] == "batch" and sent["vllm_xargs"]["slaq_tenant"] == "free"
    assert "slaq_ttft_ms" not in sent["vllm_xargs"]


def test_two_tenants_with_the_same_prompt_never_share_prefix_blocks(real, slaq_engine) -> None:
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # ~360 tokens of the tiny vocabulary
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}

    def hits() -> float:
        return engine_counter(slaq_engine.base_url, "vllm:prefix_cache_hits_total")

    def send(tenant: str) -> None:
        response = real.client.post("/v1/completions", json=body, headers=bearer(tenant))
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["prompt_tokens"] >= 200

    send("vip")
    h1 = hits()
    send("vip")
    h2 = hits()
    assert h2 > h1, "the same tenant repeating a prompt must hit the prefix cache (else this test proves nothing)"
    send("std")
    h3 = hits()
    assert h3 == h2, f"tenant std hit {h3 - h2} cached tokens of tenant vip's prompt"
    send("std")
    assert hits() > h3  # std's own blocks are cached for std


def test_unauthorized_through_the_real_path(real) -> None:
    response = real.client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, headers={"authorization": "Bearer nope"})
    assert response.status_code == 401 and response.json()["reason"] == "unauthorized"
    assert real.client.get("/v1/models", headers=bearer("vip")).json()["data"][0]["id"] == MODEL


def test_rate_limit_429(real) -> None:
    table = abc_table("tight", std={"requests_per_minute": 1.0})
    write_table(real.table_path, table)
    wait_for(lambda: real.metrics.get("/slaq/usage").json()["tableRevision"] == "tight", what="reload")
    try:
        statuses = [real.client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, headers=bearer("std")) for _ in range(2)]
        assert statuses[0].status_code in (200, 429)
        assert statuses[1].status_code == 429 and statuses[1].json()["reason"] == "request_rate"
        assert int(statuses[1].headers["retry-after"]) >= 1
    finally:
        write_table(real.table_path, abc_table("loose", std={"requests_per_minute": 600.0}))
        wait_for(lambda: real.metrics.get("/slaq/usage").json()["tableRevision"] == "loose", what="reload")


async def test_batch_is_shed_with_503_while_the_queue_is_saturated(real) -> None:
    """The gate is held shut (as when the engine's queue is at its target) so requests queue; with
    the queue at half its depth the batch tier is refused, and the queued request is served once
    the gate opens again (the engine monitor pumps the queue on every poll). The queued tenant has
    no TTFT objective here, so the deadline guard (its own tests) cannot refuse it first."""
    write_table(real.table_path, abc_table("noslo", std={"ttft_ms": None, "tpot_ms": None, "requests_per_minute": 600.0}))
    wait_for(lambda: real.metrics.get("/slaq/usage").json()["tableRevision"] == "noslo", what="reload")
    gate = real.app.core.gate
    gate.max_in_flight = 0
    try:
        async with httpx.AsyncClient(base_url=real.url, timeout=120) as client:
            queued = asyncio.create_task(client.post("/v1/completions", json={"model": MODEL, "prompt": "next", "max_tokens": 2}, headers=bearer("std")))
            await asyncio.to_thread(wait_for, lambda: len(real.app.core.queue) == 1 or queued.done(), 30.0, "one queued")
            assert not queued.done(), queued.result().text
            shed = await client.post("/v1/completions", json={"model": MODEL, "prompt": "cheap", "max_tokens": 2}, headers=bearer("free"))
            assert shed.status_code == 503 and shed.json()["reason"] == "shedding"
            assert int(shed.headers["retry-after"]) >= 1
            assert 'slaq_queue_depth{tier="standard"} 1.0' in (await asyncio.to_thread(real.metrics.get, "/metrics")).text
            gate.max_in_flight = None
            assert (await queued).status_code == 200
    finally:
        gate.max_in_flight = None
