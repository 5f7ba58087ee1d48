"""The tenant boundary's remaining gaps, each tried from the attacker's side (issue 25's follow-up):
numbers JSON cannot carry, grammar size, prompt-logprob cost, a client that leaves before the usage
chunk, connection caps per client, and large bodies parsed beside other streams."""

from __future__ import annotations

import json

import pytest

from slaq.api.pool import RequestLimitsSpec
from slaq.sidecar.errors import InvalidField
from slaq.sidecar.fields import BodyLimits
from slaq.sidecar.service import CoreConfig, SidecarCore
from slaq.sidecar.tenants import TenantDirectory
from slaq.sidecar.payload import parse_payload
from tests.sidecar.tables import abc_table, bearer

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
COMPLETION = {"model": "fake-model", "prompt": "hello", "max_tokens": 5}


def limits(**spec) -> BodyLimits:
    return BodyLimits(RequestLimitsSpec(**spec), max_model_len=512)


def _core(**spec) -> SidecarCore:
    return SidecarCore(CoreConfig(limits=limits(**spec)), TenantDirectory.from_table(abc_table()))


# -- 1. numbers JSON cannot carry ------------------------------------------------------------------
SCHEMA_WITH = '{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"number","maximum":%s}}}'


@pytest.mark.parametrize("literal", ["1e309", "-1e309", "1" + "0" * 400 + ".0"], ids=["1e309", "-1e309", "400-digits"])
@pytest.mark.parametrize("where,raw,field", [
    ("nested", '{"prompt":"x","response_format":%s}' % SCHEMA_WITH, "response_format.json_schema.schema.maximum"),
    ("top", '{"prompt":"x","temperature":%s}', "temperature"),
    ("tool", '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"number","minimum":%s}}}}}]}',
     "tools[0].function.parameters.properties.a.minimum"),
], ids=["nested", "top", "tool"])
def test_a_number_out_of_float_range_is_refused_naming_the_field(literal: str, where: str, raw: str, field: str) -> None:
    """1e309 parses to inf, which json.dumps re-sends to the engine as `Infinity` (not JSON)."""
    kind = "chat" if raw.startswith('{"messages"') else "completions"
    core = _core()
    with pytest.raises(InvalidField) as refused:
        flight = core.check_in(core.identify(bearer("std")), kind, (raw % literal).encode())  # type: ignore[arg-type]
        sent = core.enriched_body(flight)
        assert b"Infinity" not in sent and b"NaN" not in sent  # what the engine would have received
    assert refused.value.field == field and "finite" in refused.value.message


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_json_constants_are_refused(literal: str) -> None:
    core = _core()
    with pytest.raises(Exception) as refused:
        core.check_in(core.identify(bearer("std")), "completions", ('{"prompt":"x","response_format":%s}' % (SCHEMA_WITH % literal)).encode())
    assert getattr(refused.value, "reason", None) in ("malformed_json", "invalid_field")


def test_finite_numbers_still_pass() -> None:
    core = _core()
    flight = core.check_in(core.identify(bearer("std")), "completions", ('{"prompt":"x","response_format":%s}' % (SCHEMA_WITH % "1.7e308")).encode())
    assert json.loads(core.enriched_body(flight))["response_format"]["json_schema"]["schema"]["maximum"] == 1.7e308


# -- 5. a client that leaves between finish_reason and the usage chunk ------------------------------
def _tokens_left(core: SidecarCore, tenant: str) -> float:
    state = core.quotas._states[tenant]
    state.tokens._refill(core.clock())
    return state.tokens.level


@pytest.mark.parametrize("stream_interval", [None, 4])
def test_a_client_that_leaves_before_the_usage_chunk_is_charged_what_it_streamed(start_sidecar, fake_upstream, stream_interval) -> None:
    """It read every token to finish_reason and closed before usage came: it used to pay only its
    reservation for the bucket, and nothing reached fairness, /slaq/usage or slaq_tokens_total."""
    from slaq.testing.fake_engine import fake_user
    from tests.support.polling import wait_for

    sidecar = start_sidecar(fake_upstream[1], abc_table(std={"tokens_per_minute": 6000.0}), served_model_name="fake-model")
    core = sidecar.app.core
    frozen = core.clock()
    core.clock = lambda: frozen  # no refill while it runs: the bucket's level is the charge
    body = {**COMPLETION, "stream": True, "max_tokens": 1000, "prompt": "x" * 40, "user": fake_user(tokens=6, usage_delay_ms=3000)}
    if stream_interval:
        body["stream_interval"] = stream_interval
    with sidecar.client.stream("POST", "/v1/completions", json=body, headers=bearer("std")) as response:
        for line in response.iter_lines():
            if '"finish_reason":"length"' in line.replace(" ", ""):
                break  # the whole answer: leave before the usage chunk
    wait_for(lambda: core.quotas.in_flight("std") == 0, 10.0, "the stream settled")
    # Each token event holds up to stream_interval tokens: the count is an upper bound, never above max_tokens.
    streamed = 6 * (stream_interval or 1)
    prompt = 10  # the estimate (40 characters / 4): no usage ever said otherwise
    assert _tokens_left(core, "std") == pytest.approx(6000 - prompt - streamed, abs=0.01)  # not 6000 - 1010 (the reservation)
    assert core.accounting.service_share("standard", "std") > 0
    metrics = sidecar.metrics.get("/metrics").text
    assert f'slaq_tokens_total{{direction="out",tenant="std",tier="standard"}} {float(streamed)}' in metrics
    assert sidecar.metrics.get("/slaq/usage").json()["tenants"]["std"]["tokensPerMinute"] == prompt + streamed


# -- 5b. streams whose tokens are tool calls or reasoning, not content ------------------------------
# vLLM 0.32's DeltaMessage streams reasoning as `reasoning`; `reasoning_content` is the older name.
DELTA_KINDS = ["tool_calls", "reasoning", "reasoning_content"]
CHAT_PROMPT = [{"role": "user", "content": "x" * 384}]  # estimated at 100 tokens: 384 characters / 4 and the message overhead, 4


def _deltas(lines: list[str]) -> list[dict]:
    """The deltas of the chunks a client read (the role chunk included)."""
    chunks = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: {")]
    return [choice["delta"] for chunk in chunks for choice in chunk.get("choices", [])]


def _frozen_sidecar(start_sidecar, fake_upstream):
    sidecar = start_sidecar(fake_upstream[1], abc_table(std={"tokens_per_minute": 6000.0}), served_model_name="fake-model")
    frozen = sidecar.app.core.clock()
    sidecar.app.core.clock = lambda: frozen  # no refill while it runs: the bucket's level is the charge
    return sidecar


def _assert_charged(sidecar, prompt: int, output: int) -> None:
    core = sidecar.app.core
    assert _tokens_left(core, "std") == pytest.approx(6000 - prompt - output, abs=0.01)
    metrics = sidecar.metrics.get("/metrics").text
    assert f'slaq_tokens_total{{direction="out",tenant="std",tier="standard"}} {float(output)}' in metrics
    assert f'slaq_tokens_total{{direction="in",tenant="std",tier="standard"}} {float(prompt)}' in metrics
    assert sidecar.metrics.get("/slaq/usage").json()["tenants"]["std"]["tokensPerMinute"] == prompt + output
    assert core.accounting.service_share("standard", "std") > 0


@pytest.mark.parametrize("asked_for_usage", [False, True], ids=["usage-hidden", "usage-asked"])
@pytest.mark.parametrize("delta", DELTA_KINDS)
def test_a_tool_call_or_reasoning_stream_is_charged_the_engines_usage(start_sidecar, fake_upstream, delta: str, asked_for_usage: bool) -> None:
    """With the usage chunk the charge is the engine's completion tokens, whatever the deltas held:
    6 here, where the sidecar's own count would say 6 events x stream_interval 4 = 24."""
    from slaq.testing.fake_engine import fake_user
    from tests.support.polling import wait_for

    sidecar = _frozen_sidecar(start_sidecar, fake_upstream)
    body = {**CHAT, "stream": True, "max_tokens": 1000, "stream_interval": 4, "messages": CHAT_PROMPT, "user": fake_user(tokens=6, delta=delta)}
    if asked_for_usage:
        body["stream_options"] = {"include_usage": True}
    with sidecar.client.stream("POST", "/v1/chat/completions", json=body, headers=bearer("std")) as response:
        lines = [line for line in response.iter_lines() if line]
    assert response.status_code == 200 and lines[-1] == "data: [DONE]"
    deltas = _deltas(lines)
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert sum(delta in d for d in deltas) == (6 if delta == "tool_calls" else 3)  # the fake streamed the shape under test
    assert any('"usage"' in line for line in lines) is asked_for_usage
    wait_for(lambda: sidecar.app.core.quotas.in_flight("std") == 0, 10.0, "the stream settled")
    _assert_charged(sidecar, prompt=7, output=6)  # the fake engine's usage: 7 prompt, 6 completion tokens
    # A complete stream records its time to first token only if a token event went past.
    assert 'slaq_ttft_seconds_count{tenant="std",tier="standard"} 1.0' in sidecar.metrics.get("/metrics").text


@pytest.mark.parametrize("cut", ["client-left", "engine-broke"])
@pytest.mark.parametrize("delta", DELTA_KINDS)
def test_a_tool_call_or_reasoning_stream_cut_before_usage_is_charged_its_streamed_events(start_sidecar, fake_upstream, delta: str, cut: str) -> None:
    """Cut before the usage chunk, the sidecar's count of token events is the charge, and a tool-call or
    reasoning delta is a token event like content. Counting content alone, a reasoning stream left at
    finish_reason paid for its answer but not its thinking (12 of 24 here), and a tool-call stream
    counted nothing: its bucket kept the whole reservation and fairness, /slaq/usage and
    slaq_tokens_total saw no tokens at all."""
    from slaq.testing.fake_engine import fake_user
    from tests.support.polling import wait_for

    sidecar = _frozen_sidecar(start_sidecar, fake_upstream)
    controls = {"usage_delay_ms": 3000} if cut == "client-left" else {"break": 1}  # break: the engine cuts after one token event
    body = {**CHAT, "stream": True, "max_tokens": 1000, "stream_interval": 4, "messages": CHAT_PROMPT,
            "user": fake_user(tokens=6, delta=delta, **controls)}
    lines = []
    with sidecar.client.stream("POST", "/v1/chat/completions", json=body, headers=bearer("std")) as response:
        for line in filter(None, response.iter_lines()):
            lines.append(line)
            if '"finish_reason":' in line.replace(" ", "") and '"finish_reason":null' not in line.replace(" ", ""):
                break  # the whole answer: leave before the usage chunk
    deltas = _deltas(lines)
    assert deltas[0] == {"role": "assistant", "content": ""} and delta in deltas[1]  # the first token event holds the shape under test
    if cut == "engine-broke":
        assert "engine_stream_broken" in lines[-1]
    wait_for(lambda: sidecar.app.core.quotas.in_flight("std") == 0, 10.0, "the stream settled")
    events = 6 if cut == "client-left" else 1
    _assert_charged(sidecar, prompt=100, output=events * 4)  # no usage: the prompt estimate, events x stream_interval


@pytest.mark.parametrize("delta", ["tool_calls", "reasoning"])
def test_the_first_token_is_the_first_tool_call_or_reasoning_delta(start_sidecar, fake_upstream, delta: str) -> None:
    """Time to first token is taken when the first token event goes past, before it is sent on: when
    the client reads the first tool-call or reasoning delta, the sidecar has recorded its first token
    (the content of a reasoning stream comes 600 ms later; a tool-call stream has none)."""
    from slaq.testing.fake_engine import fake_user

    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model")
    core = sidecar.app.core
    recorded: list[float] = []
    record_first_token = core.first_token

    def first_token(flight) -> None:
        record_first_token(flight)
        recorded.append(flight.first_token_time)

    core.first_token = first_token
    body = {**CHAT, "stream": True, "max_tokens": 4, "user": fake_user(tokens=4, delta=delta, delay_ms=300)}
    with sidecar.client.stream("POST", "/v1/chat/completions", json=body, headers=bearer("std")) as response:
        for line in response.iter_lines():
            deltas = _deltas([line])
            if deltas and deltas[0] != {"role": "assistant", "content": ""}:
                assert delta in deltas[0]
                assert len(recorded) == 1 and recorded[0] is not None
                break
        else:
            pytest.fail("no token event reached the client")


# -- 4. prompt logprobs: logits over the vocabulary at every prompt position --------------------------
def _frozen_core(**tenant) -> SidecarCore:
    return SidecarCore(CoreConfig(limits=limits()), TenantDirectory.from_table(abc_table(std={"tokens_per_minute": 6000.0, **tenant})),
                       clock=lambda: 1000.0)


@pytest.mark.parametrize("kind,extra,doubled", [
    ("completions", {}, False),
    ("completions", {"prompt_logprobs": 0}, True),
    ("completions", {"echo": True, "logprobs": 1}, True),  # vLLM turns echo + logprobs into prompt logprobs
    ("completions", {"echo": True}, False),
    ("chat", {"prompt_logprobs": 2}, True),
])
def test_prompt_logprobs_are_charged_as_a_second_pass_over_the_prompt(kind: str, extra: dict, doubled: bool) -> None:
    """vLLM computes a logprob distribution for every prompt token: as much work as decoding the prompt
    again, which a tenant used to get for the price of the prompt alone."""
    core = _frozen_core()
    body = {**(CHAT if kind == "chat" else COMPLETION), "prompt" if kind == "completions" else "messages":
            "x" * 400 if kind == "completions" else [{"role": "user", "content": "x" * 396}], "max_tokens": 50, **extra}
    flight = core.check_in(core.identify(bearer("std")), kind, json.dumps(body).encode())  # type: ignore[arg-type]
    prompt = flight.prompt_tokens  # 100 estimated
    assert _tokens_left(core, "std") == 6000 - (2 if doubled else 1) * prompt - 50
    core.finish(flight, output_tokens=20, engine_prompt_tokens=90, status=200)
    assert _tokens_left(core, "std") == 6000 - (2 if doubled else 1) * 90 - 20
    assert core.usage.report("p", "r", {}, 1000.0).tenants["std"].tokens_per_minute == (2 if doubled else 1) * 90 + 20


# -- 3. grammars: response_format and tools become a grammar the engine compiles ---------------------------
def _deep_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _tool(i: int, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": f"f{i}", "parameters": parameters}}


BIG_ENUM = {"type": "string", "enum": [f"value-{i:06d}" for i in range(8000)]}  # ~120 KiB of grammar alternatives


@pytest.mark.parametrize("kind,extra,field", [
    ("completions", {"response_format": _json_schema(BIG_ENUM)}, "response_format"),
    ("completions", {"response_format": _json_schema(_deep_schema(40))}, "response_format"),
    ("chat", {"response_format": {"type": "structural_tag", "structures": [{"begin": "<a>", "schema": _deep_schema(40), "end": "</a>"}],
                                  "triggers": ["<a>"]}}, "response_format"),
    ("chat", {"tools": [_tool(i, {"type": "object", "properties": {"p": BIG_ENUM}}) for i in range(2)]}, "tools"),
    ("chat", {"tools": [_tool(0, _deep_schema(40))]}, "tools"),
    ("chat", {"tools": [_tool(i, {"type": "object", "properties": {f"p{j}": {"type": "string", "maxLength": 10} for j in range(40)}})
                        for i in range(60)]}, "tools"),  # each small, together over the bound
    ("chat", {"tool_choice": {"type": "function", "function": {"name": "f", "junk": BIG_ENUM}}}, "tool_choice"),
], ids=["enum", "deep", "structural-tag", "big-tools", "deep-tool", "many-tools", "tool-choice"])
def test_grammars_are_bounded_in_size_and_depth(kind: str, extra: dict, field: str) -> None:
    """Within the body cap a tenant could still hand the engine's grammar compiler (xgrammar) a schema of
    megabytes or hundreds of levels, compiled on the engine's CPU for every such request."""
    body = {**(CHAT if kind == "chat" else COMPLETION), **extra}
    with pytest.raises(InvalidField) as refused:
        parse_payload(json.dumps(body).encode(), kind, None, limits())  # type: ignore[arg-type]
    assert refused.value.field == field and ("maxSchemaBytes" in refused.value.message or "maxSchemaDepth" in refused.value.message)


def test_ordinary_grammars_pass_and_the_bounds_come_from_the_pool() -> None:
    ordinary = {**CHAT, "response_format": _json_schema(_deep_schema(6)), "tools": [_tool(i, _deep_schema(4)) for i in range(8)],
                "tool_choice": {"type": "function", "function": {"name": "f1"}}}
    parse_payload(json.dumps(ordinary).encode(), "chat", None, limits())
    with pytest.raises(InvalidField, match="maxSchemaDepth"):
        parse_payload(json.dumps(ordinary).encode(), "chat", None, limits(max_schema_depth=8))
    parse_payload(json.dumps({**CHAT, "response_format": _json_schema(BIG_ENUM)}).encode(), "chat", None, limits(max_schema_bytes=256 * 1024))


# -- 2. connections: one client cannot take them all, and probes are always answered ----------------------
def _connect_from(address: str, port: int, count: int) -> list:
    import socket

    held = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((address, 0))
        sock.connect(("127.0.0.1", port))
        held.append(sock)
    return held


def _client(base_url: str, address: str = "127.0.0.1"):
    import httpx

    return httpx.Client(base_url=base_url, timeout=10, transport=httpx.HTTPTransport(local_address=address))


def _open(socks: list) -> int:
    """How many of `socks` the server still holds open (a closed one reads EOF at once)."""
    import select

    readable, _, _ = select.select(socks, [], [], 0.3)
    return sum(1 for sock in socks if sock not in readable or sock.recv(1, 0x40) != b"")  # 0x40: MSG_DONTWAIT


PER_CLIENT = dict(header_s=15.0, max_connections=16, max_connections_per_client=4)


def test_one_client_address_cannot_take_every_connection(start_sidecar, fake_upstream) -> None:
    from slaq.sidecar.connections import ConnectionLimits
    from tests.support.polling import wait_for

    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", connection_limits=ConnectionLimits(**PER_CLIENT))
    hog = _connect_from("127.0.0.2", sidecar.server.port, 20)  # more than the whole limit, from one address
    try:
        wait_for(lambda: _open(hog) <= 8, 3.0, "the hog's connections beyond its cap (and the probe lane) closed")
        with _client(sidecar.url) as other:
            assert other.post("/v1/completions", json=COMPLETION, headers=bearer("vip")).status_code == 200
    finally:
        for sock in hog:
            sock.close()


def test_probes_and_the_metrics_port_answer_when_the_connection_limit_is_exhausted(start_sidecar, fake_upstream) -> None:
    from slaq.sidecar.connections import ConnectionLimits

    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", connection_limits=ConnectionLimits(**PER_CLIENT))
    held = [sock for i in range(2, 7) for sock in _connect_from(f"127.0.0.{i}", sidecar.server.port, 4)]  # 20 >= 16, 4 per address
    try:
        import time

        time.sleep(0.3)
        with _client(sidecar.url) as kubelet, _client(sidecar.metrics_url) as prometheus:
            assert kubelet.post("/v1/completions", json=COMPLETION, headers=bearer("vip")).status_code == 503  # the limit holds
            assert kubelet.get("/health").status_code == 200
            assert kubelet.get("/ready").status_code == 200
            assert prometheus.get("/metrics").status_code == 200
    finally:
        for sock in held:
            sock.close()


def test_a_probe_from_an_address_at_its_cap_is_still_answered(start_sidecar, fake_upstream) -> None:
    """Behind SNAT (externalTrafficPolicy: Cluster) tenants reach the pod from the node's address, which
    is also kubelet's: a tenant at the cap must not fail the pod's probes (and get it restarted)."""
    from slaq.sidecar.connections import ConnectionLimits

    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model", connection_limits=ConnectionLimits(**PER_CLIENT))
    hog = _connect_from("127.0.0.2", sidecar.server.port, 12)  # the cap and the probe lane, full of silent connections
    try:
        import time

        time.sleep(0.3)
        with _client(sidecar.url, "127.0.0.2") as node:
            assert node.get("/health").status_code == 200
            assert node.get("/ready").status_code == 200
            assert node.post("/v1/completions", json=COMPLETION, headers=bearer("vip")).status_code == 503  # over its cap
    finally:
        for sock in hog:
            sock.close()


# -- 6. large bodies are parsed off the event loop --------------------------------------------------------
@pytest.mark.parametrize("kind,body", [
    ("completions", {**COMPLETION, "prompt": list(range(40000)), "stream": True, "stream_options": {"continuous_usage_stats": False}}),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 70000},
                                                                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}, "uuid": "cat"}]}]}),
])
def test_a_body_parsed_by_a_worker_reaches_the_engine_as_one_parsed_here(kind: str, body: dict) -> None:
    import asyncio

    raw = json.dumps(body).encode()
    core = _frozen_core()
    assert core.parsers.wants(raw)
    try:
        worker = asyncio.run(core.admit(core.identify(bearer("std")), kind, raw))  # type: ignore[arg-type]
    finally:
        core.parsers.close()
    inline = _frozen_core().check_in(core.identify(bearer("std")), kind, raw)  # type: ignore[arg-type]
    assert worker.payload.serialised is not None and inline.payload.serialised is None
    assert json.loads(core.enriched_body(worker)) == json.loads(core.enriched_body(inline))
    assert worker.prompt_tokens == inline.prompt_tokens


def test_a_worker_refusal_names_the_field_and_costs_a_request() -> None:
    import asyncio

    core = _frozen_core(requests_per_minute=2.0)
    bad = json.dumps({**COMPLETION, "prompt": [[1]] * 30000}).encode()
    identity = core.identify(bearer("std"))
    try:
        with pytest.raises(InvalidField) as refused:
            asyncio.run(core.admit(identity, "completions", bad))
        assert refused.value.field == "prompt"
        with pytest.raises(InvalidField):
            asyncio.run(core.admit(identity, "completions", bad))
    finally:
        core.parsers.close()
    from slaq.sidecar.errors import RequestRateExceeded

    with pytest.raises(RequestRateExceeded):
        core.check_in(identity, "completions", json.dumps(COMPLETION).encode())


async def test_other_streams_keep_flowing_while_large_bodies_are_parsed(start_sidecar, fake_upstream) -> None:
    """4 MiB bodies whose parse costs most (a list of a million small lists; a million floats), within
    the default 4 MiB cap: each used to hold the event loop (and every tenant's stream) for ~0.7 s here."""
    import asyncio
    import time

    import httpx

    from slaq.testing.fake_engine import fake_user

    sidecar = start_sidecar(fake_upstream[1], served_model_name="fake-model")
    assert sidecar.app.max_body_bytes == 4 * 1024 * 1024
    nested = b'{"model":"fake-model","max_tokens":5,"prompt":[' + b",".join([b"[1]"] * 1_000_000) + b"]}"
    floats = (b'{"model":"fake-model","max_tokens":5,"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"x",'
              b'"schema":{"enum":[' + b",".join([b"1.5"] * 1_000_000) + b"]}}}}")
    async with httpx.AsyncClient(base_url=sidecar.url, timeout=60) as client:
        # The worker processes start on first use: warm them, as a serving pod's first large body does.
        warm = await client.post("/v1/completions", content=b'{"prompt":"' + b"x" * 100_000 + b'","max_tokens":1}',
                                 headers={**bearer("vip"), "content-type": "application/json"})
        assert warm.status_code == 200

        async def vip_gaps() -> list[float]:
            gaps, last = [], None
            body = {**COMPLETION, "stream": True, "max_tokens": 60, "user": fake_user(tokens=60, delay_ms=20)}
            async with client.stream("POST", "/v1/completions", json=body, headers=bearer("vip")) as response:
                async for _ in response.aiter_lines():
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
            return gaps

        async def big(raw: bytes, tenant: str) -> int:
            return (await client.post("/v1/completions", content=raw, headers={**bearer(tenant), "content-type": "application/json"})).status_code

        vip = asyncio.create_task(vip_gaps())
        await asyncio.sleep(0.2)
        statuses = await asyncio.gather(big(nested, "free"), big(floats, "free"), big(nested, "std"))  # two per tenant at most
        gaps = await vip
    assert statuses == [400, 400, 400]
    assert max(gaps) < 1.0, f"a VIP token waited {max(gaps) * 1000:.0f} ms beside the large bodies"


async def test_a_burst_of_large_bodies_from_one_tenant_does_not_fill_the_parsing_workers() -> None:
    """A body is charged to the rate only once parsed: without a bound a tenant's burst of large bodies
    all pass the pre-body check and queue in the workers ahead of every other tenant's."""
    import asyncio

    from slaq.sidecar.errors import ConcurrencyExceeded

    core = _frozen_core()
    identity = core.identify(bearer("std"))
    big = json.dumps({**COMPLETION, "prompt": [[1]] * 30000}).encode()
    try:
        results = await asyncio.gather(*(core.admit(identity, "completions", big) for _ in range(6)), return_exceptions=True)
    finally:
        core.parsers.close()
    assert sorted(type(r).__name__ for r in results) == ["ConcurrencyExceeded"] * 4 + ["InvalidField"] * 2
    assert all(r.retry_after_s == 1.0 for r in results if isinstance(r, ConcurrencyExceeded))


# -- content parts hold only their own keys ----------------------------------------------------------------
@pytest.mark.parametrize("part,field", [
    ({"type": "text", "text": "x", "image_url": {"url": "https://example.invalid/a.png"}}, "messages[0].content[0].image_url"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "mm_processor_kwargs": {}}}, "messages[0].content[0].image_url.mm_processor_kwargs"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav", "url": "file:///etc/passwd"}}, "messages[0].content[0].input_audio.url"),
])
def test_a_content_part_holds_only_its_own_keys(part: dict, field: str) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_payload(json.dumps({**CHAT, "messages": [{"role": "user", "content": [part]}]}).encode(), "chat", None, limits())
    assert refused.value.field == field


def test_the_openai_sdk_shapes_of_content_parts_pass() -> None:
    parts = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
             {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, {"type": "file", "file": {"file_data": "AAAA", "filename": "a.pdf"}}]
    parse_payload(json.dumps({**CHAT, "messages": [{"role": "user", "content": parts}]}).encode(), "chat", None, limits())
