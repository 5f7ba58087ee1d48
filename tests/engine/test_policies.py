"""The engine's small policy objects, each alone: queue order, fairness, victims, block budget."""

from __future__ import annotations

import time

import pytest

from slaq.api.common import Tier
from slaq.api.pool import SchedulerSpec, ScoreWeights
from slaq.engine import vllm_compat as vc
from slaq.engine.blocks import BlockBudgetRule
from slaq.engine.ordering import MISSED_CLASS, WaitingOrder
from slaq.policy import PodPolicy
from slaq.policy.accounting import VirtualTokenCounters
from slaq.engine.preemption import REASON_BATCH_FULL, REASON_KV_FULL, ResourceView, ThrashGuard, UrgentPreemption
from slaq.engine.queue import SLARequestQueue
from slaq.policy.discipline import Discipline
from slaq.engine.scheduler import SLAScheduler
from slaq.engine.sla import request_info
from slaq.api.contract import RequestSLA

from tests.engine.harness import Driver, build_scheduler, make_request, waiting_queue

NOW = 1_000_000.0
AGED_SHARE = Discipline().aged_share


def _queue(spec: SchedulerSpec | None = None, fairness: VirtualTokenCounters | None = None) -> SLARequestQueue:
    spec = spec or SchedulerSpec()
    policy = PodPolicy.from_spec(spec)
    if fairness is not None:
        policy.accounting = fairness
    queue = waiting_queue(spec, policy, max_length_tokens=1024)
    queue.begin_step(NOW)
    return queue


def _drain(queue: SLARequestQueue) -> list[str]:
    return [queue.pop_request().request_id for _ in range(len(queue))]


def test_tiers_run_in_order_and_within_a_tier_earlier_deadlines_first() -> None:
    queue = _queue()
    batch = make_request(Tier.BATCH, arrival=NOW - 5)
    std_late = make_request(Tier.STANDARD, ttft_ms=2000, arrival=NOW)
    std_early = make_request(Tier.STANDARD, ttft_ms=2000, arrival=NOW - 0.1)
    critical = make_request(Tier.CRITICAL, ttft_ms=500, arrival=NOW)
    for request in (batch, std_late, std_early, critical):
        queue.add_request(request)
    assert queue.depth_by_tier() == {Tier.CRITICAL: 1, Tier.STANDARD: 2, Tier.BATCH: 1}
    assert _drain(queue) == [critical.request_id, std_early.request_id, std_late.request_id, batch.request_id]


def test_a_request_past_the_aging_bound_outranks_fresh_critical_arrivals() -> None:
    queue = _queue(SchedulerSpec(aging_bound_seconds=10.0))
    old_batch = make_request(Tier.BATCH, arrival=NOW - 10.5)
    queue.add_request(make_request(Tier.CRITICAL, arrival=NOW))
    queue.add_request(old_batch)
    assert queue.peek_request() is old_batch


def test_starving_requests_get_a_bounded_share_of_contested_admissions() -> None:
    # Under a sustained overload the batch backlog is always starving: it must not take every
    # admission from fresh higher-tier arrivals, but it must keep at least AGED_SHARE of them.
    queue = _queue(SchedulerSpec(aging_bound_seconds=10.0))
    starving = [make_request(Tier.BATCH, arrival=NOW - 11 - i * 0.01) for i in range(40)]
    fresh = [make_request(Tier.STANDARD, ttft_ms=2000, arrival=NOW) for _ in range(40)]
    for request in starving + fresh:
        queue.add_request(request)
    starving_ids = {r.request_id for r in starving}
    admitted = [queue.pop_request().request_id for _ in range(40)]
    share = sum(request_id in starving_ids for request_id in admitted) / len(admitted)
    assert admitted[0] in starving_ids  # no admissions yet: the starving request goes first
    assert AGED_SHARE - 0.1 <= share <= AGED_SHARE + 0.15


def test_attainable_higher_tier_deadlines_go_before_a_lower_tier_backlog() -> None:
    # Formula 1 alone ranks a batch request 40 s into its 60 s objective above a fresh standard
    # request (its urgency term nears 1); the standard request can still meet its objective.
    queue = _queue()
    old_batch = make_request(Tier.BATCH, ttft_ms=60_000, arrival=NOW - 40)
    standard = make_request(Tier.STANDARD, ttft_ms=2000, arrival=NOW)
    queue.add_request(old_batch)
    queue.add_request(standard)
    assert queue.peek_request() is standard


def test_missed_higher_tier_requests_compete_with_the_lower_tier_by_formula_1() -> None:
    queue = _queue()
    missed = make_request(Tier.STANDARD, ttft_ms=2000, arrival=NOW - 3)
    batch = make_request(Tier.BATCH, ttft_ms=60_000, arrival=NOW - 1)
    queue.add_request(missed)
    queue.add_request(batch)
    order = queue.order
    assert order.rank(vc.attached_info(missed), NOW)[0] == order.rank(vc.attached_info(batch), NOW)[0] == MISSED_CLASS
    assert queue.peek_request() is missed  # urgency saturated + tier term outscore a fresh batch request


def test_a_missed_head_does_not_hide_the_attainable_requests_of_its_tier() -> None:
    # A burst of VIP arrivals: the oldest has missed its 130 ms objective, the next can still meet
    # theirs. They go before an attainable standard request; the missed one competes as missed.
    queue = _queue()
    missed = make_request(Tier.CRITICAL, ttft_ms=130, arrival=NOW - 0.2)
    attainable = [make_request(Tier.CRITICAL, ttft_ms=130, arrival=NOW - 0.05 + i * 0.01) for i in range(3)]
    standard = make_request(Tier.STANDARD, ttft_ms=500, arrival=NOW - 0.1)
    for request in (missed, *attainable, standard):
        queue.add_request(request)
    assert _drain(queue) == [r.request_id for r in attainable] + [standard.request_id, missed.request_id]


def test_missed_requests_are_urgent_after_attainable_ones_and_preempt_only_the_lowest_tier() -> None:
    # Preempting an attainable standard request for a VIP request that has missed its objective
    # buys nothing: the queue admits the standard one again ahead of it (traced on the demo: a
    # standard request preempted and re-admitted every step). A batch victim it outranks in any class.
    queue = _queue()
    missed = make_request(Tier.CRITICAL, ttft_ms=130, arrival=NOW - 0.2)
    queue.add_request(missed)
    queue.begin_step(NOW)
    assert queue.urgent_heads(2) == [missed]
    standard = make_request(Tier.STANDARD, ttft_ms=500, arrival=NOW - 0.1)
    fresh = make_request(Tier.CRITICAL, ttft_ms=130, arrival=NOW)
    queue.add_request(standard)
    queue.add_request(fresh)
    assert queue.urgent_heads(3) == [fresh, standard, missed]
    assert len(queue) == 3 and queue.peek_request() is fresh

    scheduler, _, running = _running_scheduler([Tier.STANDARD, Tier.BATCH])
    late = make_request(Tier.CRITICAL, ttft_ms=130)
    scheduler.add_request(late)
    past = scheduler.info_of(late).deadline + 0.01
    plan = UrgentPreemption(max_per_step=4).plan([late], running[:1], _resources(now=past), scheduler.info_of)
    assert plan == []  # only the standard request runs: not preempted for a missed request
    plan = UrgentPreemption(max_per_step=4).plan([late], running, _resources(now=past), scheduler.info_of)
    assert [p.victim.request_id for p in plan] == [running[1].request_id]
    in_time = UrgentPreemption(max_per_step=4).plan([late], running[:1], _resources(now=past - 0.1), scheduler.info_of)
    assert [p.victim.request_id for p in in_time] == [running[0].request_id]  # attainable: a standard victim is fair game


def test_a_request_nearer_its_deadline_than_its_first_token_takes_counts_as_missed_below_the_critical_tier() -> None:
    # With 50 ms from admission to a first token, a standard request 30 ms from its deadline cannot
    # make it: it goes after the one that can, and is urgent after it. A critical request as near
    # stays attainable: its prompt goes into the next step (urgent prefill planning).
    queue = _queue()
    queue.lead = lambda info: 0.05
    near = make_request(Tier.STANDARD, ttft_ms=500, arrival=NOW - 0.47)
    far = make_request(Tier.STANDARD, ttft_ms=500, arrival=NOW - 0.3)
    critical = make_request(Tier.CRITICAL, ttft_ms=130, arrival=NOW - 0.11)
    for request in (near, far, critical):
        queue.add_request(request)
    queue.begin_step(NOW)
    assert queue.urgent_heads(3) == [critical, far, near]
    assert _drain(queue) == [critical.request_id, far.request_id, near.request_id]


@pytest.mark.parametrize("seed", range(5))
def test_the_choice_is_the_smallest_full_rank_over_the_tier_heads(seed: int) -> None:
    # The queue computes formula 1 only for heads whose rank class ties; the reference ranks every
    # head fully, as `WaitingOrder.rank` defines the order, with the AGED_SHARE rule on top.
    import random

    rng = random.Random(seed)
    queue = _queue(SchedulerSpec(aging_bound_seconds=10.0))
    for _ in range(60):
        tier = rng.choice(list(Tier))
        ttft_ms = rng.choice([None, 500, 2000, 60_000]) if tier is not Tier.CRITICAL else rng.choice([500, 2000])
        queue.add_request(make_request(tier, ttft_ms=ttft_ms, arrival=NOW - rng.uniform(0, 14), prompt_tokens=rng.randint(1, 400),
                                       max_tokens=rng.randint(1, 400), tenant=f"t{rng.randint(0, 3)}"))
    order = queue.order
    tiers = queue.tiers
    while queue:
        heads = tiers.heads()  # each tier offers its earliest attainable request and its oldest missed one
        ranked = [(order.rank(vc.attached_info(head.item), NOW), head.tier_rank, head.item) for head in heads]
        best = min(ranked, key=lambda r: r[0])
        fresh = [r for r in ranked if r[0][0]]
        if not best[0][0] and fresh and tiers.aged_share >= AGED_SHARE:
            candidate = min(fresh, key=lambda r: r[0])
            if candidate[1] < best[1]:
                best = candidate
        assert queue.pop_request() is best[2]


@pytest.mark.parametrize("load", [0.0, 0.37, 1.0, 2.5])
def test_the_engine_ranks_with_the_pod_policy_and_its_own_view_of_the_request(load: float) -> None:
    # WaitingOrder is a host: its ranks are the policy's ranks of the view it builds, with the
    # tenant's current VTC share, and every rank class is reachable from the engine.
    from slaq.policy.ranking import LOWEST_RANK

    spec = SchedulerSpec()
    policy = PodPolicy.from_spec(spec)
    policy.accounting.charge("batch", "t1", 500.0)
    policy.accounting.charge("batch", "t2", 100.0)
    order = WaitingOrder(policy, max_length_tokens=1024)
    order.set_load(load)
    ranks = set()
    for tier in Tier:
        for ttft_ms in (None, 500, 60_000):
            for waited in (0.0, 0.4, 3.0, 59.0, spec.aging_bound_seconds + 1.0):
                for tenant in ("t1", "t2", "t3"):
                    info = request_info(RequestSLA(tier=tier, tenant=tenant, ttft_ms=ttft_ms), arrival=NOW - waited,
                                        prompt_tokens=300, max_tokens=200, aging_bound_s=spec.aging_bound_seconds)
                    view = order.view(info)
                    assert view.tenant_service_share == policy.accounting.service_share(tier.value, tenant)
                    score = policy.ranking.score(view, NOW, order.pool)
                    if waited >= spec.aging_bound_seconds:
                        expected = (0, info.arrival)  # starving: the longest waiting first
                    elif info.ttft_s is not None and NOW < info.deadline and info.tier_rank < LOWEST_RANK:
                        expected = (1 + info.tier_rank, info.deadline)
                    else:
                        expected = (MISSED_CLASS, -score)
                    assert order.rank(info, NOW) == expected
                    ranks.add(expected[0])
    assert ranks == {0, 1, 2, MISSED_CLASS}  # every class was exercised


def test_peek_and_pop_agree_and_empty_queue_raises() -> None:
    queue = _queue()
    with pytest.raises(IndexError):
        queue.peek_request()
    request = make_request(Tier.STANDARD, arrival=NOW)
    queue.add_request(request)
    assert queue.peek_request() is request and queue.pop_request() is request and not queue


def test_removal_is_lazy_but_exact() -> None:
    queue = _queue()
    requests = [make_request(Tier.STANDARD, arrival=NOW - i) for i in range(5)]
    for request in requests:
        queue.add_request(request)
    queue.remove_requests([requests[4], requests[2]])
    queue.remove_request(requests[4])  # already gone: no effect
    assert len(queue) == 3 and queue.depth_by_tier()[Tier.STANDARD] == 3
    assert _drain(queue) == [requests[3].request_id, requests[1].request_id, requests[0].request_id]


def test_preempted_requests_go_back_ahead_of_their_tier_only() -> None:
    scheduler = build_scheduler(max_num_seqs=1)
    driver = Driver(scheduler)
    victim = make_request(Tier.BATCH, max_tokens=40, arrival=time.time() - 1)
    driver.add(victim)
    driver.step()
    older_batch = make_request(Tier.BATCH, arrival=time.time() - 30)
    critical = make_request(Tier.CRITICAL)
    driver.add(older_batch, critical)
    output = driver.step()  # the critical request preempts the running batch decode
    assert output.preempted_req_ids == {victim.request_id}
    order = [r.request_id for r in scheduler.waiting]
    assert order == [victim.request_id, older_batch.request_id]  # ahead of an older request of its tier


def test_the_queue_never_reads_or_writes_request_priority() -> None:
    queue = _queue()
    first, second = make_request(Tier.STANDARD, arrival=NOW - 2), make_request(Tier.STANDARD, arrival=NOW - 1)
    first.priority, second.priority = 99, -99  # a client-chosen priority has no say
    queue.add_request(second)
    queue.add_request(first)
    assert _drain(queue) == [first.request_id, second.request_id]
    assert (first.priority, second.priority) == (99, -99)


def test_fairness_credit_favours_the_tenant_served_less_within_a_tier() -> None:
    fairness = VirtualTokenCounters()
    fairness.charge("standard", "heavy", 0)
    fairness.charge("standard", "light", 0)
    fairness.charge("standard", "heavy", 10_000)
    fairness.charge("standard", "light", 100)
    queue = _queue(SchedulerSpec(weights=ScoreWeights(fairness=1.0)), fairness)
    heavy = make_request(Tier.STANDARD, tenant="heavy", ttft_ms=2000, arrival=NOW - 0.5)
    light = make_request(Tier.STANDARD, tenant="light", ttft_ms=2000, arrival=NOW)
    queue.add_request(heavy)
    queue.add_request(light)
    assert queue.pop_request() is light


def test_virtual_token_counters_start_newcomers_at_the_tier_minimum() -> None:
    counters = VirtualTokenCounters()
    counters.charge("batch", "a", 100)
    counters.charge("batch", "b", 300)  # joins at a's 100: 400
    counters.charge("batch", "c", 0)  # joins at the minimum, 100, not at 0
    assert counters.service_share("batch", "c") == pytest.approx(100 / 600)
    assert counters.service_share("batch", "nobody") == 0.0
    counters.forget("batch", "b")
    assert counters.service_share("batch", "a") == pytest.approx(0.5)


def _resources(**overrides) -> ResourceView:
    values = dict(free_slots=0, free_blocks=100, headroom_blocks=0, block_size=16, step_tokens=512)
    values.update(overrides)
    return ResourceView(**values)


def _running_scheduler(tiers: list[Tier]) -> tuple[SLAScheduler, Driver, list]:
    scheduler = build_scheduler(max_num_seqs=len(tiers))
    driver = Driver(scheduler)
    running = [make_request(tier, max_tokens=100) for tier in tiers]
    driver.add(*running)
    driver.step()
    return scheduler, driver, running


def test_victims_are_the_lowest_tier_and_only_strictly_lower_than_the_urgent_request() -> None:
    scheduler, _, running = _running_scheduler([Tier.CRITICAL, Tier.STANDARD, Tier.BATCH])
    planner = UrgentPreemption(max_per_step=4)
    critical = make_request(Tier.CRITICAL)
    scheduler.add_request(critical)
    plan = planner.plan([critical], running, _resources(), scheduler.info_of)
    assert [(p.victim.request_id, p.reason) for p in plan] == [(running[2].request_id, REASON_BATCH_FULL)]
    standard = make_request(Tier.STANDARD, ttft_ms=1000)
    scheduler.add_request(standard)
    only_batch = planner.plan([standard], running[:2], _resources(), scheduler.info_of)
    assert only_batch == []  # a standard request never preempts a critical or standard one


def test_kv_shortage_preempts_until_the_chunk_fits_and_the_bound_holds() -> None:
    scheduler, _, running = _running_scheduler([Tier.BATCH] * 4)
    critical = make_request(Tier.CRITICAL, prompt_tokens=100)  # 7 blocks
    scheduler.add_request(critical)
    plan = UrgentPreemption(max_per_step=4).plan([critical], running, _resources(free_slots=3, free_blocks=0), scheduler.info_of)
    assert len(plan) == 4 and {p.reason for p in plan} == {REASON_KV_FULL}  # each victim frees 2 blocks
    assert UrgentPreemption(max_per_step=3).plan([critical], running, _resources(free_slots=3, free_blocks=0), scheduler.info_of) == []


def test_an_urgent_request_waits_instead_of_preempting_when_requests_finishing_on_their_own_free_room_in_time() -> None:
    """Four batch decodes with 99 steps left each fill the batch. A critical request with a 1 s
    objective waits when those steps take 99 ms in all (nobody loses their work), and preempts
    when they would take 5 s, when the step time is not known yet, or when its deadline is near."""
    scheduler, _, running = _running_scheduler([Tier.BATCH] * 4)
    critical = make_request(Tier.CRITICAL, ttft_ms=1000.0)
    scheduler.add_request(critical)
    now = scheduler.info_of(critical).arrival
    planner = UrgentPreemption(max_per_step=4)
    assert planner.plan([critical], running, _resources(now=now, step_s=0.001), scheduler.info_of) == []
    for slow in (_resources(now=now, step_s=0.05), _resources(now=now, step_s=0.0), _resources(now=now + 0.95, step_s=0.001)):
        assert [p.victim for p in planner.plan([critical], running, slow, scheduler.info_of)] == [running[-1]]


def test_an_urgent_request_waits_for_room_only_within_a_share_of_its_objective() -> None:
    """The rest of the objective is its prefill and the way back to the client, which the engine
    does not see: with room free in 99 steps of 6 ms (594 ms) a critical request with a 1 s
    objective preempts, though it could still start two steps before its deadline; with 4 ms steps
    (396 ms, within WAIT_SHARE of it) it waits."""
    WAIT_SHARE = SchedulerSpec().step.wait_share
    assert WAIT_SHARE == 0.5
    scheduler, _, running = _running_scheduler([Tier.BATCH] * 4)
    critical = make_request(Tier.CRITICAL, ttft_ms=1000.0)
    scheduler.add_request(critical)
    now = scheduler.info_of(critical).arrival
    planner = UrgentPreemption(max_per_step=4)
    assert [p.victim for p in planner.plan([critical], running, _resources(now=now, step_s=0.006), scheduler.info_of)] == [running[-1]]
    assert planner.plan([critical], running, _resources(now=now, step_s=0.004), scheduler.info_of) == []


def test_an_urgent_request_waits_for_room_only_while_its_own_prompt_step_still_fits_before_its_deadline() -> None:
    """Room frees in 99 steps of 4 ms (396 ms, within the wait share of a 1 s objective). A request whose
    prompt's step is predicted at 0.2 s waits; one whose prompt's step takes 0.7 s would start after its
    deadline less that step (0.3 s), and preempts. The scheduler's predictor is its step-time model's."""
    scheduler, _, running = _running_scheduler([Tier.BATCH] * 4)
    critical = make_request(Tier.CRITICAL, prompt_tokens=40, ttft_ms=1000.0)
    scheduler.add_request(critical)
    now = scheduler.info_of(critical).arrival
    planner = UrgentPreemption(max_per_step=4)
    quick = _resources(now=now, step_s=0.004, prompt_step_s=lambda tokens: 0.2)
    assert planner.plan([critical], running, quick, scheduler.info_of) == []
    slow = _resources(now=now, step_s=0.004, prompt_step_s=lambda tokens: 0.7)
    assert [p.victim for p in planner.plan([critical], running, slow, scheduler.info_of)] == [running[-1]]
    held = scheduler.block_manager.ledger.blocks_held() * vc.block_size(scheduler)
    assert scheduler._prompt_step_s(4)(40) == pytest.approx(scheduler.step_model.predict(44, held, 800))


def test_a_waiting_urgent_request_counts_only_the_blocks_freed_before_its_deadline() -> None:
    """A free slot, no free block; the urgent request needs 4 blocks and the running ones hold 2
    each. With two of them done in 99 steps it waits; with one (the others have 4999 steps left,
    past its deadline) it preempts."""
    for quick, expected_victims in ((2, 0), (1, 2)):  # preempting: two victims of 2 blocks for 4
        scheduler = build_scheduler(max_num_seqs=5)
        driver = Driver(scheduler)
        running = [make_request(Tier.BATCH, max_tokens=100 if i < quick else 5000) for i in range(4)]
        driver.add(*running)
        driver.step()
        urgent = make_request(Tier.CRITICAL, prompt_tokens=64, ttft_ms=1000.0)  # 4 blocks
        scheduler.add_request(urgent)
        room = _resources(free_slots=1, free_blocks=0, now=scheduler.info_of(urgent).arrival, step_s=0.001)
        plan = UrgentPreemption(max_per_step=4).plan([urgent], running, room, scheduler.info_of)
        assert len(plan) == expected_victims, (quick, plan)


def test_thrash_guard_protects_until_progress() -> None:
    scheduler, driver, running = _running_scheduler([Tier.BATCH])
    guard = ThrashGuard(min_progress_tokens=3)
    info = scheduler.info_of(running[0])
    guard.protect(running[0], info)
    assert not guard.may_preempt(running[0], info)
    for _ in range(3):
        driver.step()
    assert guard.may_preempt(running[0], info) and info.preemptions == 1


def test_block_budget_rule() -> None:
    rule = BlockBudgetRule.from_shares(100, 0.1, {"small": 0.2, "whole": 1.0})
    assert rule.headroom_blocks == 10 and rule.tenant_cap_blocks == {"small": 20}
    assert rule.leaves_headroom(0, free_blocks=5, new_blocks=5)  # the critical tier may use the headroom
    assert rule.leaves_headroom(2, free_blocks=15, new_blocks=5)
    assert not rule.leaves_headroom(1, free_blocks=15, new_blocks=6)
    assert rule.leaves_headroom(1, free_blocks=15, new_blocks=6, critical_blocks=1)  # what critical holds is reserve in use
    assert rule.headroom_left(4) == 6 and rule.headroom_left(12) == 0
    assert rule.within_tenant_cap("small", reserved=15, footprint=5)
    assert not rule.within_tenant_cap("small", reserved=15, footprint=6)
    assert rule.within_tenant_cap("small", reserved=0, footprint=50)  # alone, an oversized request still runs
    assert rule.within_tenant_cap("whole", reserved=99, footprint=99)


def _finished_prefixes(scheduler, driver: Driver) -> tuple[set[int], set[int]]:
    """A standard and a batch request with 48-token prompts run to the end; their cached blocks."""
    standard = make_request(Tier.STANDARD, tenant="s", prompt_tokens=48, max_tokens=2, prompt_seed=1)
    batch = make_request(Tier.BATCH, tenant="b", prompt_tokens=48, max_tokens=2, prompt_seed=2)
    driver.add(standard, batch)
    driver.step()
    standard_blocks = {b.block_id for b in vc.request_blocks(scheduler.kv_cache_manager, standard.request_id)[:3]}
    batch_blocks = {b.block_id for b in vc.request_blocks(scheduler.kv_cache_manager, batch.request_id)[:3]}
    driver.run_until_idle()
    return standard_blocks, batch_blocks


def test_batch_tier_prefixes_are_evicted_before_other_tiers_once_eviction_is_near() -> None:
    scheduler = build_scheduler(num_blocks=60)  # a step's worth: 512 / 16 + 4 seqs = 36 blocks
    driver = Driver(scheduler)
    standard_blocks, batch_blocks = _finished_prefixes(scheduler, driver)
    manager = scheduler.block_manager
    assert not manager.eviction_near() and manager.noted_blocks == 3
    # A long prompt takes 20 blocks and caches 19 of them (its decodes fit in the 20th): fewer than a
    # step's worth of free blocks now cache nothing, so the next step moves the batch tier's
    # prefixes to the front.
    driver.add(make_request(Tier.STANDARD, tenant="long", prompt_tokens=312, max_tokens=4, prompt_seed=3))
    driver.step()
    assert manager.eviction_near()
    driver.step()
    order = vc.free_queue_order(scheduler.kv_cache_manager)
    assert set(order[:3]) == batch_blocks and manager.noted_blocks == 0
    assert standard_blocks <= set(order[-4:])
    driver.run_until_idle()


def test_batch_tier_prefixes_stay_cached_while_uncached_blocks_are_free() -> None:
    scheduler = build_scheduler(num_blocks=400)
    driver = Driver(scheduler)
    _finished_prefixes(scheduler, driver)
    for seed in range(10, 30):  # 20 requests, 80 blocks: the free blocks that cache nothing go first
        driver.add(make_request(Tier.STANDARD, tenant="other", prompt_tokens=48, max_tokens=2, prompt_seed=seed))
    driver.run_until_idle()
    hits = scheduler.metrics.prefix_hit_tokens.labels(tier="batch", tenant="b")
    before = hits._value.get()
    driver.add(make_request(Tier.BATCH, tenant="b", prompt_tokens=48, max_tokens=2, prompt_seed=2))
    driver.run_until_idle()
    assert hits._value.get() - before == 32  # both full blocks before the last: nothing was evicted


def test_prefix_reuse_is_counted_per_tenant_and_tier() -> None:
    scheduler = build_scheduler()
    driver = Driver(scheduler)
    driver.add(make_request(Tier.STANDARD, tenant="acme", prompt_tokens=64, max_tokens=2, prompt_seed=7))
    driver.run_until_idle()
    before = scheduler.metrics.prefix_hit_tokens.labels(tier="standard", tenant="acme")._value.get()
    driver.add(make_request(Tier.STANDARD, tenant="acme", prompt_tokens=64, max_tokens=2, prompt_seed=7))
    driver.run_until_idle()
    after = scheduler.metrics.prefix_hit_tokens.labels(tier="standard", tenant="acme")._value.get()
    assert after - before == 48  # three full blocks reused; the last block is always recomputed
