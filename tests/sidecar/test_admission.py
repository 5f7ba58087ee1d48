"""Token buckets, tenant quotas and pod-level guards, without sockets (time is passed in)."""

from __future__ import annotations

import pytest

from slaq.api.common import Tier
from slaq.sidecar.admission import PodGuard, PodPressure, QuotaGate, TokenBucket
from slaq.sidecar.errors import ConcurrencyExceeded, DeadlineUnreachable, QueueFull, RequestRateExceeded, Shedding, TokenRateExceeded
from slaq.sidecar.tenants import Tenant


def tenant(**share: object) -> Tenant:
    return Tenant(name="t", tier=Tier.STANDARD, ttft_ms=200.0, tpot_ms=None, cache_salt="s" * 16, **share)  # type: ignore[arg-type]


def test_bucket_refills_at_rate_per_minute_and_caps_at_one_minute() -> None:
    bucket = TokenBucket(60, now=0.0)
    bucket.take(60, 0.0)
    assert bucket.retry_after(1, 0.0) == pytest.approx(1.0)
    assert bucket.retry_after(1, 1.0) == 0.0
    bucket._refill(1000.0)
    assert bucket.level == 60


def test_bucket_large_request_needs_a_full_bucket_not_more() -> None:
    bucket = TokenBucket(100, now=0.0)
    assert bucket.retry_after(500, 0.0) == 0.0  # admitted on a full bucket, then in debt
    bucket.take(500, 0.0)
    assert bucket.retry_after(1, 0.0) == pytest.approx(401 * 60 / 100)


def test_zero_quota_never_fits() -> None:
    assert TokenBucket(0, now=0.0).retry_after(1, 10.0) is None


def test_request_rate_limit_refuses_with_retry_after() -> None:
    gate = QuotaGate()
    t = tenant(requests_per_minute=2)
    gate.admit(t, 1, 0.0)
    gate.admit(t, 1, 0.0)
    with pytest.raises(RequestRateExceeded) as info:
        gate.admit(t, 1, 0.0)
    assert info.value.retry_after_s == pytest.approx(30.0)
    gate.admit(t, 1, 30.0)


def test_concurrency_limit_releases_on_settle() -> None:
    gate = QuotaGate()
    t = tenant(max_concurrency=1)
    ticket = gate.admit(t, 1, 0.0)
    with pytest.raises(ConcurrencyExceeded):
        gate.admit(t, 1, 0.0)
    gate.settle(ticket, 1, 0.0)
    gate.settle(ticket, 1, 0.0)  # idempotent: a second settle must not free a second slot
    assert gate.in_flight("t") == 0
    gate.admit(t, 1, 0.0)


def test_unused_reservation_is_refunded_and_overrun_charged() -> None:
    gate = QuotaGate()
    t = tenant(tokens_per_minute=1000)
    ticket = gate.admit(t, 900, 0.0)  # prompt 100 + max_tokens 800 reserved
    with pytest.raises(TokenRateExceeded):
        gate.admit(t, 200, 0.0)
    gate.settle(ticket, 150, 0.0)  # only 50 output tokens were produced
    gate.admit(t, 800, 0.0)
    ticket = gate.admit(t, 10, 0.0)
    gate.settle(ticket, 60, 0.0)  # used more than reserved: the bucket goes into debt
    with pytest.raises(TokenRateExceeded):
        gate.admit(t, 1, 0.0)


def test_unknown_usage_keeps_the_reservation() -> None:
    gate = QuotaGate()
    t = tenant(tokens_per_minute=100)
    ticket = gate.admit(t, 100, 0.0)
    gate.settle(ticket, None, 0.0)
    with pytest.raises(TokenRateExceeded):
        gate.admit(t, 1, 0.0)


def test_changed_share_applies_to_the_next_request() -> None:
    gate = QuotaGate()
    gate.admit(tenant(requests_per_minute=100), 1, 0.0)
    with pytest.raises(RequestRateExceeded):
        for _ in range(3):
            gate.admit(tenant(requests_per_minute=2), 1, 0.0)


def test_raised_share_refills_at_the_new_rate_since_the_last_request() -> None:
    gate = QuotaGate()
    gate.admit(tenant(requests_per_minute=1), 1, 0.0)
    with pytest.raises(RequestRateExceeded):
        gate.admit(tenant(requests_per_minute=1), 1, 0.5)
    gate.admit(tenant(requests_per_minute=600), 1, 1.0)  # 0.5 s at 10/s refilled 5 requests


def test_unlimited_tenant_is_never_refused() -> None:
    gate = QuotaGate()
    for _ in range(10_000):
        gate.admit(tenant(), 10**6, 0.0)


def pressure(depth: int = 0, risk: float = 0.0) -> PodPressure:
    return PodPressure(queue_depth=depth, max_queue_depth=100, waiting_risk=risk)


def test_batch_is_shed_when_saturated_but_critical_is_not() -> None:
    guard = PodGuard()
    guard.check(Tier.BATCH, None, 0.0, 0.0, pressure(depth=10))
    with pytest.raises(Shedding):
        guard.check(Tier.BATCH, None, 0.0, 0.0, pressure(depth=60))
    with pytest.raises(Shedding):
        guard.check(Tier.BATCH, None, 0.0, 0.0, pressure(risk=1.2))
    guard.check(Tier.CRITICAL, 50.0, 0.0, 0.0, pressure(depth=60, risk=1.2))


def test_full_queue_refuses_everyone() -> None:
    with pytest.raises(QueueFull):
        PodGuard().check(Tier.CRITICAL, 50.0, 0.0, 0.0, pressure(depth=100))


def test_unreachable_ttft_is_refused_with_retry_after() -> None:
    guard = PodGuard()
    guard.check(Tier.STANDARD, 200.0, 0.1, 0.05, pressure())
    with pytest.raises(DeadlineUnreachable) as info:
        guard.check(Tier.STANDARD, 200.0, 2.4, 0.1, pressure())
    assert info.value.retry_after_s == pytest.approx(2.5)
    guard.check(Tier.STANDARD, None, 100.0, 0.1, pressure())  # no objective: nothing to miss


def test_no_deadline_refusal_without_a_queue_or_when_the_engine_alone_is_too_slow() -> None:
    guard = PodGuard()
    guard.check(Tier.CRITICAL, 50.0, 0.0, 5.0, pressure())  # nothing ahead: go, even if it will be late
    guard.check(Tier.CRITICAL, 50.0, 1.0, 0.2, pressure())  # the engine alone misses 50 ms: refusing saves nothing
