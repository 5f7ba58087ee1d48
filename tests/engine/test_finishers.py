"""`SoonestFinishers` (engine/src/slaq/engine/finishers.py): the running requests' planned ends kept
across steps answer as the batch read each step does (issue 37, item 5: the scheduler's own cost)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from vllm.v1.request import RequestStatus

from slaq.api.common import Tier
from slaq.engine import vllm_compat as vc
from slaq.engine.blocks import PlannedOutputLeft
from slaq.engine.finishers import SoonestFinishers
from tests.engine.harness import Driver, build_scheduler, make_request


@dataclass
class _Running:
    request_id: str
    num_output_tokens: int
    planned_output: int
    status: RequestStatus = field(default=RequestStatus.RUNNING)


def _finishers() -> SoonestFinishers:
    return SoonestFinishers(PlannedOutputLeft(lambda request: request).unfloored_one)  # the fake request is its own info (planned_output)


def test_a_request_that_falls_behind_its_pace_is_read_where_it_now_ends() -> None:
    finishers = _finishers()
    fast, slow, late = _Running("fast", 0, 10), _Running("slow", 0, 6), _Running("late", 0, 9)
    for request in (fast, slow, late):
        finishers.admitted(request)
    assert [finishers.kth_steps_left(k) for k in (1, 2, 3, 4)] == [6, 9, 10, None]
    for _ in range(5):  # five outputs; `slow` is prefilling or held back in all of them, the others decode
        fast.num_output_tokens += 1
        late.num_output_tokens += 1
        finishers.tick(1)
    # slow: 6 left, fast: 5, late: 4 — slow's stored end (6) is now below its true one (11)
    assert [finishers.kth_steps_left(k) for k in (1, 2, 3)] == [4, 5, 6]
    finishers.released("late")
    assert [finishers.kth_steps_left(k) for k in (1, 2, 3)] == [5, 6, None]


def test_a_request_holding_blocks_outside_the_running_batch_is_passed_over() -> None:
    """A connector that loads KV asynchronously holds a request's blocks before it runs: it frees no slot."""
    finishers = _finishers()
    loading, running = _Running("loading", 0, 2, RequestStatus.WAITING_FOR_REMOTE_KVS), _Running("running", 0, 8)
    finishers.admitted(loading)
    finishers.admitted(running)
    assert [finishers.kth_steps_left(k) for k in (1, 2)] == [8, None]
    loading.status = RequestStatus.RUNNING  # its KV arrived
    assert [finishers.kth_steps_left(k) for k in (1, 2)] == [2, 8]


def test_outputs_of_several_tokens_move_the_clock_by_the_most_any_request_received() -> None:
    finishers = _finishers()
    a, b = _Running("a", 0, 30), _Running("b", 0, 12)
    finishers.admitted(a)
    finishers.admitted(b)
    for _ in range(3):  # speculative decoding: `a` gets 4 tokens an output, `b` 1
        a.num_output_tokens += 4
        b.num_output_tokens += 1
        finishers.tick(4)
    assert finishers.kth_steps_left(1) == 9 and finishers.kth_steps_left(2) == 18  # a: 30 - 12 = 18; b: 12 - 3 = 9
    a.num_output_tokens += 4
    finishers.tick(4)
    assert finishers.kth_steps_left(1) == 9 and finishers.kth_steps_left(2) == 14


def test_a_resumed_request_is_kept_once_and_the_heap_stays_the_size_of_the_batch() -> None:
    finishers = _finishers()
    kept = _Running("kept", 0, 1000)
    finishers.admitted(kept)
    for number in range(5000):  # short requests come and go beside it
        request = _Running(f"r{number}", 0, 3)
        finishers.admitted(request)
        finishers.released(request.request_id)
    preempted = _Running("p", 2, 5)
    finishers.admitted(preempted)
    finishers.released("p")
    finishers.admitted(preempted)  # resumed: one entry counts, the one it runs under now
    assert len(finishers) == 2 and len(finishers._heap) <= 2 * len(finishers) + 65
    assert [finishers.kth_steps_left(k) for k in (1, 2, 3)] == [3, 1000, None]


def test_on_a_driven_scheduler_the_kept_ends_answer_as_the_batch_read_each_step() -> None:
    """Chunked prefills, urgent preemptions, KV-exhaustion preemptions and resumptions, requests
    finishing at random: every step, for every k, the k-th soonest planned end is the batch's own."""
    scheduler = build_scheduler(max_num_seqs=12, max_num_batched_tokens=96, num_blocks=90, max_model_len=512)
    driver = Driver(scheduler)
    rng = random.Random(11)
    plan = PlannedOutputLeft(scheduler.info_of)
    finishers = scheduler.block_manager.finishers
    tiers = (Tier.CRITICAL, Tier.STANDARD, Tier.BATCH, Tier.BATCH)
    chunked = compared = 0
    for step in range(400):
        if step < 300:
            for _ in range(rng.choice((0, 0, 1, 2))):
                max_tokens = rng.choice((rng.randint(1, 12), rng.randint(1, 60), rng.randint(120, 280)))  # ends that cross
                driver.add(make_request(rng.choice(tiers), tenant=f"t{rng.randint(0, 3)}", prompt_tokens=rng.randint(8, 200),
                                        max_tokens=max_tokens))
        driver.step()
        running = vc.running_requests(scheduler)
        chunked += vc.any_prefill_chunk(running)
        reference = sorted(plan.unfloored(running))
        assert len(finishers) == len(running)
        for k in range(1, len(running) + 2):
            assert finishers.kth_steps_left(k) == (reference[k - 1] if k <= len(reference) else None), (step, k)
            compared += 1
    preempted = sum(len(ids) for ids in driver.preempted)
    assert preempted >= 5 and chunked >= 20 and compared > 1000, (preempted, chunked, compared)


def test_on_a_driven_scheduler_a_long_request_near_its_end_is_found_before_short_ones_admitted_after_it() -> None:
    scheduler = build_scheduler(max_num_seqs=8, max_num_batched_tokens=256, num_blocks=400, max_model_len=512)
    driver = Driver(scheduler)
    driver.add(make_request(Tier.BATCH, prompt_tokens=40, max_tokens=200))
    for _ in range(190):
        driver.step()
    driver.add(*(make_request(Tier.STANDARD, prompt_tokens=40, max_tokens=30) for _ in range(3)))
    driver.step()
    reference = sorted(PlannedOutputLeft(scheduler.info_of).unfloored(vc.running_requests(scheduler)))
    assert reference[0] <= 10 and reference[1] >= 29  # the long one ends first, the short ones after it
    assert [scheduler.block_manager.finishers.kth_steps_left(k) for k in (1, 2, 4, 5)] == [reference[0], reference[1], reference[3], None]
