"""The request lifecycle in SidecarCore, driven directly (no sockets, simulated clock)."""

from __future__ import annotations

import asyncio
import json

import pytest

from slaq.api.contract import XARG_KEYS
from slaq.sidecar.errors import InvalidField, DeadlineUnreachable, Draining, QueueFull, RequestRateExceeded, Shedding, Unauthorized
from slaq.sidecar.service import CoreConfig, SidecarCore
from slaq.sidecar.tenants import TenantDirectory
from tests.sidecar.tables import abc_table, bearer

CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 20, "stream": True}
CHAT = json.dumps(CHAT_BODY).encode()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def core(table=None, **config) -> tuple[SidecarCore, Clock]:
    clock = Clock()
    return SidecarCore(CoreConfig(served_model_name="m", **config), TenantDirectory.from_table(table or abc_table()), clock=clock), clock


@pytest.mark.parametrize("field", ["priority", "cache_salt", "vllm_xargs", "request_id"])
async def test_client_scheduling_fields_are_refused_naming_the_field(field: str) -> None:
    c, _ = core()
    with pytest.raises(InvalidField) as refused:
        await c.admit(c.identify(bearer("free")), "chat", json.dumps({**CHAT_BODY, field: {"slaq_tier": "critical"} if field == "vllm_xargs" else "x"}).encode())
    assert refused.value.field == field and c.quotas.in_flight("free") == 0


async def test_the_tenants_scheduling_fields_are_set_by_the_sidecar() -> None:
    c, _ = core()
    flight = await c.admit(c.identify(bearer("free")), "chat", CHAT)
    body = json.loads(c.enriched_body(flight, "0123abcd"))
    table = abc_table()
    assert body["priority"] == 2  # batch tier rank, whatever the client asked for
    assert body["cache_salt"] == next(t.cache_salt for t in table.tenants if t.name == "free")
    assert set(body["vllm_xargs"]) == set(XARG_KEYS) - {"slaq_ttft_ms", "slaq_tpot_ms"}  # batch: no objectives, keys left out
    assert body["vllm_xargs"]["slaq_tier"] == "batch" and body["vllm_xargs"]["slaq_tenant"] == "free"
    assert body["vllm_xargs"]["slaq_request_id"] == "0123abcd"  # the access line's id, for the engine's audit line
    assert body["vllm_xargs"]["slaq_predicted_output"] == 20  # bounded by max_tokens
    assert body["messages"] == [{"role": "user", "content": "hello there"}]


async def test_unknown_key_is_counted_as_a_rejection() -> None:
    c, _ = core()
    with pytest.raises(Unauthorized):
        c.identify({"authorization": "Bearer nope"})
    assert b'slaq_rejections_total{reason="unauthorized",tier="none"} 1.0' in c.metrics.render()


async def test_finish_settles_quota_and_records_latency_and_outcome() -> None:
    c, clock = core(abc_table(vip={"tokens_per_minute": 100.0}))
    flight = await c.admit(c.identify(bearer("vip")), "chat", CHAT)
    clock.now += 0.03
    c.first_token(flight)
    clock.now += 0.19  # 19 more tokens at 10 ms
    c.finish(flight, output_tokens=20, engine_prompt_tokens=12, status=200)
    metrics = c.metrics.render().decode()
    assert 'slaq_slo_outcomes_total{outcome="met",tenant="vip",tier="critical"} 1.0' in metrics
    assert 'slaq_tokens_total{direction="out",tenant="vip",tier="critical"} 20.0' in metrics
    assert 'slaq_tokens_total{direction="in",tenant="vip",tier="critical"} 12.0' in metrics
    assert "slaq_ttft_seconds_bucket" in metrics and "slaq_sla_risk" in metrics
    assert c.quotas.in_flight("vip") == 0
    report = c.usage_report()
    assert report["tenants"]["vip"]["requestsPerMinute"] == 1 and report["tenants"]["vip"]["tokensPerMinute"] == 32
    # 12 + 20 used of the 100/min bucket, reservation refunded: another 32-token request fits twice more
    for _ in range(2):
        f = await c.admit(c.identify(bearer("vip")), "chat", CHAT)
        c.finish(f, output_tokens=20, engine_prompt_tokens=12, status=200)


async def test_ttft_miss_is_recorded_and_raises_risk() -> None:
    c, clock = core()
    flight = await c.admit(c.identify(bearer("vip")), "chat", CHAT)
    clock.now += 0.2  # 200 ms against a 50 ms objective
    c.first_token(flight)
    c.finish(flight, output_tokens=1, engine_prompt_tokens=None, status=200)
    assert 'outcome="ttft_missed"' in c.metrics.render().decode()
    assert c.sla_risk() == pytest.approx(4.0)


async def test_quota_refusal_feeds_usage_refused() -> None:
    c, _ = core(abc_table(std={"requests_per_minute": 1.0}))
    await c.admit(c.identify(bearer("std")), "chat", CHAT)
    with pytest.raises(RequestRateExceeded):
        await c.admit(c.identify(bearer("std")), "chat", CHAT)
    assert c.usage_report()["tenants"]["std"]["refusedPerMinute"] == 1


async def test_saturation_sheds_batch_fills_queue_and_refuses_unreachable_deadlines() -> None:
    c, clock = core(max_queue_depth=4, engine_queue_target=1)
    first = await c.admit(c.identify(bearer("std")), "chat", CHAT)  # occupies the engine window
    waiters = [asyncio.create_task(c.admit(c.identify(bearer("std")), "chat", CHAT)) for _ in range(2)]
    await asyncio.sleep(0)
    assert len(c.queue) == 2
    with pytest.raises(Shedding):  # queue at half its depth: the batch tier is shed
        await c.admit(c.identify(bearer("free")), "chat", CHAT)
    c.dispatcher.pace.interval_s = 1.0  # the queue drains one request a second
    with pytest.raises(DeadlineUnreachable):  # the 200 ms objective cannot be met behind two
        await c.admit(c.identify(bearer("std")), "chat", CHAT)
    more = [asyncio.create_task(c.admit(c.identify(bearer("vip")), "chat", CHAT)) for _ in range(3)]
    c.dispatcher.pace.interval_s = 0.001
    await asyncio.sleep(0)
    # the first vip goes at once: the engine serves it ahead of the standard request it holds
    assert sum(t.done() for t in more) == 1
    assert len(c.queue) == 4
    with pytest.raises(QueueFull):
        await c.admit(c.identify(bearer("vip")), "chat", CHAT)
    assert c.metrics.render().decode().count("slaq_rejections_total{") == 3
    c.first_token(first)  # the standard request started: the vip not yet started still holds the rest
    await asyncio.sleep(0)
    assert sum(t.done() for t in more) == 1
    c.first_token(next(t for t in more if t.done()).result())  # the engine started the vip: the next vip goes
    await asyncio.sleep(0)
    assert sum(t.done() for t in more) == 2 and not any(t.done() for t in waiters)
    for task in waiters + more:
        task.cancel()
    await asyncio.gather(*waiters, *more, return_exceptions=True)
    assert len(c.queue) == 0


async def standard_first_tokens_after(c: SidecarCore, clock, seconds: float) -> None:
    warm = await c.admit(c.identify(bearer("std")), "chat", CHAT)
    clock.now += seconds
    c.first_token(warm)
    c.finish(warm, output_tokens=1, engine_prompt_tokens=None, status=200)


async def test_a_late_request_in_the_engine_sheds_batch_only_while_batch_holds_part_of_the_engine() -> None:
    """The design report's scenario 4.5: B waits in the engine for KV held by its own tier's work;
    C, which fits beside A, is served, not shed (decision 0030). Once batch work is in the engine,
    refusing more of it is what helps the late request."""
    c, clock = core()
    await standard_first_tokens_after(c, clock, 0.3)  # the standard tier's objective: 200 ms
    in_engine = await c.admit(c.identify(bearer("std")), "chat", CHAT)  # released at once, due 100 ms late
    clock.now += 0.11  # past the guard's 100 ms cache
    assert c.risk.projected(clock.now) == pytest.approx(1.5) and c.current_risk() == 0.0
    free = await c.admit(c.identify(bearer("free")), "chat", CHAT)  # no batch work in the engine: served
    clock.now += 0.11
    assert c.current_risk() == pytest.approx(1.5)
    with pytest.raises(Shedding):
        await c.admit(c.identify(bearer("free")), "chat", CHAT)
    for flight in (in_engine, free):
        c.first_token(flight)
        c.finish(flight, output_tokens=1, engine_prompt_tokens=None, status=200)
    clock.now += 0.11
    assert c.current_risk() == 0.0


async def test_a_late_request_held_by_the_sidecar_sheds_batch() -> None:
    c, clock = core(engine_queue_target=1)
    await standard_first_tokens_after(c, clock, 0.3)
    in_engine = await c.admit(c.identify(bearer("std")), "chat", CHAT)  # takes the engine window
    held = asyncio.create_task(c.admit(c.identify(bearer("std")), "chat", CHAT))  # held here
    await asyncio.sleep(0)
    assert len(c.queue) == 1 and not any(c.gate.in_flight_by_rank[2:])
    clock.now += 0.11
    assert c.current_risk() >= 1.5 - 1e-9
    with pytest.raises(Shedding):
        await c.admit(c.identify(bearer("free")), "chat", CHAT)
    c.first_token(in_engine)
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)


async def test_draining_refuses_new_work() -> None:
    c, _ = core()
    c.draining = True
    with pytest.raises(Draining):
        await c.admit(c.identify(bearer("vip")), "chat", CHAT)


async def test_past_misses_raise_the_gauge_but_do_not_shed_an_idle_pod() -> None:
    c, clock = core()
    flight = await c.admit(c.identify(bearer("vip")), "chat", CHAT)
    clock.now += 0.5  # ten times the 50 ms objective
    c.first_token(flight)
    c.finish(flight, output_tokens=1, engine_prompt_tokens=None, status=200)
    assert c.sla_risk() >= 10.0
    await c.admit(c.identify(bearer("free")), "chat", CHAT)  # nothing waits: batch is still served


async def test_the_handover_is_recorded_by_tier_and_by_the_pipe_ahead_at_release() -> None:
    """Release → first byte, with how many released requests had no first byte yet (issue 39)."""
    c, clock = core()
    first = await c.admit(c.identify(bearer("free")), "chat", CHAT)
    second = await c.admit(c.identify(bearer("free")), "chat", CHAT)
    vip = await c.admit(c.identify(bearer("vip")), "chat", CHAT, arrival=clock.now - 0.5)
    assert (first.entry.pipe_ahead, second.entry.pipe_ahead, vip.entry.pipe_ahead) == (0, 1, 2)
    clock.now += 0.04
    c.first_token(vip)
    clock.now += 0.01
    c.finish(vip, output_tokens=20, engine_prompt_tokens=12, status=200)
    metrics = c.metrics.render().decode()
    assert 'slaq_handover_seconds_count{ahead="1-3",tier="critical"} 1.0' in metrics
    assert 'slaq_handover_seconds_bucket{ahead="1-3",le="0.03",tier="critical"} 0.0' in metrics
    assert 'slaq_handover_seconds_bucket{ahead="1-3",le="0.05",tier="critical"} 1.0' in metrics
    assert 'tier="batch"' not in "".join(line for line in metrics.splitlines() if line.startswith("slaq_handover_seconds"))
    settled = vip.settlement
    assert settled is not None and (settled.handover_s, settled.pipe_ahead) == (pytest.approx(0.04), 2)
    assert settled.ttft_s == pytest.approx(0.54)  # from the arrival given (the door), not from admit
    assert settled.slo_outcome == "ttft_missed"
