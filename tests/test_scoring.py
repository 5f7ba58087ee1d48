"""Contract test over every registered scoring term, and the profile's ordering guarantees."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slaq.api.common import Tier
from slaq.api.pool import ScoreWeights
from slaq.scoring import TERMS, PoolView, RequestView, ScoreProfile, effective_weights

requests = st.builds(
    RequestView,
    tier=st.sampled_from(list(Tier)),
    arrival=st.floats(0, 1e6),
    ttft_ms=st.one_of(st.none(), st.floats(1, 1e6)),
    prompt_tokens=st.integers(0, 1_000_000),
    predicted_output=st.integers(0, 100_000),
    tenant_service_share=st.floats(0, 1),
)
pools = st.builds(PoolView, load=st.floats(-1, 5), max_length_tokens=st.integers(1, 1_000_000), aging_bound_s=st.floats(0.001, 1e5))


@pytest.mark.parametrize("name", sorted(TERMS))
@given(request=requests, elapsed=st.floats(-10, 1e6), pool=pools)
def test_every_term_is_pure_and_in_unit_interval(name: str, request: RequestView, elapsed: float, pool: PoolView) -> None:
    now = request.arrival + elapsed
    value = TERMS[name](request, now, pool)
    assert 0.0 <= value <= 1.0
    assert TERMS[name](request, now, pool) == value


POOL = PoolView(load=0.5, max_length_tokens=8192, aging_bound_s=60.0)


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


def test_report_scenario_vip_first_short_free_before_long_standard() -> None:
    """Report 4.5: A (VIP, 1000-token prompt), B (standard, 5000), C (free, 100) arrive together at 95 % load."""
    pool = PoolView(load=0.95, max_length_tokens=8192, aging_bound_s=60.0)
    profile = ScoreProfile(ScoreWeights())
    a = _req(Tier.CRITICAL, ttft_ms=50.0, prompt=1000, output=100)
    b = _req(Tier.STANDARD, ttft_ms=200.0, prompt=5000, output=100)
    c = _req(Tier.BATCH, ttft_ms=None, prompt=100, output=100)
    order = sorted([("A", a), ("B", b), ("C", c)], key=lambda item: profile.rank_key(item[1], 0.01, pool))
    assert order[0][0] == "A"


def test_aging_bound_lets_batch_outrank_fresh_critical() -> None:
    profile = ScoreProfile(ScoreWeights())
    old_batch = _req(Tier.BATCH, arrival=0.0, ttft_ms=None, prompt=8000)
    fresh_vip = _req(Tier.CRITICAL, arrival=60.0, ttft_ms=50.0)
    assert profile.rank_key(old_batch, 60.0, POOL) < profile.rank_key(fresh_vip, 60.0, POOL)
    assert profile.rank_key(old_batch, 59.0, POOL) > profile.rank_key(_req(Tier.CRITICAL, arrival=59.0, ttft_ms=50.0), 59.0, POOL)


def test_fairness_prefers_the_less_served_tenant() -> None:
    profile = ScoreProfile(ScoreWeights())
    greedy, modest = _req(share=0.9), _req(share=0.1)
    assert profile.score(modest, 0.1, POOL) > profile.score(greedy, 0.1, POOL)
