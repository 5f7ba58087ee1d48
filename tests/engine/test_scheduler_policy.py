"""SLAScheduler against the real vLLM 0.32 scheduler machinery (no model, no GPU)."""

from __future__ import annotations

import time

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from slaq.api.common import Tier
from slaq.api.pool import SchedulerSpec
from slaq.engine.config import EngineSchedulerConfig
from slaq.engine.scheduler import SLAScheduler
from slaq.policy.discipline import Discipline

from tests.engine.harness import Driver, build_scheduler, free_blocks, make_request


def _full_batch_of_batch_decodes(scheduler_cls: type) -> tuple[Driver, list]:
    driver = Driver(build_scheduler(scheduler_cls, max_num_seqs=4))
    batch = [make_request(Tier.BATCH, tenant="bulk", max_tokens=200) for _ in range(4)]
    driver.add(*batch)
    for _ in range(3):
        driver.step()
    assert all(driver.scheduler.requests[r.request_id] in driver.scheduler.running for r in batch)
    return driver, batch


def test_urgent_request_is_admitted_within_one_step_despite_a_full_batch() -> None:
    driver, batch = _full_batch_of_batch_decodes(SLAScheduler)
    urgent = make_request(Tier.CRITICAL, tenant="vip", ttft_ms=200.0)
    driver.add(urgent)
    output = driver.step()
    assert urgent.request_id in {r.req_id for r in output.scheduled_new_reqs}
    assert len(output.preempted_req_ids & {r.request_id for r in batch}) == 1
    driver.run_until_idle()
    assert driver.finished == {r.request_id for r in batch} | {urgent.request_id}


def test_a_full_batch_checks_no_waiting_request_and_a_free_slot_does() -> None:
    driver = Driver(build_scheduler(SLAScheduler, max_num_seqs=2))
    scheduler = driver.scheduler
    running = [make_request(Tier.BATCH, tenant="bulk", max_tokens=4) for _ in range(2)]
    driver.add(*running)
    driver.step()
    checked: list = []
    admission = scheduler.waiting_queue.admission
    scheduler.waiting_queue.admission = lambda request: checked.append(request) or admission(request)
    waiting = [make_request(Tier.BATCH, tenant="bulk") for _ in range(2)]  # the last one left is never checked (queue.py)
    driver.add(*waiting)
    output = driver.step()
    assert checked == [] and not {r.request_id for r in waiting} & set(output.num_scheduled_tokens)
    while waiting[0].request_id not in driver.first_scheduled_step:
        driver.step()
    assert checked and checked[0] is waiting[0]


def test_stock_priority_scheduler_leaves_the_urgent_request_waiting() -> None:
    driver, batch = _full_batch_of_batch_decodes(AsyncScheduler)
    urgent = make_request(Tier.CRITICAL, tenant="vip", ttft_ms=200.0)
    driver.add(urgent)
    for _ in range(20):
        output = driver.step()
        assert urgent.request_id not in output.num_scheduled_tokens
        assert not output.preempted_req_ids
    driver.run_until_idle()
    assert driver.first_scheduled_step[urgent.request_id] > 150  # it waited for a batch decode to finish


def test_standard_request_preempts_batch_but_never_critical() -> None:
    driver = Driver(build_scheduler(max_num_seqs=2))
    critical = make_request(Tier.CRITICAL, max_tokens=60)
    batch = make_request(Tier.BATCH, max_tokens=60)
    driver.add(critical, batch)
    driver.step(); driver.step()
    standard = make_request(Tier.STANDARD, ttft_ms=1000.0, max_tokens=4)
    driver.add(standard)
    output = driver.step()
    assert output.preempted_req_ids == {batch.request_id}
    assert standard.request_id in output.num_scheduled_tokens
    driver.run_until_idle()
    assert critical.request_id not in set().union(*driver.preempted)


def test_no_request_starves_under_a_sustained_critical_flood(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    aging_bound = 2.0
    config = EngineSchedulerConfig(spec=SchedulerSpec(aging_bound_seconds=aging_bound))
    driver = Driver(build_scheduler(config=config, max_num_seqs=2))
    batch = [make_request(Tier.BATCH, tenant="bulk", max_tokens=4, arrival=clock[0]) for _ in range(3)]
    driver.add(*batch)
    step_s = 0.05
    arrival_of = {r.request_id: clock[0] for r in batch}
    scheduled_at: dict[str, float] = {}
    for _ in range(400):  # 20 s of simulated time: two fresh critical requests every step
        driver.add(*(make_request(Tier.CRITICAL, tenant=f"vip{i}", max_tokens=2, arrival=clock[0]) for i in range(2)))
        output = driver.step()
        for request_id in output.num_scheduled_tokens:
            scheduled_at.setdefault(request_id, clock[0])
        clock[0] += step_s
    # Each batch request gets in once it has aged past the bound, one at a time: the k-th within
    # k more turns of the starving share (a starving choice in 1 / agedShare, about one admission
    # per step here), although the critical flood's own backlog is past the bound too (starving
    # requests go oldest first: by formula 1 the critical ones outranked the batch for ever).
    turn_s = step_s / Discipline().aged_share
    admitted = sorted(scheduled_at.get(r.request_id, float("inf")) - arrival_of[r.request_id] for r in batch)
    for k, waited in enumerate(admitted):
        assert waited < float("inf"), "a batch request starved"
        assert waited <= aging_bound + (k + 1) * turn_s + 0.5, (k, admitted)


def test_no_preemption_ping_pong_and_victims_make_progress_first() -> None:
    config = EngineSchedulerConfig(spec=SchedulerSpec(max_preemptions_per_step=4), min_progress_tokens=4)
    driver = Driver(build_scheduler(config=config, max_num_seqs=3))
    batch = [make_request(Tier.BATCH, max_tokens=80) for _ in range(3)]
    driver.add(*batch)
    for _ in range(3):
        driver.step()
    outputs_at_preemption: dict[str, list[int]] = {}
    for step in range(60):
        if step % 3 == 0:
            driver.add(make_request(Tier.CRITICAL, max_tokens=3))
        output = driver.step()
        for request_id in output.preempted_req_ids:
            request = driver.scheduler.requests[request_id]
            assert request.priority == Tier.BATCH.rank  # only lower-tier requests are victims
            history = outputs_at_preemption.setdefault(request_id, [])
            if history:
                assert request.num_output_tokens >= history[-1] + 4, "preempted again before making progress"
            history.append(request.num_output_tokens)
    assert outputs_at_preemption, "the scenario must preempt"
    driver.run_until_idle()
    assert {r.request_id for r in batch} <= driver.finished


def test_critical_headroom_holds_against_lower_tiers_and_critical_uses_it() -> None:
    config = EngineSchedulerConfig(spec=SchedulerSpec(critical_kv_headroom=0.25))
    scheduler = build_scheduler(config=config, max_num_seqs=16, num_blocks=41)  # 40 usable, 10 kept for critical
    driver = Driver(scheduler)
    # 40 + 8 tokens fit in the 3 blocks each prompt takes: no decode grows (decodes may grow into
    # the headroom, the next test), so what holds it here is admission alone.
    driver.add(*(make_request(Tier.BATCH if i % 2 else Tier.STANDARD, prompt_tokens=40, max_tokens=8) for i in range(12)))
    for _ in range(10):
        driver.step()
        assert free_blocks(scheduler) >= 10
    assert scheduler.block_manager.ledger.blocks_by_tier[Tier.CRITICAL.rank] == 0
    critical = make_request(Tier.CRITICAL, prompt_tokens=64, max_tokens=4)
    driver.add(critical)
    output = driver.step()
    assert critical.request_id in output.num_scheduled_tokens
    driver.run_until_idle()
    assert len(driver.finished) == 13


def test_blocks_the_critical_tier_holds_count_against_its_headroom() -> None:
    """The headroom is the critical tier's reserve: while critical requests hold blocks, only what
    they do not use of it stays free. 40 usable blocks, 10 reserved; a critical request holds 4.
    A standard request needing 24 blocks leaves 40 - 4 - 24 = 12 free: above the 6 of the reserve
    still unused, so it is admitted (kept for the whole 10, it would wait for the critical one)."""
    config = EngineSchedulerConfig(spec=SchedulerSpec(critical_kv_headroom=0.25))
    scheduler = build_scheduler(config=config, max_num_seqs=16, num_blocks=41)
    driver = Driver(scheduler)
    critical = make_request(Tier.CRITICAL, prompt_tokens=60, max_tokens=40)  # 4 blocks, 6 once done
    driver.add(critical)
    driver.step()
    assert scheduler.block_manager.ledger.blocks_by_tier[Tier.CRITICAL.rank] == 4
    standard = make_request(Tier.STANDARD, prompt_tokens=24 * 16 - 8, max_tokens=4)  # 24 blocks, decodes included
    driver.add(standard)
    output = driver.step()
    assert standard.request_id in output.num_scheduled_tokens and critical.request_id in output.num_scheduled_tokens
    batch = make_request(Tier.BATCH, prompt_tokens=6 * 16 - 4, max_tokens=4)  # 6 blocks leave 6 free: the reserve's unused part, not less
    driver.add(batch)
    driver.step()
    assert batch.request_id in driver.first_scheduled_step
    late = make_request(Tier.BATCH, prompt_tokens=16, max_tokens=4)
    driver.add(late)
    driver.step()
    assert late.request_id not in driver.first_scheduled_step  # one more block would dip into the unused reserve
    driver.run_until_idle()
    assert driver.finished == {critical.request_id, standard.request_id, batch.request_id, late.request_id}


def test_a_running_decode_grows_into_the_headroom_instead_of_being_preempted() -> None:
    """Six standard requests are admitted down to the headroom (5 prompt blocks each, 10 blocks
    left); each then needs a sixth block to decode. Refusing that growth would make vLLM preempt
    (and recompute) requests to keep the headroom whole; they grow into it and all finish unpreempted."""
    config = EngineSchedulerConfig(spec=SchedulerSpec(critical_kv_headroom=0.25))
    scheduler = build_scheduler(config=config, max_num_seqs=16, num_blocks=41)  # 40 usable, 10 kept for critical
    driver = Driver(scheduler)
    requests = [make_request(Tier.STANDARD, prompt_tokens=80, max_tokens=12) for _ in range(7)]  # 80 + 12 tokens: 6 blocks
    driver.add(*requests)
    driver.step()
    assert len(scheduler.running) == 6 and free_blocks(scheduler) == 10  # the seventh waits: admission keeps the headroom
    lowest = free_blocks(scheduler)
    while len(driver.finished) < 6:
        driver.step()
        lowest = min(lowest, free_blocks(scheduler))
    assert lowest == 4 and not set().union(*driver.preempted)
    driver.run_until_idle()
    assert len(driver.finished) == 7


def test_a_lower_tier_prompt_in_chunks_is_admitted_whole_beside_the_headroom_and_never_preempted_for_it() -> None:
    """One tier, prompts of 10 blocks computed in 4-block chunks (a 64-token step budget), 40 usable
    blocks of which 10 are the critical reserve: three prompts fit beside it whole, the fourth waits.
    Held to the reserve chunk by chunk, a prompt admitted on its first chunk found the reserve short at
    a later one and vLLM preempted the latest arrival, throwing its chunks away, again and again."""
    config = EngineSchedulerConfig(spec=SchedulerSpec(critical_kv_headroom=0.25))
    scheduler = build_scheduler(config=config, max_num_seqs=16, num_blocks=41, max_num_batched_tokens=64)
    driver = Driver(scheduler)
    requests = [make_request(Tier.STANDARD, prompt_tokens=156, max_tokens=8) for _ in range(6)]  # 10 blocks each, decodes included
    driver.add(*requests)
    most_running = 0
    while len(driver.finished) < 3:
        driver.step()
        most_running = max(most_running, len(scheduler.running))
    assert most_running == 3
    driver.run_until_idle()
    assert len(driver.finished) == 6 and not set().union(*driver.preempted)


def test_per_tenant_kv_cap_holds() -> None:
    config = EngineSchedulerConfig(tenant_kv_share={"small": 0.25})
    scheduler = build_scheduler(config=config, max_num_seqs=16, num_blocks=41)  # cap: 10 blocks
    driver = Driver(scheduler)
    driver.add(*(make_request(Tier.STANDARD, tenant="small", prompt_tokens=32, max_tokens=16) for _ in range(8)))
    driver.add(*(make_request(Tier.STANDARD, tenant="big", prompt_tokens=32, max_tokens=16) for _ in range(4)))
    max_small_running = 0
    while scheduler.has_requests():
        driver.step()
        held = sum(len(scheduler.kv_cache_manager.get_block_ids(r.request_id)[0]) for r in scheduler.running if r.request_id.split("-")[1] == "small")
        assert held <= 10
        max_small_running = max(max_small_running, sum(1 for r in scheduler.running if "-small-" in r.request_id))
    assert max_small_running == 3  # 3 blocks reserved each (32 + 16 tokens)
    assert len(driver.finished) == 12


@pytest.mark.parametrize("scheduler_cls", [SLAScheduler, AsyncScheduler])
def test_mixed_load_finishes_and_frees_every_block(scheduler_cls: type) -> None:
    scheduler = build_scheduler(scheduler_cls, max_num_seqs=4, num_blocks=60, max_num_batched_tokens=128)
    driver = Driver(scheduler)
    tiers = [Tier.BATCH, Tier.STANDARD, Tier.CRITICAL]
    requests = [make_request(tiers[i % 3], tenant=f"t{i % 4}", prompt_tokens=20 + 7 * i, max_tokens=5 + i % 11, prompt_seed=i % 5) for i in range(40)]
    for index, request in enumerate(requests):
        driver.add(request)
        if index % 3 == 0:
            driver.step()
    driver.run_until_idle()
    assert driver.finished == {r.request_id for r in requests}
    assert free_blocks(scheduler) == 59
    if scheduler_cls is SLAScheduler:
        ledger = scheduler.block_manager.ledger
        assert not ledger.holdings and not ledger.reserved_by_tenant and sum(ledger.blocks_by_tier) == 0
        assert not scheduler.block_manager.slaq_decode_room  # the decode room went with the holdings
        assert len(scheduler.waiting) == 0


def _escalated(tier: Tier, **kwargs):
    """A request whose vLLM priority a tenant forged (the `X-Vllm-Priority` header vLLM reads)."""
    request = make_request(tier, **kwargs)
    request.priority = -1_000_000
    return request


def test_a_forged_priority_is_replaced_by_the_tier_from_vllm_xargs() -> None:
    scheduler = build_scheduler()
    forged = _escalated(Tier.BATCH, tenant="free")
    scheduler.add_request(forged)
    assert forged.priority == Tier.BATCH.rank


def test_kv_exhaustion_preempts_the_forged_batch_decode_not_the_critical_one() -> None:
    # 14 blocks of 16 tokens: two 48-token prompts decoding 100 tokens each cannot both fit,
    # so vLLM's own KV-exhaustion preemption (inside schedule()) must pick a victim by priority.
    driver = Driver(build_scheduler(max_num_seqs=2, num_blocks=14))
    vip = make_request(Tier.CRITICAL, tenant="vip", prompt_tokens=48, max_tokens=100)
    flood = _escalated(Tier.BATCH, tenant="free", prompt_tokens=48, max_tokens=100)
    driver.add(flood, vip)
    driver.run_until_idle()
    preempted = set().union(*driver.preempted)
    assert flood.request_id in preempted
    assert vip.request_id not in preempted


def _preemptions(driver: Driver, request) -> int:
    return sum(request.request_id in step for step in driver.preempted)


@pytest.mark.parametrize("num_blocks", [28, 14])
def test_kv_exhaustion_preempts_batch_decodes_not_a_critical_one_admitted_after_them(num_blocks: int) -> None:
    # Nothing forged: the batch requests run first, so the critical one is last in `running`.
    # 48 + 100 tokens need 10 blocks of 16 each; 28 (or 14) blocks cannot hold all three.
    driver = Driver(build_scheduler(max_num_seqs=4, num_blocks=num_blocks))
    batch = [make_request(Tier.BATCH, tenant="free", prompt_tokens=48, max_tokens=100) for _ in range(2)]
    driver.add(*batch)
    driver.step()
    vip = make_request(Tier.CRITICAL, tenant="vip", prompt_tokens=48, max_tokens=100)
    driver.add(vip)
    driver.run_until_idle()
    assert driver.finished == {r.request_id for r in (*batch, vip)}
    assert _preemptions(driver, vip) == 0
    assert sum(_preemptions(driver, r) for r in batch) >= 1  # the cache did run out


def test_kv_exhaustion_among_critical_requests_preempts_the_latest_arrival() -> None:
    # Only critical requests run: vLLM's own rule stands, the latest arrival_time goes first,
    # here the request admitted first (so not the last in `running`).
    now = time.time()
    driver = Driver(build_scheduler(max_num_seqs=4, num_blocks=14))
    latest = make_request(Tier.CRITICAL, tenant="vip", prompt_tokens=48, max_tokens=100, arrival=now)
    driver.add(latest)
    driver.step()
    earlier = make_request(Tier.CRITICAL, tenant="vip", prompt_tokens=48, max_tokens=100, arrival=now - 1.0)
    driver.add(earlier)
    driver.step()
    assert [r.request_id for r in driver.scheduler.running] == [latest.request_id, earlier.request_id]
    driver.run_until_idle()
    victims = [step for step in driver.preempted if step]
    assert victims and victims[0] == {latest.request_id}
    assert _preemptions(driver, earlier) == 0
