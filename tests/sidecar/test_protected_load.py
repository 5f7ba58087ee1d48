"""`slaq_protected_load`: critical and standard requests held (a moving average) over the requests that fill the pod."""

from __future__ import annotations

import asyncio

import pytest

from slaq.api.common import Tier
from slaq.sidecar.protected_load import ProtectedLoad
from tests.sidecar.tables import bearer
from tests.sidecar.test_service import CHAT, core

LATER = 1e6  # many windows on: the moving average has reached the count held


def test_only_the_tiers_that_pay_count() -> None:
    load = ProtectedLoad(slot_limit=10)
    for tier in (Tier.CRITICAL, Tier.STANDARD, Tier.BATCH, Tier.BATCH):
        load.admitted(tier, 0.0)
    assert load.value(LATER, 10, None, None, 0, 0.0) == pytest.approx(0.2)  # 2 protected of 10 slots
    load.settled(Tier.BATCH, LATER)
    load.settled(Tier.CRITICAL, LATER)
    assert load.value(2 * LATER, 10, None, None, 0, 0.0) == pytest.approx(0.1)


def test_capacity_is_the_running_requests_that_fill_the_kv_cache() -> None:
    load = ProtectedLoad(slot_limit=256)
    for _ in range(30):
        load.admitted(Tier.STANDARD, 0.0)
    # 20 running fill half the cache: 40 fill it, so 30 held is 0.75 of the pod.
    assert load.value(LATER, 256, 20, 0.5, 36, 0.5) == pytest.approx(0.75)
    # Idle engine: the last estimate stands.
    assert load.value(LATER, 256, 0, 0.0, 0, 0.0) == pytest.approx(0.75)
    # Short requests: the batch slots bind before the cache does.
    assert load.value(LATER, 16, 10, 0.05, 10, 0.6) == pytest.approx(30 / 16)


def test_proportional_to_the_protected_requests_and_above_one_with_a_backlog() -> None:
    load = ProtectedLoad(slot_limit=64)
    for _ in range(10):
        load.admitted(Tier.CRITICAL, 0.0)
    at_ten = load.value(LATER, 64, 10, 0.25, 10, 0.25)
    for _ in range(10):
        load.admitted(Tier.CRITICAL, LATER)
    assert load.value(2 * LATER, 64, 20, 0.5, 20, 0.5) == pytest.approx(2 * at_ten)
    for _ in range(40):  # 60 held, 40 fill the cache: 20 wait
        load.admitted(Tier.STANDARD, 2 * LATER)
    assert load.value(3 * LATER, 64, 40, 1.0, 40, 1.0) == pytest.approx(1.5)


def test_a_burst_barely_moves_it_and_a_lasting_load_reaches_it() -> None:
    load = ProtectedLoad(slot_limit=10, window_s=30.0)
    for _ in range(10):
        load.admitted(Tier.STANDARD, 0.0)
    for _ in range(10):
        load.settled(Tier.STANDARD, 1.0)  # ten requests for one second
    assert 0.0 < load.value(1.0, 10, None, None, 0, 0.0) < 0.05
    for _ in range(10):
        load.admitted(Tier.STANDARD, 100.0)
    assert load.value(130.0, 10, None, None, 0, 0.0) == pytest.approx(1.0 - 1 / 2.718281828, abs=0.01)  # one time constant
    assert load.value(250.0, 10, None, None, 0, 0.0) > 0.98


def test_without_engine_gauges_the_released_requests_over_the_load() -> None:
    load = ProtectedLoad(slot_limit=64)
    for _ in range(8):
        load.admitted(Tier.STANDARD, 0.0)
    assert load.value(LATER, 64, None, None, 16, 0.5) == pytest.approx(8 / 32)


def test_while_the_engine_is_not_ready_the_capacity_stays_its_last_estimate() -> None:
    """The engine went down with 3 requests in flight and its KV usage last seen at 0.5: estimated
    from those, the pod would hold 6 requests at load 1.0 instead of 40, and the gauge (and the
    HPA) would jump for a few minutes on a dead engine's figures."""
    load = ProtectedLoad(slot_limit=64)
    for _ in range(8):
        load.admitted(Tier.STANDARD, 0.0)
    assert load.value(LATER, 64, 20, 0.5, 16, 0.5) == pytest.approx(8 / 40)  # the engine's gauges: 40 fill it
    assert load.value(LATER, 64, None, 0.5, 3, 0.5, engine_ready=False) == pytest.approx(8 / 40)
    assert load.capacity == 40
    assert load.value(LATER, 64, None, 0.5, 3, 0.5) == pytest.approx(8 / 6)  # what the estimate would have made of it


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="slot_limit"):
        ProtectedLoad(slot_limit=0)
    with pytest.raises(ValueError, match="window_s"):
        ProtectedLoad(slot_limit=1, window_s=0.0)


async def test_the_sidecar_exports_it_from_admission_to_settlement_and_never_for_batch() -> None:
    c, clock = core(max_num_seqs=8)
    batch = [await c.admit(c.identify(bearer("free")), "chat", CHAT) for _ in range(3)]
    clock.now += LATER
    assert c.protected_load() == 0.0  # a batch backlog alone: nothing to scale for
    assert b'slaq_protected_load{pool="pool"} 0.0' in c.metrics.render()
    vip = await c.admit(c.identify(bearer("vip")), "chat", CHAT)
    std = await c.admit(c.identify(bearer("std")), "chat", CHAT)
    clock.now += LATER
    assert c.protected_load() == pytest.approx(2 / 8)  # no engine gauges yet: 5 released at load 5/8, 8 fill the pod
    assert b'slaq_protected_load{pool="pool"} 0.25' in c.metrics.render()
    c.finish(vip, output_tokens=3, engine_prompt_tokens=None, status=200)
    c.finish(vip, output_tokens=3, engine_prompt_tokens=None, status=200)  # settled once
    for flight in batch:
        c.finish(flight, output_tokens=3, engine_prompt_tokens=None, status=200)
    clock.now += LATER
    assert c.protected_load() == pytest.approx(1 / 8)
    c.finish(std, output_tokens=None, engine_prompt_tokens=None, status=499, refund=True)
    clock.now += LATER
    assert c.protected_load() == 0.0


async def test_protected_prompts_pending_counts_the_first_tokens_still_to_come() -> None:
    # slaq_protected_prompts_pending, a gateway's queue metric: protected requests queued here or
    # released and not started; batch never counts, and a first token or a settlement takes one off.
    c, _ = core(engine_queue_target=1)
    batch = await c.admit(c.identify(bearer("free")), "chat", CHAT)
    assert c.protected_prompts_pending() == 0
    std = await c.admit(c.identify(bearer("std")), "chat", CHAT)  # the engine serves it ahead of the batch request
    queued = asyncio.create_task(c.admit(c.identify(bearer("std")), "chat", CHAT))
    await asyncio.sleep(0)
    assert len(c.queue) == 1 and not queued.done()
    assert c.protected_prompts_pending() == 2  # one released and not started, one queued in the sidecar
    assert b"slaq_protected_prompts_pending 2.0" in c.metrics.render()
    c.first_token(std)
    await asyncio.sleep(0)
    assert queued.done() and c.protected_prompts_pending() == 1  # the queued one went to the engine: still pending there
    c.first_token(batch)
    assert c.protected_prompts_pending() == 1
    c.finish(queued.result(), output_tokens=None, engine_prompt_tokens=None, status=499, refund=True)  # cut before its first token
    assert c.protected_prompts_pending() == 0
    assert b"slaq_protected_prompts_pending 0.0" in c.metrics.render()
