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
from tests.sidecar.tables import KEYS, abc_table, bearer
from slaq.testing.fake_engine import RecordingPassthrough, ServerThread

pytestmark = pytest.mark.engine

MODEL = "slaq-tiny"
ENGINE_MAX_MODEL_LEN = 512  # tests/support/engine.py starts the shared engine with --max-model-len 512


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
                             served_model_name=MODEL, tokenizer=str(ensure_tiny_model()), max_queue_depth=2, max_model_len=ENGINE_MAX_MODEL_LEN)
    app = build_app(options)
    assert app.core.counter.settled.wait(120) and app.core.counter.loaded  # type: ignore[attr-defined]  # loaded in the background
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


def test_client_scheduling_fields_are_refused_and_escalation_headers_never_reach_the_engine(real, wiretap, slaq_engine) -> None:
    body = {"model": MODEL, "prompt": "jump the queue", "max_tokens": 3}
    for field, value in (("priority", -1000), ("cache_salt", "guessed-salt"), ("vllm_xargs", {"slaq_tier": "critical"}), ("request_id", "mine"),
                         ("kv_transfer_params", {"do_remote_prefill": True}), ("structured_outputs", "x")):
        refused = real.client.post("/v1/completions", json={**body, field: value}, headers=bearer("free"))
        assert refused.status_code == 400 and field in refused.json()["error"]["message"], refused.text
    wiretap.received.clear()
    wiretap.received_headers.clear()
    hostile = {**bearer("free"), "x-vllm-priority": "-1000000", "x-request-id": "mine", "x-data-parallel-rank": "1",
               "x-session-id": "s", "endpoint-load-metrics-format": "text"}
    response = real.client.post("/v1/completions", json=body, headers=hostile)
    assert response.status_code == 200, response.text
    [sent], [sent_headers] = wiretap.received, wiretap.received_headers
    free = next(t for t in abc_table().tenants if t.name == "free")
    assert sent["priority"] == 2 and sent["cache_salt"] == free.cache_salt
    assert sent["vllm_xargs"]["slaq_tier"] == "batch" and sent["vllm_xargs"]["slaq_tenant"] == "free" and "slaq_ttft_ms" not in sent["vllm_xargs"]
    assert not {"x-vllm-priority", "x-data-parallel-rank", "x-session-id", "endpoint-load-metrics-format"} & set(sent_headers)
    # The sidecar's id is vLLM's request id (its response id), never the client's.
    request_id = response.headers["x-request-id"]
    assert sent_headers["x-request-id"] == request_id != "mine" and request_id in response.json()["id"]
    assert "endpoint-load-metrics" not in response.headers
    # Negative control: straight to vLLM, the same header gets the pod's load back.
    direct = httpx.post(slaq_engine.base_url + "/v1/completions", json=body, headers={"endpoint-load-metrics-format": "text"}, timeout=60)
    assert direct.status_code == 200 and "endpoint-load-metrics" in direct.headers


def _out_tokens(real, tenant: str) -> float:
    for line in real.metrics.get("/metrics").text.splitlines():
        if line.startswith(f'slaq_tokens_total{{direction="out",tenant="{tenant}"'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_stream_with_a_huge_stream_interval_is_charged_every_token(real) -> None:
    before = _out_tokens(real, "std")
    body = {"model": MODEL, "prompt": "count the tokens", "max_tokens": 32, "min_tokens": 32, "ignore_eos": True, "stream": True, "stream_interval": 1024}
    with real.client.stream("POST", "/v1/completions", json=body, headers=bearer("std")) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and all('"usage"' not in e or '"usage":null' in e for e in events)  # usage not asked: not shown
    assert len(events) < 32  # the engine sent the tokens in few events
    wait_for(lambda: _out_tokens(real, "std") - before == 32, 30.0, "32 output tokens charged")


def test_an_engine_refusal_gives_the_reservation_back(real) -> None:
    write_table(real.table_path, abc_table("tokens", std={"tokens_per_minute": 1200.0, "requests_per_minute": 600.0}))
    wait_for(lambda: real.metrics.get("/slaq/usage").json()["tableRevision"] == "tokens", what="reload")
    try:
        huge = {"model": MODEL, "prompt": [5] * 600, "n": 2, "max_tokens": 200}  # a prompt past the 512-token context: vLLM refuses it
        for _ in range(4):  # each reserves 1000 tokens of 1200: without the refund the second waits 40 s
            refused = real.client.post("/v1/completions", json=huge, headers=bearer("std"))
            assert refused.status_code == 400 and refused.json()["reason"] == "engine_400", refused.text
        assert real.client.post("/v1/completions", json={**huge, "max_tokens": 10**6}, headers=bearer("std")).json()["reason"] == "invalid_field"
        assert real.client.post("/v1/completions", json={"model": MODEL, "prompt": "still served", "max_tokens": 2}, headers=bearer("std")).status_code == 200
    finally:
        write_table(real.table_path, abc_table("loose", std={"requests_per_minute": 600.0}))
        wait_for(lambda: real.metrics.get("/slaq/usage").json()["tableRevision"] == "loose", what="reload")


def test_the_official_openai_sdk_works_unchanged(real) -> None:
    import openai

    client = openai.OpenAI(base_url=real.url + "/v1", api_key=KEYS["vip"], timeout=120, max_retries=0)
    completion = client.completions.create(model=MODEL, prompt="the quick brown fox", max_tokens=4, n=2)
    assert len(completion.choices) == 2 and completion.usage.completion_tokens == 8
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
                                          max_tokens=4, temperature=0.7, top_p=0.9, seed=1, stop=["\n\n"], user="sdk-test")
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 4
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True))
    assert chunks and all(c.usage is None for c in chunks)
    with_usage = list(client.completions.create(model=MODEL, prompt="hi", max_tokens=5, stream=True, stream_options={"include_usage": True}))
    assert with_usage[-1].usage is not None and with_usage[-1].usage.completion_tokens == 5
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    tooled = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "weather in Paris?"}], max_tokens=4,
                                            tools=tools, tool_choice="none")
    assert tooled.choices[0].message.role == "assistant"
    try:
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body={"kv_transfer_params": {}})
    except openai.BadRequestError as refused:
        assert "kv_transfer_params" in str(refused)
    else:
        raise AssertionError("kv_transfer_params was accepted")


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


# -- prompt and output tokens counted as the engine counts them ---------------------------------

CJK = "服务等级目标限制首个令牌的时间和每个输出令牌的时间。"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture
def counts(real) -> Iterator[list]:
    """The sidecar's own prompt counts, as admission used them (reservation, token bucket, fairness view)."""
    inner = real.app.core.counter
    seen: list = []

    class Recorder:
        loaded = True

        def measure(self, kind, body):
            seen.append(inner.measure(kind, body))
            return seen[-1]

        def measure_apart(self, kind, body):
            seen.append(inner.measure_apart(kind, body))
            return seen[-1]

        def close(self):
            pass

        def offloads(self, kind, body):
            return inner.offloads(kind, body)

        def bound(self, kind, body):
            return None  # counted before admission, so every count is recorded here

    real.app.core.counter = Recorder()
    yield seen
    real.app.core.counter = inner


def within_2_percent(counted: int, engine: int) -> bool:
    return abs(counted - engine) <= 0.02 * engine


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": CJK * 3}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "用中文回答。"}, {"role": "user", "content": CJK * 2}]}),
])
def test_a_cjk_prompt_is_charged_what_the_engine_counts(real, counts, path: str, body: dict) -> None:
    response = real.client.post(path, json={**body, "model": MODEL, "max_tokens": 2}, headers=bearer("vip"))
    assert response.status_code == 200, response.text
    engine = response.json()["usage"]["prompt_tokens"]
    [counted] = counts
    assert counted.method == "tokenizer" and within_2_percent(counted.tokens, engine), (counted, engine)
    assert engine > 3 * len(CJK)  # what characters / 4 would have missed by far


def test_a_chat_with_tools_is_charged_what_the_engine_counts(real, counts) -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                       "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "content": "18 degrees, clear", "tool_call_id": "call_1"}]
    # tool_choice none: the shared engine runs no tool parser; the template renders the tools all the same.
    body = {"model": MODEL, "messages": messages, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 2}
    with_tools = real.client.post("/v1/chat/completions", json=body, headers=bearer("vip"))
    assert with_tools.status_code == 200, with_tools.text
    without = real.client.post("/v1/chat/completions", json={**body, "tools": None, "tool_choice": None}, headers=bearer("vip"))
    assert without.status_code == 200, without.text
    engine_with, engine_without = (r.json()["usage"]["prompt_tokens"] for r in (with_tools, without))
    assert engine_with > engine_without + 40  # the tools are in the engine's prompt
    assert [c.method for c in counts] == ["tokenizer", "tokenizer"]
    assert within_2_percent(counts[0].tokens, engine_with) and within_2_percent(counts[1].tokens, engine_without), (counts, engine_with, engine_without)
    # A JSON schema constrains decoding; vLLM 0.32 puts none of it in the prompt, and neither does the count.
    schema = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object", "properties": {"t": {"type": "number"}}}}}
    constrained = real.client.post("/v1/chat/completions", json={**body, "response_format": schema}, headers=bearer("vip"))
    assert constrained.status_code == 200, constrained.text
    assert constrained.json()["usage"]["prompt_tokens"] == engine_with and counts[2].tokens == counts[0].tokens


class HideReasoningThenBreak:
    """Between the sidecar and the engine: the first `hidden` token chunks vanish, as vLLM drops
    reasoning chunks for `include_reasoning: false` (their tokens still count in the engine's usage),
    and the connection breaks where the usage chunk would come: the stream is cut, usage never came."""

    def __init__(self, hidden: int) -> None:
        self.hidden, self.pending, self.hid = hidden, b"", 0

    def __call__(self, chunk: bytes) -> bytes:
        self.pending += chunk
        *events, self.pending = self.pending.split(b"\n\n")
        kept = []
        for event in events:
            if b'"choices":[]' in event:
                raise ConnectionAbortedError("the engine's stream breaks before its usage chunk")
            if self.hid < self.hidden and b'"content":"' in event and b'"content":""' not in event:
                self.hid += 1
                continue
            kept.append(event + b"\n\n")
        return b"".join(kept)


def test_a_cut_stream_with_hidden_reasoning_is_charged_what_the_engine_generated(real, wiretap, slaq_engine) -> None:
    max_tokens, hidden = 48, 20
    before_engine = engine_counter(slaq_engine.base_url, "vllm:generation_tokens_total")
    before = _out_tokens(real, "std")
    wiretap.rewrite = HideReasoningThenBreak(hidden)
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "think, then answer"}], "include_reasoning": False,
                "max_tokens": max_tokens, "min_tokens": max_tokens, "ignore_eos": True, "stream": True}
        with real.client.stream("POST", "/v1/chat/completions", json=body, headers=bearer("std")) as response:
            assert response.status_code == 200
            events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    finally:
        wiretap.rewrite = None
    assert wiretap.received[-1]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert json.loads(events[-1])["reason"] == "engine_stream_broken" and all('"usage"' not in e for e in events)  # no usage the client did not ask for
    # What the sidecar alone could have counted: the token events it forwarded (random weights also
    # write tokens that detokenize to nothing yet, whose chunks carry empty content).
    shown = sum(1 for e in events if '"content":"' in e and '"content":""' not in e)
    assert shown <= max_tokens - hidden
    engine = engine_counter(slaq_engine.base_url, "vllm:generation_tokens_total") - before_engine
    assert engine == max_tokens
    wait_for(lambda: _out_tokens(real, "std") - before > 0, 30.0, f"the cut stream settled ({len(events)} events, {shown} shown: {events[-4:]})")
    charged = _out_tokens(real, "std") - before
    assert within_2_percent(charged, engine) and charged > shown, (charged, engine, shown)
