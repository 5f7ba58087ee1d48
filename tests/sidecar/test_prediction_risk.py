"""Output-length prediction and the SLA risk formula, without sockets (service accounting: tests/policy)."""

from __future__ import annotations

import pytest

from slaq.api.common import Tier
from slaq.sidecar.prediction import OutputLengthPredictor, prompt_bucket
from slaq.sidecar.risk import SlaRisk


def test_prompt_buckets_are_powers_of_two() -> None:
    assert [prompt_bucket(n) for n in (0, 63, 64, 127, 128, 1000, 10**9)] == [0, 0, 1, 1, 2, 4, 15]


def test_prior_until_enough_observations_then_learned_mean() -> None:
    p = OutputLengthPredictor(prior_tokens=256, min_observations=3)
    assert p.predict("a", 100, None) == 256
    for _ in range(3):
        p.observe("a", 100, 40)
    assert p.predict("a", 100, None) == 40
    assert p.predict("a", 100, 10) == 10  # max_tokens bounds the prediction


def test_cells_separate_tenants_and_prompt_lengths_and_fall_back() -> None:
    p = OutputLengthPredictor(min_observations=2, alpha=0.5)
    for _ in range(4):
        p.observe("a", 10, 20)
        p.observe("a", 5000, 400)
        p.observe("b", 10, 900)
    assert p.predict("a", 10, None) == 20
    assert p.predict("a", 5000, None) == 400
    assert p.predict("b", 10, None) == 900
    assert 20 < p.predict("a", 600, None) < 400  # unseen bucket: the tenant's mean of both cells
    assert 20 < p.predict("new", 10, None) < 900  # unseen tenant: the pod's mean


def test_prediction_follows_a_shift() -> None:
    p = OutputLengthPredictor(alpha=0.2, min_observations=1)
    for _ in range(50):
        p.observe("a", 10, 100)
    for _ in range(50):
        p.observe("a", 10, 10)
    assert p.predict("a", 10, None) <= 12


def test_idle_pod_has_zero_risk() -> None:
    assert SlaRisk().value(100.0) == 0.0


def test_projected_risk_crosses_one_before_the_deadline() -> None:
    risk = SlaRisk()
    risk.engine_ttft_s = 0.1
    risk.waiting(1, arrival=0.0, ttft_ms=500.0)
    assert risk.value(0.0) == pytest.approx(0.2)
    assert risk.value(0.4) == pytest.approx(1.0)  # 100 ms before the deadline
    assert risk.value(0.45) > 1.0
    risk.started(1, engine_ttft_s=0.1)
    assert risk.projected(0.45) == 0.0


def test_batch_requests_never_contribute() -> None:
    risk = SlaRisk()
    risk.waiting(1, arrival=0.0, ttft_ms=None)
    risk.finished(1.0, ttft_s=99.0, tpot_s=None, ttft_ms=None, tpot_ms=None)
    assert risk.value(100.0) == 0.0


def test_observed_risk_is_the_quantile_of_recent_ratios() -> None:
    risk = SlaRisk(window_s=60.0, quantile=0.9)
    for i in range(10):
        risk.finished(0.0, ttft_s=0.05 * (i + 1), tpot_s=None, ttft_ms=500.0, tpot_ms=None)  # ratios 0.1 .. 1.0
    assert risk.observed(1.0) == pytest.approx(0.9)
    risk.finished(1.0, ttft_s=0.1, tpot_s=0.2, ttft_ms=500.0, tpot_ms=100.0)  # TPOT twice its objective
    assert risk.observed(1.0) == pytest.approx(1.0)
    assert risk.observed(60.5) == pytest.approx(2.0)  # the older ten fell out of the window
    assert risk.observed(200.0) == 0.0


def test_a_released_requests_engine_time_counts_once_from_its_release() -> None:
    class Entry:
        release_time: float | None = None

    risk = SlaRisk()
    risk.engine_ttft_s = 0.2
    entry = Entry()
    risk.waiting(1, arrival=0.0, ttft_ms=500.0, entry=entry)
    assert risk.projected(0.2) == pytest.approx(0.8)  # queued: now + engine time
    entry.release_time = 0.2
    # Released at 0.2, its first token is expected at 0.4: the projection stays at 0.8 while the
    # engine works on it (counting the engine time again from now would say 1.2 at 0.4)...
    assert risk.projected(0.3) == pytest.approx(0.8) and risk.projected(0.4) == pytest.approx(0.8)
    # ...and grows with the clock once that expected first token is overdue.
    assert risk.projected(0.6) == pytest.approx(1.2)


def test_only_requests_with_a_ttft_objective_feed_the_engine_time() -> None:
    risk = SlaRisk()
    risk.waiting(1, arrival=0.0, ttft_ms=None)  # batch: no objective
    risk.started(1, engine_ttft_s=8.0)  # the engine served it after its protected tiers
    assert risk.engine_ttft_s == 0.0
    risk.waiting(2, arrival=0.0, ttft_ms=500.0)
    risk.started(2, engine_ttft_s=0.1)
    assert risk.engine_ttft_s == pytest.approx(0.02)


def test_each_tier_is_projected_with_its_own_engine_time() -> None:
    risk = SlaRisk(engine_ttft_alpha=1.0)
    risk.waiting(1, arrival=0.0, ttft_ms=2000.0, tier=Tier.STANDARD)
    risk.started(1, engine_ttft_s=0.9)  # standard waits behind critical at the engine
    risk.waiting(2, arrival=0.0, ttft_ms=500.0, tier=Tier.CRITICAL)
    risk.started(2, engine_ttft_s=0.1)
    assert (risk.engine_ttft(Tier.CRITICAL), risk.engine_ttft(Tier.STANDARD)) == (pytest.approx(0.1), pytest.approx(0.9))
    risk.waiting(3, arrival=10.0, ttft_ms=500.0, tier=Tier.CRITICAL)
    assert risk.projected(10.1) == pytest.approx(0.4)  # (0.1 waited + 0.1 critical engine time) / 0.5, not 2.0
