"""Queue order (through slaq.scoring), the release gate and the dispatcher, without sockets."""

from __future__ import annotations

import asyncio

import pytest

from slaq.api.common import Tier
from slaq.api.pool import ScoreWeights
from slaq.scoring import PoolView, RequestView, ScoreProfile
from slaq.sidecar.queue import Dispatcher, QueuedRequest, RequestQueue
from slaq.sidecar.release import ReleaseGate

PROFILE = ScoreProfile(ScoreWeights())
POOL = PoolView(load=0.95, max_length_tokens=8192, aging_bound_s=60.0)


def view(tier: Tier, prompt: int = 100, arrival: float = 0.0, ttft_ms: float | None = None, output: int = 100) -> RequestView:
    return RequestView(tier=tier, arrival=arrival, ttft_ms=ttft_ms, prompt_tokens=prompt, predicted_output=output)


def test_report_scenario_a_before_c_before_b() -> None:
    """Report 4.5 at 95 % load: A (VIP, 1000 tokens, 50 ms) first; B (5000 tokens) after the short C."""
    queue = RequestQueue()
    a, b, c = (QueuedRequest(view(Tier.CRITICAL, 1000, ttft_ms=50.0)), QueuedRequest(view(Tier.STANDARD, 5000, ttft_ms=200.0)),
               QueuedRequest(view(Tier.BATCH, 100)))
    for entry in (b, c, a):
        queue.push(entry)
    order = [queue.pop_best(PROFILE, 0.01, POOL) for _ in range(3)]
    assert order[0] is a
    assert order[-1] is b or order[1] is b  # B's length term is low under load; C's tier is lowest
    assert len(queue) == 0


def test_aging_bound_lets_a_starving_batch_request_overtake_fresh_critical_ones() -> None:
    queue = RequestQueue()
    old = QueuedRequest(view(Tier.BATCH, 5000, arrival=0.0))
    queue.push(old)
    for i in range(5):
        queue.push(QueuedRequest(view(Tier.CRITICAL, 10, arrival=100.0, ttft_ms=50.0)))
    assert queue.pop_best(PROFILE, 100.0, POOL) is old


def test_equal_scores_keep_arrival_order() -> None:
    queue = RequestQueue()
    entries = [QueuedRequest(view(Tier.STANDARD)) for _ in range(5)]
    for e in entries:
        queue.push(e)
    assert [queue.pop_best(PROFILE, 1.0, POOL) for _ in entries] == entries


def test_ahead_of_counts_only_better_ranked_requests() -> None:
    queue = RequestQueue()
    for _ in range(3):
        queue.push(QueuedRequest(view(Tier.BATCH)))
    queue.push(QueuedRequest(view(Tier.CRITICAL, ttft_ms=50.0)))
    assert queue.ahead_of(view(Tier.CRITICAL, ttft_ms=50.0), PROFILE, 0.0, POOL) == 1
    assert queue.ahead_of(view(Tier.BATCH), PROFILE, 0.0, POOL) == 4
    assert queue.depth_by_tier[Tier.BATCH] == 3


def test_gate_keeps_engine_queue_at_target() -> None:
    gate = ReleaseGate(engine_queue_target=2)
    gate.on_release()
    gate.on_release()
    assert not gate.can_release()
    gate.on_first_byte()  # one request started decoding: the engine can take another
    assert gate.can_release()


def test_gate_uses_engine_gauges_to_correct_non_streaming_overcount() -> None:
    gate = ReleaseGate(engine_queue_target=2)
    for _ in range(5):
        gate.on_release()  # non-streaming: no first byte until the end
    assert not gate.can_release()
    gate.observe_engine(3, released_total_at_request=gate.released_total, running=4)  # batch of 4 full, 3 waiting
    assert gate.engine_capacity == 4
    assert not gate.can_release()
    gate.observe_engine(0, released_total_at_request=gate.released_total, running=2)  # two slots free
    assert gate.can_release()
    gate.on_release()
    gate.on_release()
    assert gate.can_release()  # both went into the free slots
    gate.on_release()
    gate.on_release()
    assert not gate.can_release()  # two more wait at the engine: the target


def test_gate_releases_freely_until_the_engine_has_queued_once() -> None:
    gate = ReleaseGate(engine_queue_target=2)
    gate.observe_engine(0, released_total_at_request=0, running=0)
    for _ in range(50):
        assert gate.can_release()
        gate.on_release()


def test_gate_counts_releases_made_while_the_scrape_was_in_flight() -> None:
    gate = ReleaseGate(engine_queue_target=2)
    gate.observe_engine(1, released_total_at_request=0, running=4)
    before = gate.released_total
    gate.on_release()
    gate.on_release()
    gate.observe_engine(1, released_total_at_request=before, running=4)
    assert not gate.can_release()  # 1 waiting + 2 released after the scrape was sent, no free slot


def test_gate_max_in_flight() -> None:
    gate = ReleaseGate(engine_queue_target=100, max_in_flight=1)
    gate.on_release()
    gate.on_first_byte()
    assert not gate.can_release()
    gate.on_finish(started=True)
    assert gate.can_release()


def make_dispatcher(target: int = 1) -> tuple[Dispatcher, list[float]]:
    clock = [10.0]
    dispatcher = Dispatcher(RequestQueue(), ReleaseGate(engine_queue_target=target), PROFILE, lambda: POOL, lambda: clock[0])
    return dispatcher, clock


async def test_dispatcher_fast_path_when_idle() -> None:
    dispatcher, _ = make_dispatcher()
    entry = QueuedRequest(view(Tier.BATCH))
    await dispatcher.wait_turn(entry)
    assert entry.released and len(dispatcher.queue) == 0


async def test_dispatcher_releases_best_ranked_when_a_slot_frees() -> None:
    dispatcher, _ = make_dispatcher()
    first = QueuedRequest(view(Tier.BATCH))
    await dispatcher.wait_turn(first)
    released: list[str] = []

    async def wait(name: str, entry: QueuedRequest) -> None:
        await dispatcher.wait_turn(entry)
        released.append(name)

    batch = asyncio.create_task(wait("batch", QueuedRequest(view(Tier.BATCH, arrival=10.0))))
    await asyncio.sleep(0)
    critical = asyncio.create_task(wait("critical", QueuedRequest(view(Tier.CRITICAL, arrival=10.0, ttft_ms=50.0))))
    await asyncio.sleep(0)
    assert released == [] and len(dispatcher.queue) == 2
    dispatcher.first_byte(first)
    await asyncio.sleep(0)
    assert released == ["critical"]
    assert dispatcher.predicted_wait_s(view(Tier.BATCH)) > 0
    dispatcher.finished(first, started=True)
    await critical
    assert released == ["critical"]  # critical has not started: the gate is still closed
    dispatcher.gate.on_first_byte()
    dispatcher.pump()
    await batch
    assert released == ["critical", "batch"]


async def test_cancelled_waiter_leaves_the_queue() -> None:
    dispatcher, _ = make_dispatcher()
    await dispatcher.wait_turn(QueuedRequest(view(Tier.BATCH)))
    entry = QueuedRequest(view(Tier.CRITICAL, ttft_ms=50.0))
    task = asyncio.create_task(dispatcher.wait_turn(entry))
    await asyncio.sleep(0)
    assert len(dispatcher.queue) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(dispatcher.queue) == 0 and not entry.released


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(Tier)), st.integers(0, 9000), st.floats(0, 50), st.booleans()), min_size=1, max_size=40),
       st.lists(st.integers(0, 39), max_size=10))
def test_snapshot_order_equals_scoring_everything(specs, pops_between) -> None:
    """Pushes interleaved with pops, all at one instant: the snapshot queue pops what a full scan picks."""
    now = 100.0
    queue = RequestQueue(snapshot_ttl_s=10.0)
    reference: list[QueuedRequest] = []
    pop_points = set(pops_between)
    for i, (tier, prompt, age, has_ttft) in enumerate(specs):
        entry = QueuedRequest(view(tier, prompt, arrival=now - age, ttft_ms=500.0 if has_ttft else None))
        queue.push(entry)
        reference.append(entry)
        if i in pop_points:
            expected = min(reference, key=lambda e: (*PROFILE.rank_key(e.view, now, POOL), e.seq))
            assert queue.pop_best(PROFILE, now, POOL) is expected
            reference.remove(expected)
    while reference:
        expected = min(reference, key=lambda e: (*PROFILE.rank_key(e.view, now, POOL), e.seq))
        assert queue.pop_best(PROFILE, now, POOL) is expected
        reference.remove(expected)
