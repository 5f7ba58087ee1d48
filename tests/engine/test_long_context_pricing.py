"""Long contexts priced against TPOT (issue 37, item 2): the step-time model's attention-pairs term, the budget
that prices a prompt chunk at its context, the KV admission rule, and the pace's margin."""

from __future__ import annotations

import pytest

from slaq.api.common import Tier
from slaq.engine import vllm_compat as vc
from slaq.engine.kv_admission import KvTpotAdmission
from slaq.engine.step_budget import BatchView
from slaq.engine.tpot_budget import PACE_SHARE, SAFETY, PaceClock, StepTimeModel, TpotStepBudget
from tests.engine.harness import Driver, build_scheduler, make_request
from vllm.v1.core.sched.async_scheduler import AsyncScheduler


def _trained(steps: int = 400) -> StepTimeModel:
    """A model taught steps of 2 ms + 28 us/token + 34 ns per KV token + 1 ns per attention pair of prompt chunks."""
    model = StepTimeModel()
    for step in range(steps):
        tokens = 256 + (step * 997) % 4000
        kv = 50_000 + (step * 7919) % 700_000
        pairs = tokens * ((step * 104_729) % 100_000) if step % 3 else 0
        model.observe(tokens, 0.002 + 28e-6 * tokens + 34e-9 * kv + 1e-9 * pairs, kv, pairs)
    return model


def test_the_model_learns_what_a_prompt_chunks_attention_pairs_cost() -> None:
    model = _trained()
    assert model.per_pair_s == pytest.approx(1e-9, rel=0.05)
    assert model.per_token_s == pytest.approx(28e-6, rel=0.05) and model.per_kv_token_s == pytest.approx(34e-9, rel=0.1)
    # A chunk at 100k tokens of context: each token costs its attention over them, 1e-4 s beyond its 28 us.
    tokens = model.tokens_within(0.042, 200_000, decodes=10, context=100_000)
    n = tokens - 10
    assert model.predict(int(tokens), 200_000, int(n * (100_000 + n / 2))) == pytest.approx(0.042, rel=0.01)
    assert tokens < model.tokens_within(0.042, 200_000) / 3  # priced per token alone it would be 3x too long


def test_the_budget_prices_a_long_contexts_chunk_and_leaves_short_ones_alone() -> None:
    budget = TpotStepBudget(model=_trained())
    short = budget.budget(BatchView(0.05, 10, 200_000), 8192, 0.0)
    long = budget.budget(BatchView(0.05, 10, 200_000, prefill_context_tokens=100_000), 8192, 0.0)
    assert long < short / 3
    assert budget.budget(BatchView(0.05, 10, 200_000, prefill_context_tokens=0), 8192, 0.0) == short


def test_kv_admission_refuses_what_would_break_the_tightest_tpot() -> None:
    model = StepTimeModel(fixed_s=0.002, per_token_s=28e-6, per_kv_token_s=34e-9)
    rule = KvTpotAdmission(model)
    limit_kv = (SAFETY * 0.05 - 0.002 - 28e-6 * 11) / 34e-9  # about 1.18M tokens of KV fit a 42.5 ms decode step
    assert not rule.refuses(0.05, 10, 500_000, 100_000)
    assert rule.refuses(0.05, 10, 500_000, int(limit_kv - 500_000) + 1_000)  # a long context over the line waits
    assert not rule.refuses(0.1, 10, 500_000, int(limit_kv - 500_000) + 1_000)  # a looser objective holds it
    assert not rule.refuses(None, 10, 5_000_000, 100_000)  # no TPOT objective running: nothing to protect
    assert not KvTpotAdmission(StepTimeModel()).refuses(0.05, 10, 5_000_000, 100_000)  # KV cost not learned yet


def test_the_scheduler_passes_over_a_request_the_kv_rule_refuses() -> None:
    scheduler = build_scheduler(max_num_seqs=4, max_num_batched_tokens=64)
    driver = Driver(scheduler)
    driver.add(make_request(Tier.CRITICAL, prompt_tokens=40, max_tokens=50, tpot_ms=50))
    driver.step()
    waiting = make_request(Tier.BATCH, prompt_tokens=40, max_tokens=50)
    assert scheduler._admission_refusal(waiting) is None
    scheduler.kv_admission = KvTpotAdmission(StepTimeModel(fixed_s=0.040, per_kv_token_s=1e-6))  # 40 ms + 1 us per KV token
    assert scheduler._admission_refusal(waiting) == "tpot_kv"


def test_prefill_pairs_and_the_longest_prefill_context_read_vllms_requests() -> None:
    scheduler = build_scheduler(AsyncScheduler, max_num_seqs=4, max_num_batched_tokens=64)
    driver = Driver(scheduler)
    request = make_request(Tier.BATCH, prompt_tokens=300)
    driver.add(request)
    first = scheduler.schedule()
    assert vc.prefill_pairs(scheduler, first) == 64 * 0 + 64 * 64 // 2
    assert vc.longest_prefill_context([request]) == 64
    driver.answer(first)
    second = scheduler.schedule()
    assert vc.prefill_pairs(scheduler, second) == 64 * 64 + 64 * 64 // 2  # the second chunk attends over the first
    assert vc.longest_prefill_context([]) == 0


def test_the_pace_runs_just_under_the_objective() -> None:
    assert 0.99 <= PACE_SHARE < 1.0
    assert PaceClock is not None
