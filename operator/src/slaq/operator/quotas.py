"""Splitting a tenant's cluster-wide quota into per-replica shares (pure functions).

The rule (operator/README.md has the reasoning and the overshoot bound):

- every replica of every selected pool gets a floor, `floor_fraction` of an equal split (and at
  least `min_floor_units`, e.g. one concurrent request, when the quota allows it), so an idle
  replica can still admit;
- what is left is split across pools in proportion to observed demand (equally per replica when
  nothing was observed), and evenly over a pool's replicas (they share one tenant table);
- when the quota and the replica counts are unchanged since the previous split, shares move from
  the previous split toward that target by `smoothing` of the distance, so one noisy reading
  does not swing them; any other change jumps straight to the target.

Arithmetic is exact, in integer units (milli-requests for rates, whole requests for
concurrency) and always rounds down, so the sum over all replicas never exceeds the quota.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction


@dataclass(frozen=True)
class Slot:
    """One pool's part in a tenant's split: its replica count and the demand observed on it."""

    pool: str
    replicas: int
    demand: float = 0.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"slot {self.pool!r}: replicas must be >= 1, got {self.replicas}")
        if not math.isfinite(self.demand) or self.demand < 0:
            raise ValueError(f"slot {self.pool!r}: demand must be a finite number >= 0, got {self.demand}")


@dataclass(frozen=True)
class Split:
    """Per-replica shares, in integer `unit`s of the quota (e.g. 1000 = milli-requests)."""

    quota: int
    unit: int
    replicas: Mapping[str, int]
    units: Mapping[str, int] = field(default_factory=dict)

    def per_replica(self, pool: str) -> float:
        return self.units[pool] / self.unit

    def total_units(self) -> int:
        return sum(self.units[p] * self.replicas[p] for p in self.units)


def floor_units(quota_units: int, replicas: int, floor_fraction: Fraction, min_floor_units: int) -> int:
    """The per-replica floor: a fraction of an equal split, at least `min_floor_units` if affordable."""
    if replicas == 0:
        return 0
    floor = math.floor(floor_fraction * quota_units / replicas)
    if min_floor_units * replicas <= quota_units:
        floor = max(floor, min_floor_units)
    return floor


def split_quota(
    quota: int,
    slots: Sequence[Slot],
    *,
    unit: int = 1,
    floor_fraction: float = 0.1,
    min_floor_units: int = 0,
    smoothing: float = 0.5,
    previous: Split | None = None,
) -> Split:
    """Per-replica shares of `quota` for each pool in `slots`; see the module docstring."""
    if quota < 0:
        raise ValueError(f"quota must be >= 0, got {quota}")
    if not 0.0 <= floor_fraction <= 1.0 or not 0.0 < smoothing <= 1.0:
        raise ValueError("floor_fraction must lie in [0, 1] and smoothing in (0, 1]")
    if len({s.pool for s in slots}) != len(slots):
        raise ValueError("each pool may appear once in a split")
    replicas = {s.pool: s.replicas for s in slots}
    total_replicas = sum(replicas.values())
    quota_units = quota * unit
    if not slots:
        return Split(quota, unit, replicas)

    floor = floor_units(quota_units, total_replicas, Fraction(floor_fraction), min_floor_units)
    spare = quota_units - floor * total_replicas
    if any(s.demand for s in slots):
        demands = {s.pool: Fraction(s.demand) for s in slots}
        total_demand = sum(demands.values())
        target = {p: floor + math.floor(spare * (demands[p] / total_demand) / replicas[p]) for p in replicas}
    else:  # nothing observed: equally per replica (the integer form of spare * (r / total) / r)
        target = {p: floor + spare // total_replicas for p in replicas}

    if previous is not None and previous.quota == quota and previous.unit == unit and dict(previous.replicas) == replicas \
            and set(previous.units) == set(replicas) and previous.total_units() <= quota_units \
            and all(previous.units[p] >= floor for p in replicas) and dict(previous.units) != target:
        step = Fraction(smoothing)
        units = {p: math.floor(previous.units[p] + step * (target[p] - previous.units[p])) for p in replicas}
    else:
        units = target
    return Split(quota, unit, replicas, units)
