"""The skew simulation runs the real split, tables and token buckets: per-pod shares admit what equal shares refuse."""

from __future__ import annotations

from slaq.bench.quota_skew import simulate


def test_per_pod_shares_admit_a_skewed_tenant_that_equal_shares_refuse() -> None:
    # 80 % of a tenant's quota lands on one of two replicas: equal shares admit 50 % + 20 %.
    common = dict(minutes=6.0, measure_s=120.0, tick_s=15.0, propagation_s=0.0, even=True, seed=0)
    equal = simulate(600, [0.8, 0.2], per_pod=False, **common)
    per_pod = simulate(600, [0.8, 0.2], per_pod=True, **common)
    assert 0.65 < equal < 0.75
    assert per_pod > 0.97
