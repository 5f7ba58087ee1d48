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


def test_kv_admission_does_not_hold_requests_on_an_engine_too_slow_for_the_objective_without_kv() -> None:
    """A decode step of 45 ms with no KV is over 0.85 x 50 ms whatever is admitted: holding KV back
    cannot restore the objective, it would only run the batch a few requests at a time."""
    slow = KvTpotAdmission(StepTimeModel(fixed_s=0.045, per_token_s=28e-6, per_kv_token_s=34e-9))
    assert not slow.refuses(0.05, 10, 500_000, 100_000)
    assert slow.refuses(0.1, 10, 500_000, 2_000_000)  # at a 100 ms objective its KV is what crosses the line


def test_the_scheduler_passes_over_a_request_the_kv_rule_refuses() -> None:
    scheduler = build_scheduler(max_num_seqs=4, max_num_batched_tokens=64)
    driver = Driver(scheduler)
    driver.add(make_request(Tier.CRITICAL, prompt_tokens=40, max_tokens=50, tpot_ms=50))
    driver.step()
    waiting = make_request(Tier.BATCH, prompt_tokens=40, max_tokens=50)
    driver.add(waiting)  # its SLA facts attached; not stepped
    assert scheduler._admission_refusal(waiting) is None
    scheduler.kv_admission = KvTpotAdmission(StepTimeModel(fixed_s=0.040, per_kv_token_s=1e-4))  # 40 ms + 0.1 ms per KV token
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


# -- the victim's price (item 3) -----------------------------------------------------------------
def test_a_victims_price_is_its_recompute_or_its_swap_when_the_host_cache_has_room() -> None:
    from slaq.engine.kv_security.swap import SwapOrRecompute
    from slaq.engine.victim_price import VictimPrice, recompute_seconds

    model = StepTimeModel(fixed_s=0.002, per_token_s=28e-6, per_pair_s=1e-9)
    assert recompute_seconds(model, 100_000) == pytest.approx(2.8 + 5.0)
    swap = SwapOrRecompute(model, bytes_per_token=131072, seal_seconds_per_byte=1 / 55e9)
    room = [0]
    price = VictimPrice(model, swap, lambda: room[0])
    assert price.restore_seconds(100_000) == pytest.approx(7.8)  # no room: recomputed
    room[0] = 200_000
    assert price.restore_seconds(100_000) == pytest.approx(2 * 100_000 * 131072 / 55e9)  # swapped back in: 0.48 s
    assert price.worth(100_000, 2.0)  # 0.48 s against half of a 2 s objective
    room[0] = 50_000
    assert not price.worth(100_000, 2.0)  # the host cache cannot hold it: 7.8 s is not worth 2 s
    assert price.worth(4_000, 2.0) and not price.worth(4_000, None)


def test_urgent_preemption_passes_over_a_long_context_for_a_short_gain() -> None:
    from slaq.engine.preemption import ResourceView, UrgentPreemption
    from slaq.engine.victim_price import VictimPrice

    scheduler = build_scheduler(max_num_seqs=2, max_num_batched_tokens=512, num_blocks=1000, max_model_len=512)
    driver = Driver(scheduler)
    long = make_request(Tier.BATCH, prompt_tokens=400, max_tokens=100)
    short = make_request(Tier.BATCH, prompt_tokens=40, max_tokens=100)
    driver.add(long, short)
    for _ in range(3):
        driver.step()
    assert vc.is_decoding(long) and vc.is_decoding(short)
    critical = make_request(Tier.CRITICAL, prompt_tokens=40, max_tokens=10, ttft_ms=500)
    scheduler.add_request(critical)
    resources = ResourceView(free_slots=0, free_blocks=500, headroom_blocks=0, block_size=16, step_tokens=512)
    running = [long, short]
    # Without a price the cheapest victim goes (the short one): both plans agree on it.
    unpriced = UrgentPreemption(max_per_step=1).plan([critical], running, resources, scheduler.info_of)
    assert [p.victim for p in unpriced] == [short]
    # Priced at 1.5 ms per token, the short one (about 44 tokens: 66 ms) is worth a 0.5 s objective;
    # the long one (about 403 tokens: 0.6 s) is not, so with only the long one running nothing is preempted.
    price = VictimPrice(StepTimeModel(per_token_s=1.5e-3))
    assert [p.victim for p in UrgentPreemption(max_per_step=1, price=price).plan([critical], running, resources, scheduler.info_of)] == [short]
    assert UrgentPreemption(max_per_step=1, price=price).plan([critical], [long], resources, scheduler.info_of) == []
    assert [p.victim for p in UrgentPreemption(max_per_step=1).plan([critical], [long], resources, scheduler.info_of)] == [long]
