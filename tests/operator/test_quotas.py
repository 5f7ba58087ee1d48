"""Quota splitting: sums never exceed quotas, floors hold, shares move toward demand."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slaq.operator.quotas import Slot, Split, floor_units, split_quota

pools = st.lists(
    st.tuples(st.integers(min_value=1, max_value=20), st.floats(min_value=0, max_value=1e6, allow_nan=False)),
    min_size=1, max_size=6,
).map(lambda items: [Slot(f"ns/p{i}", replicas, demand) for i, (replicas, demand) in enumerate(items)])
quotas = st.integers(min_value=0, max_value=10_000_000)
units = st.sampled_from([1, 1000])
fractions = st.floats(min_value=0.0, max_value=1.0)
min_floors = st.integers(min_value=0, max_value=2)


@settings(max_examples=300, deadline=None)
@given(quota=quotas, slots=pools, unit=units, floor_fraction=fractions, min_floor=min_floors)
def test_sum_never_exceeds_quota_and_floors_hold(quota: int, slots: list[Slot], unit: int, floor_fraction: float, min_floor: int) -> None:
    split = split_quota(quota, slots, unit=unit, floor_fraction=floor_fraction, min_floor_units=min_floor)
    assert split.total_units() <= quota * unit
    total_replicas = sum(s.replicas for s in slots)
    floor = floor_units(quota * unit, total_replicas, Fraction(floor_fraction), min_floor)
    assert all(split.units[s.pool] >= floor for s in slots)
    assert floor >= min(min_floor, (quota * unit) // total_replicas) or min_floor * total_replicas > quota * unit


@settings(max_examples=300, deadline=None)
@given(quota=quotas, slots=pools, unit=units, demands=st.lists(st.floats(min_value=0, max_value=1e6), min_size=6, max_size=6),
       smoothing=st.floats(min_value=0.01, max_value=1.0))
def test_smoothed_shares_move_toward_demand_and_keep_the_invariants(
        quota: int, slots: list[Slot], unit: int, demands: list[float], smoothing: float) -> None:
    previous = split_quota(quota, slots, unit=unit)
    moved = [Slot(s.pool, s.replicas, demands[i]) for i, s in enumerate(slots)]
    target = split_quota(quota, moved, unit=unit)
    step = split_quota(quota, moved, unit=unit, smoothing=smoothing, previous=previous)
    assert step.total_units() <= quota * unit
    for s in slots:
        before, after, goal = previous.units[s.pool], step.units[s.pool], target.units[s.pool]
        assert min(before, goal) <= after <= max(before, goal)  # never past the target, never away from it
        assert after >= min(before, goal)


@settings(max_examples=200, deadline=None)
@given(quota=st.integers(min_value=1000, max_value=1_000_000), slots=pools)
def test_more_demand_never_means_a_smaller_share(quota: int, slots: list[Slot]) -> None:
    base = split_quota(quota, slots, unit=1000)
    busier = [Slot(s.pool, s.replicas, s.demand * 2 + 1 if i == 0 else s.demand) for i, s in enumerate(slots)]
    assert split_quota(quota, busier, unit=1000).units[slots[0].pool] >= base.units[slots[0].pool] - 1


def test_demand_decides_the_spare_and_idle_replicas_keep_the_floor() -> None:
    split = split_quota(600, [Slot("a", 2, demand=300.0), Slot("b", 1, demand=0.0)], unit=1000, floor_fraction=0.1)
    # floor: 10 % of 600/3 = 20 rpm per replica; the spare 540 goes to pool a's two replicas.
    assert split.per_replica("b") == 20.0
    assert split.per_replica("a") == 20.0 + 270.0
    assert split.total_units() == 600_000


def test_no_demand_splits_equally_per_replica() -> None:
    split = split_quota(32, [Slot("a", 3), Slot("b", 1)], unit=1, min_floor_units=1)
    assert split.units == {"a": 8, "b": 8}


def test_concurrency_floor_is_one_request_when_affordable() -> None:
    split = split_quota(8, [Slot("a", 2, 100.0), Slot("b", 2, 0.0)], unit=1, floor_fraction=0.1, min_floor_units=1)
    assert split.units["b"] == 1 and split.total_units() <= 8
    starved = split_quota(3, [Slot("a", 2), Slot("b", 2)], unit=1, min_floor_units=1)
    assert starved.total_units() <= 3


def test_a_quota_change_jumps_to_the_new_target() -> None:
    old = split_quota(100, [Slot("a", 1, 1.0), Slot("b", 1, 0.0)], unit=1)
    new = split_quota(10, [Slot("a", 1, 1.0), Slot("b", 1, 0.0)], unit=1, previous=old)
    assert new.total_units() <= 10 and new == split_quota(10, [Slot("a", 1, 1.0), Slot("b", 1, 0.0)], unit=1)


@pytest.mark.parametrize("bad", [dict(replicas=0), dict(demand=-1.0), dict(demand=float("nan"))])
def test_bad_slots_are_refused_with_the_field_named(bad: dict) -> None:
    with pytest.raises(ValueError, match="replicas|demand"):
        Slot("a", **{"replicas": 1, **bad})


@settings(max_examples=200, deadline=None)
@given(quota=quotas, slots=pools, unit=units)
def test_a_split_fed_back_unchanged_comes_back_unchanged(quota: int, slots: list[Slot], unit: int) -> None:
    # The operator hands each reconcile the previous split: with the same quota, replicas and
    # demand it must come back as it went in (no drift from the smoothing's rounding).
    first = split_quota(quota, slots, unit=unit)
    again = split_quota(quota, slots, unit=unit, previous=first)
    assert again == first and again is not first
    assert split_quota(quota, slots, unit=unit, previous=again) == first


def test_an_empty_split_has_no_units() -> None:
    empty = split_quota(5, [], unit=1000)
    assert empty == Split(5, 1000, {}, {}) and empty.total_units() == 0


# ---------------------------------------------------------------- per-pod shares (the operator's form)
#
# The operator names every pod that answered the usage scrape, with the tenant's demand there (0.0
# for none); a pool's other replicas (not answering yet) are not named. Concurrency and rates both
# have a floor of at least one unit when the quota affords one per replica (tables.split_tenant).

@st.composite
def observed_pools(draw: st.DrawFn, max_pools: int = 3, max_replicas: int = 12) -> list[Slot]:
    slots = []
    for i in range(draw(st.integers(min_value=1, max_value=max_pools))):
        replicas = draw(st.integers(min_value=1, max_value=max_replicas))
        observed = draw(st.integers(min_value=0, max_value=replicas))
        demands = draw(st.lists(st.one_of(st.just(0.0), st.floats(min_value=0.01, max_value=1e4)), min_size=observed, max_size=observed))
        slots.append(Slot(f"ns/p{i}", replicas, pods={f"p{i}-pod-{j}": d for j, d in enumerate(demands)}))
    return slots


def per_replica(split: Split, slots: list[Slot]) -> dict[tuple[str, str], int]:
    """Every replica's units: the named pods', and the pool default for each replica not named."""
    shares = {}
    for s in slots:
        for pod in s.pods:
            shares[(s.pool, pod)] = split.pod_units(s.pool, pod)
        for j in range(s.replicas - len(s.pods)):
            shares[(s.pool, f"unnamed-{j}")] = split.units[s.pool]
    return shares


def demand_of(slots: list[Slot]) -> dict[tuple[str, str], float]:
    return {(s.pool, pod): d for s in slots for pod, d in s.pods.items()}


per_pod_quotas = st.one_of(st.integers(min_value=0, max_value=40), st.integers(min_value=0, max_value=100_000))


@settings(max_examples=400, deadline=None)
@given(quota=per_pod_quotas, slots=observed_pools(), unit=units, floor_fraction=st.sampled_from([0.0, 0.1, 0.5]))
def test_per_pod_split_keeps_the_sum_the_floor_and_locks_nobody_out(quota: int, slots: list[Slot], unit: int, floor_fraction: float) -> None:
    split = split_quota(quota, slots, unit=unit, floor_fraction=floor_fraction, min_floor_units=1)
    shares = per_replica(split, slots)
    total_replicas = sum(s.replicas for s in slots)
    quota_units = quota * unit
    # The sum over pods (listed + default x replicas not listed) never exceeds the quota.
    assert sum(shares.values()) == split.total_units() <= quota_units
    # The floor: every replica holds it; it is at least one unit whenever the quota affords one each.
    floor = floor_units(quota_units, total_replicas, Fraction(floor_fraction), 1)
    assert min(shares.values()) >= floor
    if quota_units >= total_replicas:
        assert floor >= 1 and not split.short_of_replicas()
    # No lock-out: the replicas with demand hold a unit each when the units suffice, else the units
    # all go to replicas with demand; with pods observed, a positive quota always lands somewhere.
    demanding = [r for r, d in demand_of(slots).items() if d > 0]
    if quota_units >= len(demanding):
        assert all(shares[r] >= 1 for r in demanding)
    else:
        assert all(shares[r] == 0 for r in shares if r not in demanding)
        assert sum(shares[r] >= 1 for r in demanding) == quota_units
    if quota_units >= 1 and any(s.pods for s in slots):
        assert max(shares.values()) >= 1
    # The coverage the status condition reports agrees with the shares.
    assert sum(c.holding for c in split.coverage.values()) == sum(v > 0 for v in shares.values())
    assert sum(c.with_demand for c in split.coverage.values()) == len(demanding)
    # Listed pods are exactly those whose share differs from the pool's default.
    for s in slots:
        assert all(v != split.units[s.pool] for v in split.pods.get(s.pool, {}).values())


@settings(max_examples=300, deadline=None)
@given(quota=per_pod_quotas, slots=observed_pools(), unit=units, data=st.data(), smoothing=st.sampled_from([0.5, 0.25, 1.0]))
def test_steady_demand_converges_geometrically(quota: int, slots: list[Slot], unit: int, data: st.DataObject, smoothing: float) -> None:
    # From the split of some other demand (same quota and replicas), k ticks of steady demand bring
    # every replica's share to the target: the largest of the total shortfall U_k (replicas below
    # target) and the total excess D_k (above) shrinks by (1 - smoothing) per tick, so
    # max(U_k, D_k) <= (1 - smoothing)^k * max(U_0, D_0), and at the target once that is below 1 unit.
    assume(any(d > 0 for s in slots for d in s.pods.values()))
    before = [Slot(s.pool, s.replicas, pods={p: data.draw(st.floats(min_value=0, max_value=1e4)) for p in s.pods}) for s in slots]
    previous = split_quota(quota, before, unit=unit, min_floor_units=1)
    target = per_replica(split_quota(quota, slots, unit=unit, min_floor_units=1), slots)

    def distances(split: Split) -> tuple[int, int]:
        shares = per_replica(split, slots)
        return (sum(max(0, target[r] - v) for r, v in shares.items()), sum(max(0, v - target[r]) for r, v in shares.items()))

    start = max(distances(previous))
    floor = floor_units(quota * unit, sum(s.replicas for s in slots), Fraction("0.1"), 1)
    split = previous
    for k in range(1, 40):
        was = per_replica(split, slots)
        split = split_quota(quota, slots, unit=unit, min_floor_units=1, smoothing=smoothing, previous=split)
        now = per_replica(split, slots)
        assert split.total_units() <= quota * unit and min(now.values()) >= floor
        assert all(min(was[r], target[r]) <= now[r] <= max(was[r], target[r]) for r in now)  # never away from, never past
        # The overshoot while pods read the new shares at different moments: what the raised replicas gain
        # is at most smoothing x the shortfall, plus one unit per raised replica (rounding).
        shortfall = sum(max(0, target[r] - was[r]) for r in now)
        raised = [now[r] - was[r] for r in now if now[r] > was[r]]
        assert sum(raised) <= Fraction(smoothing) * shortfall + len(raised)
        assert max(distances(split)) <= (1 - Fraction(smoothing)) ** k * start
        if (1 - Fraction(smoothing)) ** k * start < 1:
            assert now == target
            break


def test_a_quota_below_the_replicas_goes_to_the_pods_with_demand_and_follows_new_traffic() -> None:
    # Issue 35: maxConcurrency 4 over 8 replicas gave every replica 0.
    idle = {f"pod-{i}": 0.0 for i in range(8)}
    assert split_quota(4, [Slot("ns/p", 8)], min_floor_units=1).units == {"ns/p": 0}  # no pod known yet: nowhere to put a unit
    first = split_quota(4, [Slot("ns/p", 8, pods=idle)], min_floor_units=1)
    assert first.units == {"ns/p": 0} and first.pods == {"ns/p": {"pod-0": 1, "pod-1": 1, "pod-2": 1, "pod-3": 1}}
    # Traffic on pod-5 and pod-7 (1:3): both hold a unit at once; pod-7 rises half-way to its 3, then to 3.
    traffic = [Slot("ns/p", 8, pods={**idle, "pod-5": 10.0, "pod-7": 30.0})]
    busy = split_quota(4, traffic, min_floor_units=1, previous=first)
    assert busy.pods == {"ns/p": {"pod-5": 1, "pod-7": 2}}
    busy = split_quota(4, traffic, min_floor_units=1, previous=busy)
    assert busy.pods == {"ns/p": {"pod-5": 1, "pod-7": 3}}
    # A request refused on pod-2 counts as demand there: the next tick gives pod-2 a unit.
    moved = split_quota(4, [Slot("ns/p", 8, pods={**idle, "pod-2": 1.0, "pod-5": 10.0, "pod-7": 30.0})], min_floor_units=1, previous=busy)
    assert moved.pods == {"ns/p": {"pod-2": 1, "pod-5": 1, "pod-7": 2}} and moved.total_units() == 4
    assert moved.coverage["ns/p"].holding == 3 and moved.coverage["ns/p"].with_demand_holding == 3
    # Five replicas with demand, four units: the four with most demand hold one each.
    five = split_quota(4, [Slot("ns/p", 8, pods={**idle, **{f"pod-{i}": float(10 + i) for i in range(5)}})], min_floor_units=1)
    assert five.pods == {"ns/p": {f"pod-{i}": 1 for i in range(1, 5)}} and five.short_of_replicas()


def test_a_single_rising_unit_is_not_stuck_by_rounding() -> None:
    # Half of one unit rounds to nothing: the smoothing still moves a unit per tick.
    skewed = split_quota(3, [Slot("ns/p", 2, pods={"a": 1.0, "b": 0.0})], min_floor_units=1)
    after = split_quota(3, [Slot("ns/p", 2, pods={"a": 0.0, "b": 1.0})], min_floor_units=1, previous=skewed)
    assert (skewed.pod_units("ns/p", "a"), skewed.pod_units("ns/p", "b")) == (2, 1)
    assert (after.pod_units("ns/p", "a"), after.pod_units("ns/p", "b")) == (1, 2)


def test_a_pool_of_one_named_replica_keeps_its_share_as_the_default() -> None:
    # Every replica named and one of them: no per-pod list, the table reads as before.
    split = split_quota(600, [Slot("ns/a", 1, pods={"pod-0": 300.0}), Slot("ns/b", 1)], unit=1000, min_floor_units=1)
    assert split.pods == {} and split.units == {"ns/a": 570_000, "ns/b": 30_000}
