"""Quota splitting: sums never exceed quotas, floors hold, shares move toward demand."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
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
