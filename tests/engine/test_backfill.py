"""Backfill instead of head-of-line blocking, and the report's scenario 4.5, on the real scheduler
classes (vLLM 0.32's waiting loop with slaq's queue and block manager; no model, no GPU).

On vLLM's loop alone (and on slaq before backfill) every one of these fails: the first request
whose allocation is refused ends the step's admissions."""

from __future__ import annotations

import time

import pytest

from slaq.api.common import Tier
from slaq.api.pool import SchedulerSpec
from slaq.engine.config import EngineSchedulerConfig

from tests.engine.harness import Driver, build_scheduler, free_blocks, make_request


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    return now


def _step(driver: Driver, clock: list[float], seconds: float = 0.02):
    output = driver.step()
    clock[0] += seconds
    return output


def test_report_scenario_4_5_runs_a_and_c_first_then_b_without_starving(clock: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    """KV nearly exhausted by running standard decodes (which B may not preempt); A (VIP, 1000-token
    prompt, tight TTFT), B (standard, 5000 tokens), C (free, 100 tokens) arrive together."""
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # the tiny model says 2,048; nothing runs it
    config = EngineSchedulerConfig(spec=SchedulerSpec(critical_kv_headroom=0.0))
    scheduler = build_scheduler(config=config, max_num_seqs=16, num_blocks=600, max_model_len=8192, max_num_batched_tokens=2048)
    driver = Driver(scheduler)
    fillers = [make_request(Tier.STANDARD, tenant="others", prompt_tokens=1008, max_tokens=48, arrival=clock[0]) for _ in range(7)]
    driver.add(*fillers)
    while any(scheduler.requests[r.request_id].num_output_tokens == 0 for r in fillers):
        _step(driver, clock)
    assert 80 < free_blocks(scheduler) < 200  # 7 x 63 blocks held: the cache is nearly full
    a = make_request(Tier.CRITICAL, tenant="vip", prompt_tokens=1000, max_tokens=8, ttft_ms=300.0, arrival=clock[0])
    b = make_request(Tier.STANDARD, tenant="std", prompt_tokens=5000, max_tokens=8, ttft_ms=5000.0, arrival=clock[0])
    c = make_request(Tier.BATCH, tenant="free", prompt_tokens=100, max_tokens=8, arrival=clock[0])
    driver.add(b, c, a)
    output = _step(driver, clock)
    admitted = {r.req_id for r in output.scheduled_new_reqs}
    assert admitted == {a.request_id, c.request_id}  # A and C run first; B does not fit yet
    assert not output.preempted_req_ids  # nobody B could preempt (same tier), nobody A needed to
    driver.run_until_idle()
    first = driver.first_scheduled_step
    assert first[a.request_id] == first[c.request_id] < first[b.request_id]
    assert driver.finished >= {a.request_id, b.request_id, c.request_id}  # B follows: no starvation
    # B started as soon as the fillers' blocks came back, well inside its TTFT objective
    assert (first[b.request_id] - first[a.request_id]) * 0.02 < 5.0


def test_a_tenant_at_its_kv_cap_does_not_hold_other_tenants_back(clock: list[float]) -> None:
    config = EngineSchedulerConfig(tenant_kv_share={"small": 0.25})
    scheduler = build_scheduler(config=config, max_num_seqs=16, num_blocks=41)  # small's cap: 10 blocks
    driver = Driver(scheduler)
    capped = [make_request(Tier.STANDARD, tenant="small", prompt_tokens=32, max_tokens=16, arrival=clock[0]) for _ in range(3)]
    driver.add(*capped)
    _step(driver, clock)
    assert all(scheduler.requests[r.request_id] in scheduler.running for r in capped)  # 9 of 10 blocks reserved
    over = make_request(Tier.STANDARD, tenant="small", prompt_tokens=32, max_tokens=16, ttft_ms=1000.0, arrival=clock[0] - 1.0)
    other = make_request(Tier.STANDARD, tenant="big", prompt_tokens=32, max_tokens=16, ttft_ms=1000.0, arrival=clock[0])
    driver.add(over, other)
    output = _step(driver, clock)
    assert {r.req_id for r in output.scheduled_new_reqs} == {other.request_id}  # over ranks first but is capped
    driver.run_until_idle()
    assert over.request_id in driver.finished


def test_a_batch_head_refused_by_the_critical_headroom_lets_a_smaller_one_through(clock: list[float]) -> None:
    config = EngineSchedulerConfig(spec=SchedulerSpec(critical_kv_headroom=0.25))
    scheduler = build_scheduler(config=config, max_num_seqs=16, num_blocks=41)  # 40 usable, 10 kept for critical
    driver = Driver(scheduler)
    holder = make_request(Tier.STANDARD, prompt_tokens=320, max_tokens=40, arrival=clock[0])  # 20 blocks, then growing
    driver.add(holder)
    _step(driver, clock)
    free = free_blocks(scheduler)
    big = make_request(Tier.BATCH, prompt_tokens=16 * (free - 10), max_tokens=4, arrival=clock[0] - 5.0)  # would dip into the headroom
    small = make_request(Tier.BATCH, prompt_tokens=16, max_tokens=4, arrival=clock[0])
    driver.add(big, small)
    output = _step(driver, clock)
    assert {r.req_id for r in output.scheduled_new_reqs} == {small.request_id}
    assert free_blocks(scheduler) >= 10
    driver.run_until_idle()
    assert {big.request_id, small.request_id} <= driver.finished


def test_backfill_past_a_head_that_does_not_fit_stops_at_half_its_horizon(clock: list[float]) -> None:
    config = EngineSchedulerConfig(spec=SchedulerSpec(critical_kv_headroom=0.0, aging_bound_seconds=10.0))
    scheduler = build_scheduler(config=config, max_num_seqs=16, num_blocks=101, max_model_len=2048, max_num_batched_tokens=2048)
    driver = Driver(scheduler)
    holder = make_request(Tier.BATCH, prompt_tokens=1200, max_tokens=400, arrival=clock[0])  # 75 blocks for a long while
    driver.add(holder)
    _step(driver, clock)
    head = make_request(Tier.STANDARD, prompt_tokens=800, max_tokens=4, ttft_ms=4000.0, arrival=clock[0])  # 50 blocks: no room
    driver.add(head)
    admitted_behind: list[float] = []
    for _ in range(150):  # 3 s: smalls arrive behind the head all along
        small = make_request(Tier.BATCH, prompt_tokens=16, max_tokens=20, arrival=clock[0])
        driver.add(small)
        output = _step(driver, clock)
        if small.request_id in {r.req_id for r in output.scheduled_new_reqs}:
            admitted_behind.append(clock[0] - head.arrival_time)
    assert admitted_behind and min(admitted_behind) < 0.1  # backfilled at once...
    assert max(admitted_behind) <= 2.0 + 0.05  # ...and only in the first half of the head's 4 s objective
    driver.run_until_idle(max_steps=5000)
    assert head.request_id in driver.finished


def test_a_head_refused_by_the_critical_headroom_stops_the_backfill_at_half_its_horizon(clock: list[float]) -> None:
    """Passed over for the headroom for good, a big request would lose every block that frees up to
    the small ones behind it (the demo's standard prompts waited seconds so)."""
    config = EngineSchedulerConfig(spec=SchedulerSpec(critical_kv_headroom=0.2, aging_bound_seconds=10.0))
    scheduler = build_scheduler(config=config, max_num_seqs=16, num_blocks=101, max_model_len=2048, max_num_batched_tokens=2048)
    driver = Driver(scheduler)
    # 72 of 100 blocks for 6 s, of the head's own tier: the head may not preempt it.
    holder = make_request(Tier.STANDARD, prompt_tokens=1140, max_tokens=60, arrival=clock[0])
    driver.add(holder)
    _step(driver, clock, 0.1)
    assert free_blocks(scheduler) == 28
    # 10 blocks fit in the 28 free ones, but not with the 20 kept for critical requests.
    head = make_request(Tier.STANDARD, prompt_tokens=160, max_tokens=4, ttft_ms=4000.0, arrival=clock[0])
    driver.add(head)
    admitted_behind: list[float] = []
    for _ in range(30):  # 3 s: one-block requests arrive behind the head all along, and leave the headroom whole
        small = make_request(Tier.BATCH, prompt_tokens=16, max_tokens=1, arrival=clock[0])
        driver.add(small)
        output = _step(driver, clock, 0.1)
        if small.request_id in {r.req_id for r in output.scheduled_new_reqs}:
            admitted_behind.append(clock[0] - head.arrival_time)
    assert head.request_id not in driver.first_scheduled_step  # the headroom held it back all along
    assert admitted_behind and min(admitted_behind) < 0.2  # backfilled at once...
    assert max(admitted_behind) <= 2.0 + 0.1  # ...and only in the first half of the head's 4 s objective
    driver.run_until_idle(max_steps=5000)
    assert head.request_id in driver.finished


def test_lower_tier_backfill_does_not_take_the_room_a_passed_over_head_waits_for(clock: list[float]) -> None:
    """EASY backfilling: a standard head waits for running requests to finish one by one; batch
    requests behind it that would still hold blocks when enough room is free are held back, so the
    head starts then. Before, each freed piece went to the small ones behind it until the head's
    backfill slack was spent."""
    config = EngineSchedulerConfig(spec=SchedulerSpec(critical_kv_headroom=0.0, aging_bound_seconds=10.0))
    scheduler = build_scheduler(config=config, max_num_seqs=16, num_blocks=101, max_model_len=2048, max_num_batched_tokens=2048)
    driver = Driver(scheduler)
    holders = [make_request(Tier.STANDARD, prompt_tokens=240, max_tokens=5 * (i + 1), arrival=clock[0]) for i in range(6)]
    driver.add(*holders)  # 16 blocks each (96 of 100), one done every 5 steps
    _step(driver, clock)
    # 50 blocks; no TTFT objective, so it waits rather than preempt (as an urgent request that
    # expects finishing requests to free its room in time does, engine/src/slaq/engine/preemption.py)
    head = make_request(Tier.STANDARD, prompt_tokens=800, max_tokens=4, arrival=clock[0])
    driver.add(head)
    added_at = driver.steps
    quick = []  # done before the room frees up: these may still go
    for step in range(60):
        driver.add(make_request(Tier.BATCH, prompt_tokens=160, max_tokens=40, arrival=clock[0]))  # 10 blocks, 40 steps
        if step < 2:
            quick.append(make_request(Tier.BATCH, prompt_tokens=16, max_tokens=2, arrival=clock[0]))
            driver.add(quick[-1])
        _step(driver, clock)
    first = driver.first_scheduled_step
    assert all(q.request_id in first for q in quick)  # a request done before the room frees up is backfilled
    # Four holders done (20 steps, and a few of async lag) leave its 50 blocks; before, it had not started in 60.
    assert head.request_id in first and first[head.request_id] - added_at <= 26
    driver.run_until_idle(max_steps=5000)
    assert head.request_id in driver.finished
