"""Planning on the sidecar's predicted output when the client set no max_tokens (issue 37, item 4)."""

from __future__ import annotations

import math
import random

from slaq.api.common import Tier
from slaq.api.contract import RequestSLA
from slaq.engine import vllm_compat as vc
from slaq.engine.blocks import PlannedOutputLeft, RoomForecast, steps_until_room
from slaq.engine.output_plan import OutputBound, unbounded_by_client
from slaq.engine.standalone import BLOCK_SIZE
from slaq.engine.vllm_compat import offline
from tests.engine.harness import Driver, build_scheduler, make_request


def test_a_request_without_a_client_bound_is_planned_on_its_prediction_raised_to_the_bound() -> None:
    bound = OutputBound()  # prior: twice the prediction
    assert unbounded_by_client(400, 112, 512) and not unbounded_by_client(400, 50, 512)
    assert bound.planned_output(30, 400, 112, 512) == 60  # no max_tokens: 2 x the prediction
    assert bound.planned_output(80, 400, 112, 512) == 112  # never past the request's own bound
    assert bound.planned_output(30, 400, 50, 512) == 50  # the client's max_tokens is a hard bound: planned on it
    assert bound.planned_output(None, 400, 112, 512) == 112  # no prediction (no sidecar): max_tokens


def test_the_bound_learns_the_quantile_of_how_far_predictions_fall_short() -> None:
    bound = OutputBound()
    rng = random.Random(1)
    for _ in range(4000):
        bound.observe(100, round(100 * rng.uniform(0.5, 1.5)))  # actual within +-50 % of the prediction
    assert 1.3 < math.exp(bound.log_ratio) < 1.55  # about the 90th percentile of the ratio (1.4), within a few steps
    assert bound.bound(100) < 150
    bound.observe(0, 10)  # nothing to learn from a prediction of nothing
    assert bound.observations == 4000


def test_room_frees_sooner_on_the_plan_than_on_max_tokens() -> None:
    scheduler = build_scheduler(max_num_seqs=2, max_num_batched_tokens=512, num_blocks=1000, max_model_len=512)
    driver = Driver(scheduler)
    running = make_request(Tier.BATCH, prompt_tokens=32, max_tokens=400)
    driver.add(running)
    driver.step()
    on_max_tokens = steps_until_room([running], BLOCK_SIZE, need_blocks=2, free_blocks=0, free_slots=0)
    on_plan = steps_until_room([running], BLOCK_SIZE, need_blocks=2, free_blocks=0, free_slots=0, output_left=lambda r: 20)
    assert on_max_tokens >= 399 and on_plan == 20


def test_the_forecast_on_the_plan_answers_as_the_plan_asked_one_request_at_a_time() -> None:
    """`RoomForecast` reads the plan for a whole batch at once (before the floor of 1); every answer is
    the one the plan's per-request steps, sorted, give, whether the question is short of blocks or
    of slots alone (answered without the sort)."""
    scheduler = build_scheduler(max_num_seqs=24, max_num_batched_tokens=4096, num_blocks=2000, max_model_len=512)
    driver = Driver(scheduler)
    rng = random.Random(7)
    requests = [make_request(Tier.BATCH, prompt_tokens=rng.randint(8, 120), max_tokens=rng.randint(1, 30)) for _ in range(24)]
    driver.add(*requests)
    for _ in range(6):
        driver.step()
    running = list(vc.running_requests(scheduler))
    info_of = scheduler.info_of
    for request in running[::3]:
        info_of(request).planned_output = vc.output_tokens(request) - rng.randint(0, 2)  # at or past its plan: floored to 1
    plan = PlannedOutputLeft(info_of)
    reference = sorted((plan(r), -(-vc.computed_tokens(r) // BLOCK_SIZE)) for r in running)
    forecast = RoomForecast(running, BLOCK_SIZE, plan)
    for need_blocks, free_blocks, free_slots in [(0, 0, 0), (3, 0, 0), (40, 2, 0), (10, 12, 1), (5, 0, -2), (10**6, 0, 0),
                                                     (0, 0, -2), (3, 50, -1), (0, 5, 0), (2, 10**6, -30)]:  # the last four: short of slots alone
        expected = math.inf
        if free_slots >= 1 and free_blocks >= need_blocks:
            expected = 0
        else:
            slots, blocks = free_slots, free_blocks
            for steps, held in reference:
                slots, blocks = slots + 1, blocks + held
                if slots >= 1 and blocks >= need_blocks:
                    expected = steps
                    break
        assert forecast.steps_until(need_blocks, free_blocks, free_slots) == expected


def _unbounded(predicted: int | None, prompt_tokens: int = 40, max_model_len: int = 512):
    sla = RequestSLA(tenant="t", tier=Tier.STANDARD, ttft_ms=2000.0, predicted_output=predicted)
    return offline.new_request(f"u-{predicted}-{prompt_tokens}", [3 + i % 400 for i in range(prompt_tokens)],
                               max_tokens=max_model_len - prompt_tokens, arrival_time=None, priority=Tier.STANDARD.rank,
                               extra_args=sla.to_xargs(), ignore_eos=True, block_hasher=offline.prefix_block_hasher(BLOCK_SIZE))


def test_the_scheduler_plans_unbounded_requests_on_the_prediction_and_the_variant_does_not() -> None:
    from slaq.bench.engine_variants import MaxTokensSLAScheduler

    scheduler = build_scheduler(max_model_len=512)
    request, no_prediction = _unbounded(25), _unbounded(None)
    bounded = make_request(Tier.STANDARD, prompt_tokens=40, max_tokens=100)  # the client set max_tokens (and 100 is predicted)
    Driver(scheduler).add(request, no_prediction, bounded)
    assert scheduler.info_of(request).planned_output == 50
    assert scheduler.info_of(no_prediction).planned_output == 472 == vc.max_tokens(no_prediction)
    assert scheduler.info_of(bounded).planned_output == 100
    variant = build_scheduler(MaxTokensSLAScheduler, max_model_len=512)
    other = _unbounded(25)
    Driver(variant).add(other)
    assert variant.info_of(other).planned_output == 472
