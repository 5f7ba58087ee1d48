"""Queue order (the pod's queue discipline, slaq.policy.discipline), the release gate and the dispatcher, without sockets."""

from __future__ import annotations

import asyncio

import pytest

from slaq.api.common import Tier
from slaq.api.pool import ScoreWeights
from slaq.policy.discipline import Discipline
from slaq.policy.ranking import DeadlineClassRanking
from slaq.policy.views import PoolView, RequestView
from slaq.sidecar.queue import Dispatcher, QueuedRequest, ReleasePace, RequestQueue
from slaq.sidecar.monitor import tier_gauge
from slaq.sidecar.release import ReleaseGate

PROFILE = DeadlineClassRanking(ScoreWeights())
POOL = PoolView(load=0.95, max_length_tokens=8192, aging_bound_s=60.0)
C, S, B = (tier.rank for tier in Tier)


def new_queue() -> RequestQueue:
    return RequestQueue(PROFILE, Discipline())


def view(tier: Tier, prompt: int = 100, arrival: float = 0.0, ttft_ms: float | None = None, output: int = 100) -> RequestView:
    return RequestView(tier=tier, arrival=arrival, ttft_ms=ttft_ms, prompt_tokens=prompt, predicted_output=output)


def test_report_scenario_releases_a_then_b_then_c() -> None:
    """Report 4.5 at 95 % load: the sidecar releases in the pod ranking's order, A (VIP, 1000 tokens,
    50 ms), B (standard, 5000 tokens, attainable), C (free). The report's A-C-B is the engine's
    admission order, where C fits in the KV cache B does not (tests/engine/test_backfill.py)."""
    queue = new_queue()
    a, b, c = (QueuedRequest(view(Tier.CRITICAL, 1000, ttft_ms=50.0)), QueuedRequest(view(Tier.STANDARD, 5000, ttft_ms=200.0)),
               QueuedRequest(view(Tier.BATCH, 100)))
    for entry in (c, b, a):
        queue.push(entry)
    order = [queue.pop_best(0.01, POOL) for _ in range(3)]
    assert order == [a, b, c]
    assert len(queue) == 0


def test_aging_bound_lets_a_starving_batch_request_overtake_fresh_critical_ones() -> None:
    queue = new_queue()
    old = QueuedRequest(view(Tier.BATCH, 5000, arrival=0.0))
    queue.push(old)
    for i in range(5):
        queue.push(QueuedRequest(view(Tier.CRITICAL, 10, arrival=100.0, ttft_ms=50.0)))
    assert queue.pop_best(100.0, POOL) is old


def test_equal_scores_keep_arrival_order() -> None:
    queue = new_queue()
    entries = [QueuedRequest(view(Tier.STANDARD)) for _ in range(5)]
    for e in entries:
        queue.push(e)
    assert [queue.pop_best(1.0, POOL) for _ in entries] == entries


def test_ahead_of_counts_only_better_ranked_requests() -> None:
    queue = new_queue()
    for _ in range(3):
        queue.push(QueuedRequest(view(Tier.BATCH)))
    queue.push(QueuedRequest(view(Tier.CRITICAL, ttft_ms=50.0)))
    queue.begin(0.0, POOL)
    assert queue.ahead_of(view(Tier.CRITICAL, ttft_ms=50.0)) == 1
    assert queue.ahead_of(view(Tier.BATCH)) == 4
    assert queue.depth_by_tier[Tier.BATCH] == 3


def test_gate_keeps_engine_queue_at_target() -> None:
    gate = ReleaseGate(engine_queue_target=2)
    gate.on_release(B)
    gate.on_release(B)
    assert not gate.can_release()
    gate.on_first_byte(B)  # one request started decoding: the engine can take another
    assert gate.can_release()


def test_gate_uses_engine_gauges_to_correct_non_streaming_overcount() -> None:
    gate = ReleaseGate(engine_queue_target=2)
    for _ in range(5):
        gate.on_release(B)  # non-streaming: no first byte until the end
    assert not gate.can_release()
    gate.observe_engine(3, released_total_at_request=gate.released_total, running=4)  # batch of 4 full, 3 waiting
    assert gate.engine_capacity == 4
    assert not gate.can_release()
    gate.observe_engine(0, released_total_at_request=gate.released_total, running=2)  # two slots free
    assert gate.can_release()
    gate.on_release(B)
    gate.on_release(B)
    assert gate.can_release()  # both went into the free slots
    gate.on_release(B)
    gate.on_release(B)
    assert not gate.can_release()  # two more wait at the engine: the target


def test_gate_releases_freely_until_the_engine_has_queued_once() -> None:
    gate = ReleaseGate(engine_queue_target=2)
    gate.observe_engine(0, released_total_at_request=0, running=0)
    for _ in range(50):
        assert gate.can_release()
        gate.on_release(B)


def test_gate_counts_releases_made_while_the_scrape_was_in_flight() -> None:
    gate = ReleaseGate(engine_queue_target=2)
    gate.observe_engine(1, released_total_at_request=0, running=4)
    before = gate.released_total
    gate.on_release(B)
    gate.on_release(B)
    gate.observe_engine(1, released_total_at_request=before, running=4)
    assert not gate.can_release()  # 1 waiting + 2 released after the scrape was sent, no free slot


def test_gate_max_in_flight() -> None:
    gate = ReleaseGate(engine_queue_target=100, max_in_flight=1)
    gate.on_release(B)
    gate.on_first_byte(B)
    assert not gate.can_release()
    gate.on_finish(True, B)
    assert gate.can_release()


def test_gate_counts_only_the_tiers_an_attainable_request_queues_behind() -> None:
    gate = ReleaseGate(engine_queue_target=2)
    gate.on_release(B)
    gate.on_release(B)
    assert not gate.can_release()  # any request queues behind the two batch requests...
    assert gate.can_release(S) and gate.can_release(C)  # ...but the engine serves standard and critical first
    gate.on_release(S)
    gate.on_release(S)
    assert not gate.can_release(S) and gate.can_release(C)
    gate.observe_engine(1, released_total_at_request=gate.released_total, running=4)
    assert gate.engine_queue_estimate() == gate.engine_queue_estimate(S) == 1  # the engine's gauge bounds every count
    assert gate.can_release() and gate.engine_queue_estimate(C) == 0


def test_with_the_engine_waiting_by_tier_a_standard_request_is_not_held_by_batch_waiting_in_the_engine() -> None:
    """The engine waits on four batch requests while the standard ones it holds run their prefill
    (released, no first byte yet): the total would hold standard here and let the engine admit the
    batch; the per-tier gauge says no standard request waits there."""
    gate = ReleaseGate(engine_queue_target=2)
    for _ in range(4):
        gate.on_release(S)
    for _ in range(4):
        gate.on_release(B)
    gate.observe_engine(4, released_total_at_request=gate.released_total, running=8)
    assert not gate.can_release(S)  # the total stands in for every tier
    gate.observe_engine(4, released_total_at_request=gate.released_total, running=8, waiting_by_rank=[0, 0, 4],
                        released_by_rank_at_request=gate.released_by_rank)
    assert gate.engine_queue_estimate(S) == 0 and gate.can_release(S) and not gate.can_release()
    before = list(gate.released_by_rank)
    gate.on_release(S)
    gate.on_release(S)  # after the scrape was sent: the answer may miss them, so they count
    gate.observe_engine(4, released_total_at_request=gate.released_total - 2, running=8, waiting_by_rank=[0, 0, 4],
                        released_by_rank_at_request=before)
    assert gate.engine_queue_estimate(S) == 2 and not gate.can_release(S)


def test_the_monitor_reads_the_engines_waiting_requests_by_tier() -> None:
    text = ('# TYPE slaq_engine_queue_depth gauge\n'
            'slaq_engine_queue_depth{tier="critical"} 1.0\n'
            'slaq_engine_queue_depth{engine="0",tier="batch"} 7.0\n'
            'slaq_engine_queue_depth{tier="standard"} 2.0\n'
            'slaq_engine_queue_depth{tier="vip"} 9.0\n'
            'slaq_engine_queue_depth_created{tier="batch"} 1.7e9\n')
    assert tier_gauge(text, "slaq_engine_queue_depth") == [1, 2, 7]
    assert tier_gauge("vllm:num_requests_waiting 3.0\n", "slaq_engine_queue_depth") is None  # stock vLLM: the total stands in


def make_dispatcher(target: int = 1) -> tuple[Dispatcher, list[float]]:
    clock = [10.0]
    dispatcher = Dispatcher(new_queue(), ReleaseGate(engine_queue_target=target), lambda: POOL, lambda: clock[0])
    return dispatcher, clock


async def test_dispatcher_fast_path_when_idle() -> None:
    dispatcher, _ = make_dispatcher()
    entry = QueuedRequest(view(Tier.BATCH))
    await dispatcher.wait_turn(entry)
    assert entry.released and len(dispatcher.queue) == 0


async def test_dispatcher_releases_best_ranked_when_a_slot_frees() -> None:
    dispatcher, _ = make_dispatcher()
    first = QueuedRequest(view(Tier.CRITICAL, arrival=10.0, ttft_ms=500.0))
    await dispatcher.wait_turn(first)  # not started: every tier now queues behind it at the engine
    released: list[str] = []

    async def wait(name: str, entry: QueuedRequest) -> None:
        await dispatcher.wait_turn(entry)
        released.append(name)

    batch = asyncio.create_task(wait("batch", QueuedRequest(view(Tier.BATCH, arrival=10.0))))
    await asyncio.sleep(0)
    standard = asyncio.create_task(wait("standard", QueuedRequest(view(Tier.STANDARD, arrival=10.0, ttft_ms=2000.0))))
    await asyncio.sleep(0)
    assert released == [] and len(dispatcher.queue) == 2
    dispatcher.first_byte(first)
    await asyncio.sleep(0)
    assert released == ["standard"]
    assert dispatcher.predicted_wait_s(view(Tier.BATCH)) > 0
    dispatcher.finished(first, started=True)
    await standard
    assert released == ["standard"]  # standard has not started: the gate is still closed for batch
    dispatcher.gate.on_first_byte(S)
    dispatcher.pump()
    await batch
    assert released == ["standard", "batch"]


async def test_an_attainable_request_is_not_held_behind_lower_tier_work_at_the_engine() -> None:
    dispatcher, _ = make_dispatcher()
    await dispatcher.wait_turn(QueuedRequest(view(Tier.BATCH, arrival=10.0)))  # the engine queue is at its target
    queued_batch = QueuedRequest(view(Tier.BATCH, arrival=10.0))
    batch_task = asyncio.create_task(dispatcher.wait_turn(queued_batch))
    await asyncio.sleep(0)
    assert not queued_batch.released
    vip = QueuedRequest(view(Tier.CRITICAL, arrival=10.0, ttft_ms=500.0))
    await dispatcher.wait_turn(vip)  # the engine will run it ahead of (or preempt) the batch work
    assert vip.released and not queued_batch.released
    batch_task.cancel()


async def test_a_held_starving_head_does_not_hold_back_an_attainable_higher_tier_request() -> None:
    """The discipline chooses the starving batch head (no starving share taken yet); the gate holds
    it (it queues behind every tier at the engine) but lets the attainable standard request go on
    its own tier's count: the engine would admit it first anyway, so it goes, and the batch head
    stays first in line."""
    clock = [100.0]
    pool = PoolView(load=1.0, max_length_tokens=8192, aging_bound_s=60.0)
    dispatcher = Dispatcher(new_queue(), ReleaseGate(engine_queue_target=1), lambda: pool, lambda: clock[0])
    await dispatcher.wait_turn(QueuedRequest(view(Tier.STANDARD, arrival=100.0, ttft_ms=2000.0)))
    starving = QueuedRequest(view(Tier.BATCH, arrival=0.0))  # past the aging bound: chosen first, counts every tier
    standard = QueuedRequest(view(Tier.STANDARD, arrival=100.0, ttft_ms=2000.0))
    tasks = [asyncio.create_task(dispatcher.wait_turn(e)) for e in (starving, standard)]
    await asyncio.sleep(0)
    dispatcher.gate.not_started_by_rank[S] = 0  # standard may go on its own count...
    dispatcher.gate.not_started_by_rank[B] = 1  # ...while the starving head may not
    assert dispatcher.pump() == 1
    assert standard.released and not starving.released
    dispatcher.gate.not_started_by_rank[S] = dispatcher.gate.not_started_by_rank[B] = 0  # the engine started them
    assert dispatcher.pump() == 1 and starving.released
    for task in tasks:
        task.cancel()


async def test_a_lower_tier_never_overtakes_a_held_request() -> None:
    """A missed standard request (it counts every tier at the engine, like batch) is held: the batch
    request behind it does not go either, though it is fresher."""
    clock = [100.0]
    dispatcher = Dispatcher(new_queue(), ReleaseGate(engine_queue_target=1), lambda: POOL, lambda: clock[0])
    await dispatcher.wait_turn(QueuedRequest(view(Tier.BATCH, arrival=100.0)))  # the engine queue is at its target
    missed = QueuedRequest(view(Tier.STANDARD, arrival=95.0, ttft_ms=2000.0))
    batch = QueuedRequest(view(Tier.BATCH, arrival=99.0))
    tasks = [asyncio.create_task(dispatcher.wait_turn(e)) for e in (missed, batch)]
    await asyncio.sleep(0)
    assert dispatcher.pump() == 0 and not missed.released and not batch.released
    for task in tasks:
        task.cancel()


async def test_cancelled_waiter_leaves_the_queue() -> None:
    dispatcher, _ = make_dispatcher()
    await dispatcher.wait_turn(QueuedRequest(view(Tier.BATCH)))
    entry = QueuedRequest(view(Tier.BATCH))
    task = asyncio.create_task(dispatcher.wait_turn(entry))
    await asyncio.sleep(0)
    assert len(dispatcher.queue) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(dispatcher.queue) == 0 and not entry.released


def test_a_request_that_would_go_straight_through_is_predicted_no_wait_despite_lower_work_queued() -> None:
    dispatcher, _ = make_dispatcher(target=1)
    assert dispatcher.offer(QueuedRequest(view(Tier.BATCH, arrival=10.0)))  # at the engine, not started
    dispatcher.enqueue(QueuedRequest(view(Tier.BATCH, arrival=10.0)))  # held: the gate is closed for batch
    critical = view(Tier.CRITICAL, arrival=10.0, ttft_ms=500.0)
    # Nothing queued outranks the critical request and the gate lets it pass the batch work at the
    # engine: no wait, so the pod guard does not refuse it as unreachable.
    assert dispatcher.predicted_wait_s(critical) == 0.0
    assert dispatcher.predicted_wait_s(view(Tier.BATCH, arrival=10.0)) > 0.0
    assert dispatcher.offer(QueuedRequest(critical))


def test_the_release_pace_counts_a_release_round_as_the_releases_it_made() -> None:
    """Ten requests released at one instant every second drain ten a second, not one every 0 s."""
    pace = ReleasePace()
    for second in range(60):
        for _ in range(10):
            pace.released(float(second), queue_was_waiting=True)
    assert 0.08 <= pace.interval_s <= 0.12
    one_a_second = ReleasePace()
    for second in range(60):
        one_a_second.released(float(second), queue_was_waiting=True)
    assert 0.9 <= one_a_second.interval_s <= 1.1


async def test_a_lowest_tier_request_whose_deadline_passes_in_the_queue_is_shed_with_retry_after() -> None:
    """Held behind a full engine queue until its 60 s objective has passed, a batch request is
    refused (503 ttft_unreachable with a Retry-After), not released to miss; a missed standard
    request (a protected tier) stays and is served late."""
    from slaq.sidecar.errors import DeadlineUnreachable

    dispatcher, clock = make_dispatcher(target=1)
    assert dispatcher.offer(QueuedRequest(view(Tier.STANDARD, arrival=10.0, ttft_ms=2000.0)))  # the engine queue is at its target
    batch = QueuedRequest(view(Tier.BATCH, arrival=10.0, ttft_ms=60_000.0))
    standard = QueuedRequest(view(Tier.STANDARD, arrival=10.0, ttft_ms=2000.0))
    shed: list[tuple[QueuedRequest, Exception]] = []
    dispatcher.on_shed = lambda entry, error: shed.append((entry, error))
    tasks = [asyncio.create_task(dispatcher.wait_turn(e)) for e in (batch, standard)]
    await asyncio.sleep(0)
    clock[0] = 69.0
    dispatcher.pump()
    assert shed == [] and len(dispatcher.queue) == 2  # 59 s waited: still in time
    clock[0] = 70.5
    dispatcher.pump()
    assert [entry for entry, _ in shed] == [batch] and not batch.released
    error = shed[0][1]
    assert isinstance(error, DeadlineUnreachable) and error.retry_after_s is not None and error.retry_after_s >= 1.0
    with pytest.raises(DeadlineUnreachable):
        await tasks[0]
    assert len(dispatcher.queue) == 1 and standard.queued  # the missed standard request waits on
    tasks[1].cancel()



# the handover: lower tiers' bound on the pipe to the engine (release.py, issue 39) -------------

def test_the_handover_bound_holds_batch_at_4_in_the_pipe_and_never_a_protected_tier() -> None:
    gate = ReleaseGate(engine_queue_target=100, handover_target=4)
    assert (gate.handover_bound(C), gate.handover_bound(S), gate.handover_bound(B)) == (None, None, 4)
    for _ in range(4):
        assert gate.handover_open(B)
        gate.on_release(B)
    assert not gate.handover_open(B) and gate.can_release()  # the engine-queue rule alone would let it go
    for _ in range(20):
        assert gate.handover_open(S) and gate.handover_open(C)  # batch in the pipe never holds a protected tier
        gate.on_release(S)
        gate.on_release(C)
    assert gate.pipe_estimate(B) == 4 and not gate.handover_open(B)  # counted on its own: the others do not move it
    gate.on_first_byte(B)  # one batch request reached the engine's scheduler and started
    assert gate.handover_open(B)


def test_without_a_handover_target_lower_tiers_fill_the_pipe_up_to_the_engine_queue_target() -> None:
    """The negative control: the engine-queue rule alone lets 16 batch requests into the pipe."""
    gate = ReleaseGate(engine_queue_target=16, handover_target=None)
    for _ in range(16):
        assert gate.can_release() and gate.handover_open(B)
        gate.on_release(B)
    assert not gate.can_release() and gate.pipe_estimate(B) == 16


def test_the_handover_bound_trusts_the_engines_gauges_for_non_streaming_requests() -> None:
    """Non-streaming batch requests have no first byte until they end: running, they would hold the
    bound shut forever; the engine's gauges say none of them waits."""
    gate = ReleaseGate(engine_queue_target=16, handover_target=4)
    for _ in range(6):
        gate.on_release(B)
    assert not gate.handover_open(B)
    gate.observe_engine(0, released_total_at_request=gate.released_total, running=6, waiting_by_rank=[0, 0, 0],
                        released_by_rank_at_request=gate.released_by_rank)
    assert gate.pipe_estimate(B) == 0 and gate.handover_open(B)


def test_a_handover_target_below_1_is_refused() -> None:
    with pytest.raises(ValueError, match="handover_target"):
        ReleaseGate(handover_target=0)


async def test_a_vip_released_behind_a_batch_flood_finds_at_most_the_bound_ahead() -> None:
    """Twenty batch requests arrive, then a VIP: with the bound, 4 of them are in the pipe when the
    VIP is released (it goes at once); without it, 16 (the engine-queue target)."""
    ahead = {}
    for target in (4, None):
        clock = [10.0]
        dispatcher = Dispatcher(new_queue(), ReleaseGate(engine_queue_target=16, handover_target=target), lambda: POOL, lambda: clock[0])
        batch = [QueuedRequest(view(Tier.BATCH, arrival=10.0)) for _ in range(20)]
        tasks = [asyncio.create_task(dispatcher.wait_turn(entry)) for entry in batch]
        await asyncio.sleep(0)
        vip = QueuedRequest(view(Tier.CRITICAL, arrival=10.0, ttft_ms=500.0))
        await dispatcher.wait_turn(vip)
        assert vip.released
        ahead[target] = vip.pipe_ahead
        assert sum(entry.released for entry in batch) == (4 if target else 16)
        for task in tasks:
            task.cancel()
    assert ahead == {4: 4, None: 16}
