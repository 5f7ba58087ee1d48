"""Formula 1's terms and the pod ranking's ordering guarantees (the registry contract: tests/policy)."""

from __future__ import annotations

import pytest

from slaq.api.common import Tier
from slaq.api.pool import ScoreWeights
from slaq.policy.ranking import MISSED_CLASS, DeadlineClassRanking, effective_weights
from slaq.policy.terms import TERMS
from slaq.policy.views import PoolView, RequestView

POOL = PoolView(load=0.5, max_length_tokens=8192, aging_bound_s=60.0)
RANKING = DeadlineClassRanking(ScoreWeights())


def _req(tier: Tier = Tier.STANDARD, arrival: float = 0.0, ttft_ms: float | None = 200.0, prompt: int = 100, output: int = 100, share: float = 0.0) -> RequestView:
    return RequestView(tier, arrival, ttft_ms, prompt, output, share)


def test_urgency_rises_towards_the_deadline() -> None:
    request = _req(ttft_ms=1000.0)
    values = [TERMS["urgency"](request, t, POOL) for t in (0.0, 0.5, 0.9, 1.0, 5.0)]
    assert values == sorted(values) and values[0] == 0.5 and values[-1] == 1.0


def test_no_objective_means_no_urgency() -> None:
    assert TERMS["urgency"](_req(ttft_ms=None), 100.0, POOL) == 0.0


def test_load_adaptive_weights_follow_the_report() -> None:
    weights = effective_weights(ScoreWeights(), load=1.0)
    assert weights["urgency"] == pytest.approx(0.6) and weights["length"] == pytest.approx(0.0)
    weights = effective_weights(ScoreWeights(), load=0.0)
    assert weights["urgency"] == pytest.approx(0.4) and weights["length"] == pytest.approx(0.2)


def test_report_scenario_ranks_vip_then_standard_then_free() -> None:
    """Report 4.5: A (VIP, 1000-token prompt), B (standard, 5000), C (free, 100) arrive together at
    95 % load. The ranking alone says A, B, C (A's and B's deadlines are attainable, C has none);
    the report's A, C, B comes from memory: C fits in the KV cache left while B does not, and the
    engine's waiting loop backfills it (tests/engine/test_backfill.py)."""
    pool = PoolView(load=0.95, max_length_tokens=8192, aging_bound_s=60.0)
    a = _req(Tier.CRITICAL, ttft_ms=50.0, prompt=1000, output=100)
    b = _req(Tier.STANDARD, ttft_ms=200.0, prompt=5000, output=100)
    c = _req(Tier.BATCH, ttft_ms=None, prompt=100, output=100)
    order = sorted([("C", c), ("B", b), ("A", a)], key=lambda item: RANKING.rank(item[1], 0.01, pool))
    assert [name for name, _ in order] == ["A", "B", "C"]
    # formula 1 agrees on its own: the order does not hang on the class rule alone
    assert RANKING.score(a, 0.01, pool) > RANKING.score(b, 0.01, pool) > RANKING.score(c, 0.01, pool)


def test_aging_bound_lets_batch_outrank_fresh_critical() -> None:
    old_batch = _req(Tier.BATCH, arrival=0.0, ttft_ms=None, prompt=8000)
    fresh_vip = _req(Tier.CRITICAL, arrival=60.0, ttft_ms=50.0)
    assert RANKING.rank(old_batch, 60.0, POOL) < RANKING.rank(fresh_vip, 60.0, POOL)
    assert RANKING.rank(old_batch, 59.0, POOL) > RANKING.rank(_req(Tier.CRITICAL, arrival=59.0, ttft_ms=50.0), 59.0, POOL)


def test_a_fresh_standard_request_outranks_a_batch_backlog_under_overload() -> None:
    """The flaw of plain formula 1 (docs/decisions/0001-deadline-classes-not-formula-1-across-tiers.md):
    a 40-second-old batch request outscored a fresh standard one. The class order serves the
    attainable standard deadline first."""
    pool = PoolView(load=1.0, max_length_tokens=8192, aging_bound_s=60.0)
    old_batch = _req(Tier.BATCH, arrival=0.0, ttft_ms=60_000.0, prompt=100)
    fresh = _req(Tier.STANDARD, arrival=40.0, ttft_ms=2000.0, prompt=4000)
    assert RANKING.score(old_batch, 40.0, pool) > RANKING.score(fresh, 40.0, pool)  # the flaw, in formula 1
    assert RANKING.rank(fresh, 40.0, pool) < RANKING.rank(old_batch, 40.0, pool)
    assert RANKING.rank(fresh, 42.5, pool)[0] == MISSED_CLASS  # once missed, formula 1 decides again


def test_fairness_prefers_the_less_served_tenant() -> None:
    greedy, modest = _req(share=0.9), _req(share=0.1)
    assert RANKING.score(modest, 0.1, POOL) > RANKING.score(greedy, 0.1, POOL)
    assert RANKING.within_tier_key(modest, 60.0) < RANKING.within_tier_key(greedy, 60.0)
