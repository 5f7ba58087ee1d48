"""Objective-driven step budget (issue 9): TPOT-shaped budget, online calibration, urgent admission."""

from __future__ import annotations

import math
import time

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from slaq.api.common import Tier
from slaq.api.pool import SchedulerSpec
from slaq.engine.config import EngineSchedulerConfig
from slaq.engine.scheduler import SLAScheduler
from slaq.engine.step_budget import BatchView, StockStepBudget
from slaq.engine.tpot_budget import CREDIT_SHARE, CREDIT_TPOTS, MIN_PREFILL_TOKENS, PACE_SHARE, SAFETY, StepTimeModel, TpotStepBudget
from slaq.engine.vllm_compat import Request
from slaq.engine.vllm_compat import running_requests as vc_running
from slaq.engine.vllm_compat import step_token_budget as vc_step_budget

from tests.engine.harness import Driver, build_scheduler, make_request

MAX_HOLD_BACK_STEPS = SchedulerSpec().step.max_hold_back_steps


def test_step_time_model_learns_the_hardware_from_measured_steps() -> None:
    model = StepTimeModel()  # prior: 10 ms + 30 µs/token
    for step in range(200):
        tokens = 64 + (step * 997) % 8000
        model.observe(tokens, 0.004 + 12e-6 * tokens)
    assert model.fixed_s == pytest.approx(0.004, rel=0.05)
    assert model.per_token_s == pytest.approx(12e-6, rel=0.02)


def test_step_time_model_separates_the_kv_read_from_the_token_cost() -> None:
    model = StepTimeModel()
    for step in range(300):
        tokens = 256 + (step * 997) % 4000
        kv = 50_000 + (step * 7919) % 900_000
        model.observe(tokens, 0.002 + 28e-6 * tokens + 34e-9 * kv, kv)
    assert model.per_token_s == pytest.approx(28e-6, rel=0.02)
    assert model.per_kv_token_s == pytest.approx(34e-9, rel=0.05)
    assert model.fixed_s == pytest.approx(0.002, abs=0.0005)


def test_step_time_model_stays_put_when_steps_stop_varying() -> None:
    # Thousands of identical decode-only steps excite one direction only; recursive least squares
    # with forgetting used to wind up and diverge here (per-token cost ~1e76 on the bursty slice).
    model = StepTimeModel()
    for step in range(200):
        tokens = 64 + (step * 997) % 8000
        model.observe(tokens, 0.004 + 12e-6 * tokens)
    for _ in range(5000):
        model.observe(6, 0.0061)
    assert model.predict(6) == pytest.approx(0.0061, rel=0.02)
    assert 0.0 < model.per_token_s < 100e-6 and model.fixed_s < 0.01
    assert model.predict(2000) < 0.2  # extrapolation stays physical


def test_step_time_model_remembers_a_prompt_step_through_a_decode_only_stretch() -> None:
    # A long prompt's step (tokens and their attention pairs) is learned, then only decodes run for
    # minutes: the forgotten sums must not hand the prompt's cost back to the initial guess, or the
    # horizon kept for the tightest TTFT class opens up just before its next prompt (decision 0031).
    def truth(tokens: int, kv: int, pairs: int) -> float:
        return 0.012 + 45e-6 * tokens + 20e-9 * kv + 8e-9 * pairs

    model = StepTimeModel()
    for step in range(300):
        decodes, prompt = 20 + step % 30, (step * 997) % 4000
        kv = 200_000 + (step * 7919) % 300_000
        pairs = prompt * prompt // 2
        model.observe(decodes + prompt, truth(decodes + prompt, kv, pairs), kv, pairs)
    learned = model.prompt_step_s(4000, 40, 300_000)
    assert learned == pytest.approx(truth(4040, 300_000, 8_000_000), rel=0.05)
    for step in range(3000):
        decodes = 40 + step % 3
        kv = 300_000 + 40 * (step % 500)
        model.observe(decodes, truth(decodes, kv, 0), kv)
    assert model.prompt_step_s(4000, 40, 300_000) == pytest.approx(learned, rel=0.05)
    assert model.predict(41, 310_000) == pytest.approx(truth(41, 310_000, 0), rel=0.02)


def test_budget_is_shaped_only_while_a_tpot_objective_runs() -> None:
    policy = TpotStepBudget(StepTimeModel(fixed_s=0.01, per_token_s=20e-6))
    assert policy.budget(BatchView(None, 200), 8192, 0.0) is None  # full budget: throughput unharmed
    expected = int((SAFETY * 0.05 - 0.01) / 20e-6)
    assert policy.budget(BatchView(0.05, 10), 8192, 0.0) == expected
    assert policy.budget(BatchView(1.0, 10), 8192, 0.0) == 8192  # a loose objective never raises the limit
    # floor: every running request keeps its token and admission still progresses
    assert policy.budget(BatchView(0.011, 300), 8192, 0.0) == 300 + MIN_PREFILL_TOKENS
    # KV the batch holds is read every step: it shrinks the room left for new tokens
    with_kv = TpotStepBudget(StepTimeModel(fixed_s=0.01, per_token_s=20e-6, per_kv_token_s=30e-9))
    assert with_kv.budget(BatchView(0.05, 10, 500_000), 8192, 0.0) == int((SAFETY * 0.05 - 0.01 - 0.015) / 20e-6)
    assert StockStepBudget().budget(BatchView(0.05, 10), 8192, 0.0) is None


def test_tight_tpot_running_caps_every_step_and_decodes_keep_their_token(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    scheduler = build_scheduler(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048)
    scheduler.step_budget.model = StepTimeModel(fixed_s=0.005, per_token_s=50e-6)
    driver = Driver(scheduler)
    critical = [make_request(Tier.CRITICAL, tpot_ms=20.0, max_tokens=60) for _ in range(3)]
    driver.add(*critical)
    driver.step()
    long_batch = make_request(Tier.BATCH, prompt_tokens=1800, max_tokens=4)
    driver.add(long_batch)
    caps = []
    for _ in range(10):
        output = driver.step()
        caps.append(scheduler.step_budget.last_budget)
        assert output.total_num_scheduled_tokens <= scheduler.step_budget.last_budget
        for request in critical:
            assert output.num_scheduled_tokens.get(request.request_id) == 1  # every decode, every step
    assert max(caps) < 2048  # shaped below vLLM's budget while the 20 ms objective runs
    driver.run_until_idle()
    assert long_batch.request_id in driver.finished
    assert scheduler.step_budget.last_budget is None  # nothing with a TPOT objective runs any more


def test_step_durations_calibrate_the_budget_online(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    scheduler = build_scheduler(max_num_seqs=16, max_num_batched_tokens=1024, max_model_len=2048)
    driver = Driver(scheduler)
    for index in range(60):
        if index % 2 == 0:
            driver.add(make_request(Tier.STANDARD, prompt_tokens=40 + 37 * (index % 13), max_tokens=6))
        output = scheduler.schedule()
        clock[0] += 0.002 + 40e-6 * output.total_num_scheduled_tokens  # the "hardware"
        driver.answer(output)
    model = scheduler.step_budget.model
    assert model.per_token_s == pytest.approx(40e-6, rel=0.1) and model.fixed_s == pytest.approx(0.002, abs=0.001)


def _long_batch_prefill_in_flight(scheduler_cls: type):
    scheduler = build_scheduler(scheduler_cls, max_num_seqs=4, max_num_batched_tokens=256, max_model_len=2048)
    driver = Driver(scheduler)
    batch = make_request(Tier.BATCH, prompt_tokens=1800, max_tokens=4)
    driver.add(batch)
    driver.step()
    assert batch.is_prefill_chunk
    return scheduler, driver, batch


def test_urgent_arrival_takes_the_budget_from_a_lower_tier_prefill() -> None:
    scheduler, driver, batch = _long_batch_prefill_in_flight(type(build_scheduler()))
    critical = make_request(Tier.CRITICAL, prompt_tokens=200, max_tokens=4)
    driver.add(critical)
    output = driver.step()
    assert output.num_scheduled_tokens.get(critical.request_id) == 200  # whole prompt in the next step
    assert batch.request_id not in output.num_scheduled_tokens
    driver.run_until_idle()
    assert {batch.request_id, critical.request_id} <= driver.finished


def test_stock_scheduler_makes_the_urgent_arrival_queue_behind_prefill_chunks() -> None:
    scheduler, driver, batch = _long_batch_prefill_in_flight(AsyncScheduler)
    critical = make_request(Tier.CRITICAL, prompt_tokens=200, max_tokens=4)
    driver.add(critical)
    output = driver.step()
    assert critical.request_id not in output.num_scheduled_tokens
    assert output.num_scheduled_tokens[batch.request_id] == 256


def test_a_held_back_prefill_still_progresses_under_a_critical_flood() -> None:
    scheduler, driver, batch = _long_batch_prefill_in_flight(type(build_scheduler()))
    progressed = 0
    for _ in range(4 * (MAX_HOLD_BACK_STEPS + 1)):
        driver.add(make_request(Tier.CRITICAL, prompt_tokens=16, max_tokens=1))
        output = driver.step()
        progressed += batch.request_id in output.num_scheduled_tokens
    assert progressed >= 3


def test_budget_shaping_can_be_switched_off() -> None:
    scheduler = build_scheduler(config=EngineSchedulerConfig(spec=SchedulerSpec(tpot_budget_shaping=False)))
    assert isinstance(scheduler.step_budget, StockStepBudget)


def test_nothing_sits_out_when_the_budget_holds_both() -> None:
    scheduler = build_scheduler(max_num_seqs=4, max_num_batched_tokens=2048, max_model_len=2048)
    driver = Driver(scheduler)
    batch = make_request(Tier.BATCH, prompt_tokens=1800, max_tokens=4)
    driver.add(batch)
    with vc_step_budget(scheduler, 1000):
        driver.step()
    assert batch.is_prefill_chunk  # 800 prompt tokens left
    critical = make_request(Tier.CRITICAL, prompt_tokens=200, max_tokens=4)
    driver.add(critical)
    output = driver.step()
    assert output.num_scheduled_tokens[batch.request_id] == 800 and output.num_scheduled_tokens[critical.request_id] == 200


def test_a_degenerate_fit_never_turns_into_an_infinite_budget() -> None:
    model = StepTimeModel()
    fixed, per_token = model.fixed_s, model.per_token_s
    model.observe(10, float("inf"))  # a broken clock reading must not poison the fit
    model.observe(10, float("nan"))
    assert (model.fixed_s, model.per_token_s) == (fixed, per_token)
    model.observe(100, 0.01)
    assert math.isfinite(model.fixed_s) and math.isfinite(model.per_token_s) and model.observations == 1
    policy = TpotStepBudget(model=StepTimeModel(fixed_s=0.0, per_token_s=float("nan")))
    assert policy.budget(BatchView(0.05, 10), 8192, 0.0) == 8192
    policy = TpotStepBudget(model=StepTimeModel(fixed_s=float("inf")))
    assert policy.budget(BatchView(0.05, 10), 8192, 0.0) == 10 + MIN_PREFILL_TOKENS


def test_budget_spends_pace_slack_and_falls_back_when_behind() -> None:
    model = StepTimeModel(fixed_s=0.01, per_token_s=20e-6)
    policy = TpotStepBudget(model)
    floor = policy.budget(BatchView(0.05, 10), 8192, 0.0)  # no pace known: safety x T
    assert floor == int((SAFETY * 0.05 - 0.01) / 20e-6)
    # Ahead of pace by a lot: up to MAX_STEP_TPOTS x T, never more without an urgent prompt.
    ahead = policy.budget(BatchView(0.05, 10, 0, pace_slack_s=1.0, steps_in_flight=0), 8192, 0.0)
    assert ahead == int((2.0 * 0.05 - 0.01) / 20e-6) > floor
    # At pace (one TPOT left after the in-flight step and the margin): a step of about T.
    policy.last_target_s = 0.05
    at_pace = policy.budget(BatchView(0.05, 10, 0, pace_slack_s=0.1 + (1 - SAFETY) * 0.05, steps_in_flight=1), 8192, 0.0)
    assert at_pace == pytest.approx((0.05 - 0.01) / 20e-6, abs=2)
    # Behind pace: back to safety x T, which catches the request up.
    assert policy.budget(BatchView(0.05, 10, 0, pace_slack_s=0.01, steps_in_flight=1), 8192, 0.0) == floor
    # Urgent prefill planning: the step may stretch to the full slack to fit the urgent prompt.
    urgent = policy.budget(BatchView(0.05, 10, 0, pace_slack_s=1.0, steps_in_flight=0, urgent_tokens=6000), 8192, 0.0)
    assert urgent == 6010


# -- the tightest TTFT class: the horizon and the reserve -------------------------------------------------
# A model without KV or pair terms: a step of n tokens takes 10 ms + 20 us x n. A class whose prompts are
# 15,000 tokens and whose objective is 0.5 s: its own step (10 running + 15,000) is predicted 0.3102 s.
TIGHT = dict(tight_ttft_s=0.5, tight_prompt_tokens=15_000)
OWN_S = 0.01 + 15_010 * 20e-6
HORIZON_S = (SAFETY * 0.5 - OWN_S) / 2


def _tokens_in(seconds: float) -> int:
    return int((seconds - 0.01) / 20e-6)


def test_the_horizon_caps_steps_for_other_work_and_a_tight_prompt_gets_its_whole_step() -> None:
    """No TPOT objective runs: vLLM's budget, unless a tight TTFT class is served; then every step is
    short enough that an arrival of the class, waiting for the running step and the one planned,
    still has its own step before safety x its objective. One of the class gets its whole prompt."""
    policy = TpotStepBudget(StepTimeModel(fixed_s=0.01, per_token_s=20e-6))
    assert policy.budget(BatchView(None, 10), 32_768, 0.0) is None  # no class: vLLM's budget
    assert policy.horizon_s(BatchView(None, 10, **TIGHT)) == pytest.approx(HORIZON_S)
    assert policy.budget(BatchView(None, 10, **TIGHT), 32_768, 0.0) == _tokens_in(HORIZON_S)
    waiting = BatchView(None, 10, urgent_tokens=15_000, urgent_tight=True, **TIGHT)
    # The decodes, its whole prompt, and the prompt tokens any shaped step carries (a short prompt beside it).
    assert policy.budget(waiting, 32_768, 0.0) == 15_010 + MIN_PREFILL_TOKENS
    other = BatchView(None, 10, urgent_tokens=15_000, urgent_tight=False, **TIGHT)
    assert policy.budget(other, 32_768, 0.0) == _tokens_in(HORIZON_S)  # another tier's prompt: chunked to the horizon
    # A class whose own step exceeds safety x its objective gets no horizon: holding others back would not save it.
    assert policy.budget(BatchView(None, 10, tight_ttft_s=0.3, tight_prompt_tokens=15_000), 32_768, 0.0) is None
    # A horizon wider than vLLM's budget leaves it alone.
    assert policy.budget(BatchView(None, 10, **TIGHT), 1_024, 0.0) is None


def test_steps_for_other_work_leave_the_reserve_a_tight_prompt_spends() -> None:
    """A TPOT objective runs (50 ms). Without a tight class a request 0.2 s ahead of its pace lets a
    step run to MAX_STEP_TPOTS x T; with one, steps for other work leave the reserve (its own step
    less T) unspent and plan floor steps, which bank it. The class's prompt spends the whole slack;
    another tier's urgent prompt gets what the reserve leaves, never past the horizon."""
    policy = TpotStepBudget(StepTimeModel(fixed_s=0.01, per_token_s=20e-6))
    floor = SAFETY * 0.05
    ahead_s = 0.2 - (1 - SAFETY) * 0.05
    assert policy.target_s(BatchView(0.05, 10, 0, pace_slack_s=0.2)) == (pytest.approx(0.1), pytest.approx(ahead_s))
    assert policy.target_s(BatchView(0.05, 10, 0, pace_slack_s=0.2, **TIGHT)) == (pytest.approx(floor), pytest.approx(floor))
    tight = BatchView(0.05, 10, 0, pace_slack_s=0.2, urgent_tokens=15_000, urgent_tight=True, **TIGHT)
    assert policy.budget(tight, 32_768, 0.0) == _tokens_in(ahead_s)  # as far as the slack goes
    other = BatchView(0.05, 10, 0, pace_slack_s=0.2, urgent_tokens=15_000, **TIGHT)
    assert policy.budget(other, 32_768, 0.0) == _tokens_in(floor)
    # Far ahead of pace: steps for other work stop at the horizon; the class's prompt gets all of it.
    assert policy.budget(BatchView(0.05, 10, 0, pace_slack_s=1.0, **TIGHT), 32_768, 0.0) == _tokens_in(HORIZON_S)
    tight_far = BatchView(0.05, 10, 0, pace_slack_s=1.0, urgent_tokens=15_000, urgent_tight=True, **TIGHT)
    assert policy.budget(tight_far, 32_768, 0.0) == 15_010 + MIN_PREFILL_TOKENS


def test_the_engine_tells_the_budget_its_tightest_class_and_keeps_a_tight_prompt_urgent_while_it_prefills() -> None:
    """After a critical arrival (0.5 s objective) the batch view names the class and its prompt; the
    request is the urgent one, and stays so while its prompt is prefilled in chunks (out of the
    waiting queue, running), until its last chunk."""
    scheduler = build_scheduler(max_num_seqs=4, max_num_batched_tokens=2048, max_model_len=2048)
    driver = Driver(scheduler)
    driver.add(make_request(Tier.BATCH, prompt_tokens=64, max_tokens=200))
    driver.step()
    critical = make_request(Tier.CRITICAL, prompt_tokens=1800, max_tokens=4, ttft_ms=500.0)
    driver.add(critical)
    view = scheduler._batch_view(None, 0, time.time())
    assert (view.tight_ttft_s, view.tight_prompt_tokens, view.urgent_tokens, view.urgent_tight) == (0.5, 1800, 1800, True)
    assert view.urgent_slack_s is not None and 0.0 < view.urgent_slack_s <= 0.5  # to its TTFT deadline
    with vc_step_budget(scheduler, 1000):
        driver.step()
    assert critical.is_prefill_chunk and not len(scheduler.waiting_queue)
    view = scheduler._batch_view(None, 0, time.time())
    assert view.urgent_tight and view.urgent_tokens == 1800 - (1000 - 1)  # the batch decode took one token of the step
    driver.step()
    driver.step()
    view = scheduler._batch_view(None, 0, time.time())
    assert not view.urgent_tight and view.urgent_tokens == 0 and view.urgent_slack_s is None


def test_a_tight_prompt_may_also_spend_the_decoders_credit_and_nothing_else_does() -> None:
    """The decoders' credit (decision 0028) stretches only a step that then carries the class's whole
    prompt, when its chunks would miss its deadline: not a chunk of it, not steps for other work, not
    another tier's urgent prompt."""
    policy = TpotStepBudget(StepTimeModel(fixed_s=0.01, per_token_s=20e-6))
    floor = SAFETY * 0.05
    ahead_s = 0.2 - (1 - SAFETY) * 0.05  # 0.1925 s of slack: 9,124 tokens, short of the decodes and the prompt's 15,010
    whole = 15_010 + MIN_PREFILL_TOKENS
    # Its chunks of 9,114 tokens take two steps of 0.1925 s: 0.385 s, past 0.85 x the 0.4 s it has left.
    late = dict(pace_slack_s=0.2, urgent_tokens=15_000, urgent_tight=True, urgent_slack_s=0.4, **TIGHT)
    for credit, budget in ((0.1, _tokens_in(ahead_s)), (0.12, whole)):  # 0.2925 s: 14,124 tokens, a chunk; 0.3125 s: 15,124
        assert policy.budget(BatchView(0.05, 10, 0, pace_credit_s=credit, **late), 32_768, 0.0) == budget, credit
    # A class with room in its objective (own step 0.31 s of 2 s, under CREDIT_MIN_OWN) is never lent the credit.
    roomy = late | {"tight_ttft_s": 2.0, "urgent_slack_s": 0.4}
    assert policy.budget(BatchView(0.05, 10, 0, pace_credit_s=0.12, **roomy), 32_768, 0.0) == _tokens_in(ahead_s)
    # With 0.5 s left, the chunks make it: no credit spent.
    assert policy.budget(BatchView(0.05, 10, 0, pace_credit_s=0.12, **(late | {"urgent_slack_s": 0.5})), 32_768, 0.0) == _tokens_in(ahead_s)
    other = BatchView(0.05, 10, 0, pace_slack_s=0.2, urgent_tokens=15_000, pace_credit_s=0.12, **TIGHT)
    assert policy.budget(other, 32_768, 0.0) == _tokens_in(floor)
    assert policy.budget(BatchView(0.05, 10, 0, pace_slack_s=0.2, pace_credit_s=0.12), 32_768, 0.0) == _tokens_in(0.1)
    # The credit stands in for the reserve (the class's own step less T: 0.2602 s here) and buys no more:
    # with 0.06 s of slack to spend that reaches the whole prompt (0.3115 s), with none it does not.
    for ahead, budget in ((0.06, whole), (0.0, _tokens_in(floor))):
        slack = BatchView(0.05, 10, 0, pace_slack_s=ahead + (1 - SAFETY) * 0.05, urgent_tokens=15_000, urgent_tight=True,
                          pace_credit_s=1.0, urgent_slack_s=0.4, **TIGHT)
        assert policy.budget(slack, 32_768, 0.0) == budget, ahead


def _decoding(request: Request, steps: int = 3) -> tuple[SLAScheduler, list[Request]]:
    """A scheduler that has run `request` for `steps` steps, and its running requests."""
    scheduler = build_scheduler(max_num_seqs=4, max_num_batched_tokens=2048, max_model_len=2048)
    driver = Driver(scheduler)
    driver.add(request)
    for _ in range(steps):
        driver.step()
    return scheduler, vc_running(scheduler)


def test_each_decoder_is_credited_by_the_output_it_is_still_planned_to_deliver() -> None:
    """PaceClock's credit: CREDIT_SHARE x T per output token left after the planned step, at most
    CREDIT_TPOTS x T (T as paced, PACE_SHARE of the objective); it shrinks as a request nears its end."""
    scheduler, running = _decoding(make_request(Tier.CRITICAL, prompt_tokens=64, max_tokens=1000, tpot_ms=50.0))
    pace = scheduler.pace.slack(running, scheduler.info_of, time.time(), 0)
    assert pace is not None and pace.credit_s == pytest.approx(CREDIT_TPOTS * PACE_SHARE * 0.05)  # 1000 tokens planned: the cap
    short = make_request(Tier.STANDARD, prompt_tokens=64, max_tokens=40, tpot_ms=100.0)
    scheduler, running = _decoding(short)
    left = short.max_tokens - short.num_output_tokens - 1
    assert 0 < left < 40
    pace = scheduler.pace.slack(running, scheduler.info_of, time.time(), 0)
    assert pace is not None and pace.credit_s == pytest.approx(CREDIT_SHARE * PACE_SHARE * 0.1 * left)
    # One more step in flight: one token less to catch up in.
    in_flight = scheduler.pace.slack(running, scheduler.info_of, time.time(), 1)
    assert in_flight is not None and in_flight.credit_s == pytest.approx(CREDIT_SHARE * PACE_SHARE * 0.1 * (left - 1))
    # Nothing with a TPOT objective decodes: no pace.
    scheduler, running = _decoding(make_request(Tier.BATCH, prompt_tokens=64, max_tokens=100))
    assert running and scheduler.pace.slack(running, scheduler.info_of, time.time(), 0) is None
