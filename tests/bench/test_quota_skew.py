"""The skew and routing simulations run the real split, tables and token buckets: per-pod shares admit what equal
shares refuse, and the cluster stays within the documented overshoot bound while the pool scales."""

from __future__ import annotations

import pytest

from slaq.bench.quota_skew import ROUTERS, AffinityRouter, Replica, parse_schedule, simulate, simulate_routed
from slaq.sidecar.admission import QuotaGate
from slaq.sidecar.usage import UsageLog


def test_per_pod_shares_admit_a_skewed_tenant_that_equal_shares_refuse() -> None:
    # 80 % of a tenant's quota lands on one of two replicas: equal shares admit 50 % + 20 %.
    common = dict(minutes=6.0, measure_s=120.0, tick_s=15.0, propagation_s=0.0, even=True, seed=0)
    equal = simulate(600, [0.8, 0.2], per_pod=False, **common)
    per_pod = simulate(600, [0.8, 0.2], per_pod=True, **common)
    assert 0.65 < equal < 0.75
    assert per_pod > 0.97


ROUTED = dict(minutes=10.0, tick_s=15.0, propagation_s=0.0, service_s=2.0, sessions=50, zipf=1.2)


def test_per_pod_shares_follow_session_affinity_through_a_scale_out() -> None:
    # Zipf-popular sessions hashed onto 2 then 4 pods load them unevenly: one pool-wide share refuses the
    # busy pods' excess; per-pod shares follow the demand (and the remap after the scale-out).
    schedule = parse_schedule("0:2,300:4")
    pool = [simulate_routed(600, "affinity", schedule, per_pod=False, offered=1.0, seed=s, **ROUTED).admitted for s in range(2)]
    per_pod = [simulate_routed(600, "affinity", schedule, per_pod=True, offered=1.0, seed=s, **ROUTED).admitted for s in range(2)]
    assert sum(per_pod) / 2 > sum(pool) / 2 + 0.03
    assert min(per_pod) > 0.95


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("per_pod", [False, True])
def test_cluster_admits_at_most_the_documented_bound_while_scaling(router: str, per_pod: bool) -> None:
    # operator/README.md "Overshoot bound": over any T minutes at most Q (T + 1) (full buckets), plus on a
    # scale-up the new replicas' part Q n_added / n_new. The tenant sends twice its quota so the gates bind.
    q, schedule = 600, parse_schedule("0:2,240:4,480:3")
    run = simulate_routed(q, router, schedule, per_pod=per_pod, offered=2.0, seed=1, **ROUTED)
    admitted = [(e + 1.0) * q for e in run.minute_errors]
    eps = q * 2 / 4
    for t in range(1, len(admitted) + 1):
        for start in range(len(admitted) - t + 1):
            assert sum(admitted[start:start + t]) <= q * (t + 1) + eps + 1e-6, (start, t)
    assert sum(admitted) > 0.9 * q * len(admitted)  # not vacuous: the quota is used


def test_a_bad_schedule_is_refused_naming_the_part() -> None:
    for bad, part in (("0:2,600", "'600'"), ("10:2", "first step"), ("0:2,60:0", "'60:0'"), ("0:2,60:3,30:2", "'30:2'")):
        with pytest.raises(ValueError, match=part):
            parse_schedule(bad)


def test_affinity_remaps_only_the_sessions_the_new_pods_take() -> None:
    def owners(n: int) -> list[str]:
        pods = [Replica(f"pool-pod-{i}", QuotaGate(), UsageLog()) for i in range(n)]
        router = AffinityRouter()
        return [router.pick(pods, session).name for session in range(2000)]

    two, four = owners(2), owners(4)
    moved = [(a, b) for a, b in zip(two, four) if a != b]
    assert all(b in ("pool-pod-2", "pool-pod-3") for _, b in moved)  # none moves between surviving pods
    assert 0.3 < len(moved) / len(two) < 0.7  # about n_added / n_new = 1/2
    assert all(sum(o == f"pool-pod-{i}" for o in four) > 200 for i in range(4))  # every pod takes a part
