"""Splitting a tenant's cluster-wide quota into per-replica shares (pure functions).

The rule (operator/README.md has the reasoning, the convergence bound and the overshoot bound):

- replicas are split one by one where their demand is known (`Slot.pods`: each pod's observed
  demand); a pool's other replicas (not observed, or idle) share one value, the pool's default;
- every replica gets a floor, `floor_fraction` of an equal split and at least `min_floor_units`
  (one concurrent request, or one milli-request per minute) when the quota affords it for every
  replica; when it does not (quota units fewer than replicas), the replicas with the most demand
  get `min_floor_units` each, as far as the units go, and when nothing was observed anywhere,
  the observed pods in name order do (so the units sit on pods that exist);
- the rest follows demand: each replica gets `max(its floor, λ · its demand)` with one λ for all
  (water-filling), so replicas whose demand is below their floor keep the floor and the others
  split what is left in proportion to demand; with no demand anywhere, equally per replica;
- when the quota and the replica counts are unchanged since the previous split and some demand
  is observed, shares move from the previous split toward that target: a falling share by
  `smoothing` of its distance (at least one unit), a rising one likewise as far as the units
  freed allow, so one noisy reading does not swing them; any other change (or no demand
  anywhere: nobody to serve) jumps straight to the target.

Arithmetic is exact, in integer units (milli-requests for rates, whole requests for
concurrency); targets round down and the units left over go one per replica to the largest
remainders, so the sum over all replicas never exceeds the quota.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction


@dataclass(frozen=True)
class Slot:
    """One pool's part in a tenant's split: its replica count and the demand observed on it.

    `pods`: the demand observed on each named pod (0.0 for a pod that answered with no demand
    of this tenant); `demand`: the pool's demand when no pod is named, spread evenly over its
    replicas. The two are exclusive."""

    pool: str
    replicas: int
    demand: float = 0.0
    pods: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"slot {self.pool!r}: replicas must be >= 1, got {self.replicas}")
        if not math.isfinite(self.demand) or self.demand < 0:
            raise ValueError(f"slot {self.pool!r}: demand must be a finite number >= 0, got {self.demand}")
        for pod, demand in self.pods.items():
            if not math.isfinite(demand) or demand < 0:
                raise ValueError(f"slot {self.pool!r}: pods[{pod!r}] demand must be a finite number >= 0, got {demand}")
        if len(self.pods) > self.replicas:
            raise ValueError(f"slot {self.pool!r}: {len(self.pods)} pods named but replicas is {self.replicas}")
        if self.pods and self.demand:
            raise ValueError(f"slot {self.pool!r}: give demand per pod (pods) or per pool (demand), not both")

    def total_demand(self) -> float:
        return self.demand + sum(self.pods.values())


@dataclass(frozen=True)
class Coverage:
    """How many of a pool's replicas hold a share that admits a request (at least one unit)."""

    replicas: int
    holding: int
    with_demand: int = 0
    with_demand_holding: int = 0


@dataclass(frozen=True)
class Split:
    """Per-replica shares, in integer `unit`s of the quota (e.g. 1000 = milli-requests).

    `units[pool]` is the share of each replica of the pool not listed in `pods[pool]` (its
    default); `pods[pool]` lists the pods whose share differs from it."""

    quota: int
    unit: int
    replicas: Mapping[str, int]
    units: Mapping[str, int] = field(default_factory=dict)
    pods: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    coverage: Mapping[str, Coverage] = field(default_factory=dict)

    def per_replica(self, pool: str) -> float:
        """The default share of the pool's replicas, in quota units (requests per minute...)."""
        return self.units[pool] / self.unit

    def pod_units(self, pool: str, pod: str) -> int:
        return self.pods.get(pool, {}).get(pod, self.units[pool])

    def total_units(self) -> int:
        """Listed pods' shares plus the default times the pool's replicas not listed."""
        total = 0
        for pool, default in self.units.items():
            listed = self.pods.get(pool, {})
            total += sum(listed.values()) + default * (self.replicas[pool] - len(listed))
        return total

    def short_of_replicas(self) -> bool:
        """Some replica holds no share: the quota is too small to give each one a unit (a quota of
        0 refuses the tenant everywhere, as its spec says, and is not short)."""
        return self.quota > 0 and any(c.holding < c.replicas for c in self.coverage.values())


def floor_units(quota_units: int, replicas: int, floor_fraction: Fraction, min_floor_units: int) -> int:
    """The per-replica floor: a fraction of an equal split, at least `min_floor_units` if affordable."""
    if replicas == 0:
        return 0
    floor = math.floor(floor_fraction * quota_units / replicas)
    if min_floor_units * replicas <= quota_units:
        floor = max(floor, min_floor_units)
    return floor


DEMAND_RESOLUTION = 1000  # demand is weighed in milli-requests per minute (any demand above zero weighs at least one)


def _weight(demand: float) -> int:
    return max(1, round(demand * DEMAND_RESOLUTION)) if demand > 0 else 0


@dataclass(slots=True)
class _Group:
    """Replicas that hold one value: a named pod (size 1), or a pool's other replicas (pod None).

    All arithmetic on integers: a target is `target + remainder / denominator` exactly."""

    pool: str
    pod: str | None
    size: int
    weight: int  # demand per replica, in DEMAND_RESOLUTION units
    base: int = 0  # its floor
    target: int = 0
    remainder: int = 0  # of the exact target, over the split's common denominator

    def key(self) -> tuple[str, str]:
        return (self.pool, self.pod or "")


def _groups(slots: Sequence[Slot], previous: Split | None, separate_idle: bool) -> list[_Group]:
    """Named pods with demand (or listed in the previous split, or every named pod when
    `separate_idle`) are groups of their own; the rest of a pool's replicas share one group."""
    groups: list[_Group] = []
    for slot in slots:
        listed_before = previous.pods.get(slot.pool, {}) if previous is not None else {}
        named = [pod for pod, demand in slot.pods.items() if demand > 0 or separate_idle or pod in listed_before]
        groups += [_Group(slot.pool, pod, 1, _weight(slot.pods[pod])) for pod in sorted(named)]
        rest = slot.replicas - len(named)
        if rest > 0:
            groups.append(_Group(slot.pool, None, rest, _weight(slot.demand / rest) if not slot.pods else 0))
    return groups


def _place_floors(groups: list[_Group], quota_units: int, floor: int, min_floor_units: int) -> None:
    """Every group gets `floor`; when that is below `min_floor_units` (the quota cannot give every
    replica a first request), the groups with most demand get `min_floor_units` while units last,
    and with no demand anywhere the named pods (in name order), then the other replicas."""
    for g in groups:
        g.base = floor
    if floor >= min_floor_units:
        return
    budget = quota_units - floor * sum(g.size for g in groups)
    wanting = sorted((g for g in groups if g.weight), key=lambda g: (-g.weight, g.key()))
    if not wanting:
        wanting = sorted(groups, key=lambda g: (g.pod is None, g.key()))
    for g in wanting:
        cost = (min_floor_units - floor) * g.size
        if cost <= budget:
            g.base, budget = min_floor_units, budget - cost


def _place_targets(groups: list[_Group], quota_units: int) -> None:
    """Exact targets (water-filling over demand, or an equal split of the spare), then integers:
    each rounded down, and the units left go one per replica to the largest remainders."""
    demanding = [g for g in groups if g.weight]
    for g in groups:
        g.target, g.remainder = g.base, 0
    if demanding:
        active = demanding
        while active:
            # level = rest / weight: a group below its floor at this level keeps the floor, and the level is found again.
            rest = quota_units - sum(g.base * g.size for g in groups) + sum(g.base * g.size for g in active)
            weight = sum(g.weight * g.size for g in active)
            kept = [g for g in active if rest * g.weight >= g.base * weight]
            if len(kept) == len(active):
                for g in active:
                    g.target, g.remainder = divmod(rest * g.weight, weight)
                break
            active = kept
    else:
        total = sum(g.size for g in groups)
        extra, remainder = divmod(quota_units - sum(g.base * g.size for g in groups), total)
        for g in groups:
            g.target, g.remainder = g.base + extra, remainder
    left = quota_units - sum(g.target * g.size for g in groups)
    for g in sorted((g for g in groups if g.remainder), key=lambda g: (-g.remainder, -g.weight, g.key())):
        if g.size <= left:
            g.target += 1
            left -= g.size


def _smooth(groups: list[_Group], previous: Split, quota_units: int, smoothing: Fraction) -> dict[int, int]:
    """Each group's value one tick from `previous` toward its target (see the module docstring).

    Falling shares keep `floor((1 - s) · distance)` above their target (so they move at least one
    unit); rising ones are raised to their floor, then toward `target - floor((1 - s) · distance)`
    as far as the units left allow, the largest shortfalls first. Should the floors of rising
    groups not fit beside what the falling ones keep, the falling ones go straight to target."""
    before = {id(g): previous.pod_units(g.pool, g.pod) if g.pod is not None else previous.units[g.pool] for g in groups}
    keep = 1 - smoothing
    num, den = keep.numerator, keep.denominator
    value: dict[int, int] = {}
    for g in groups:
        was = before[id(g)]
        if was > g.target:
            value[id(g)] = g.target + num * (was - g.target) // den
        elif was == g.target:
            value[id(g)] = g.target
        else:
            value[id(g)] = max(was, g.base)
    if sum(value[id(g)] * g.size for g in groups) > quota_units:
        for g in groups:
            if before[id(g)] > g.target:
                value[id(g)] = g.target
    left = quota_units - sum(value[id(g)] * g.size for g in groups)
    rising = sorted((g for g in groups if before[id(g)] < g.target), key=lambda g: (-(g.target - value[id(g)]), g.key()))
    for g in rising:
        want = max(value[id(g)], g.target - num * (g.target - before[id(g)]) // den)
        step = min(want - value[id(g)], left // g.size)
        value[id(g)] += step
        left -= step * g.size
    return value


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
    if min_floor_units < 0:
        raise ValueError(f"min_floor_units must be >= 0, got {min_floor_units}")
    if len({s.pool for s in slots}) != len(slots):
        raise ValueError("each pool may appear once in a split")
    replicas = {s.pool: s.replicas for s in slots}
    if not slots:
        return Split(quota, unit, replicas)
    quota_units = quota * unit
    floor = floor_units(quota_units, sum(replicas.values()), Fraction(floor_fraction), min_floor_units)
    if previous is not None and not (previous.quota == quota and previous.unit == unit and dict(previous.replicas) == replicas
                                     and previous.total_units() <= quota_units):
        previous = None  # any change but demand: straight to the target
    groups = _groups(slots, previous, separate_idle=floor < min_floor_units)
    _place_floors(groups, quota_units, floor, min_floor_units)
    _place_targets(groups, quota_units)
    if previous is not None and any(g.weight for g in groups):
        value = _smooth(groups, previous, quota_units, Fraction(smoothing))
    else:  # no demand anywhere: nobody is being served, so nothing is gained by moving slowly
        value = {id(g): g.target for g in groups}
    return _assemble(quota, unit, replicas, groups, value)


def _assemble(quota: int, unit: int, replicas: dict[str, int], groups: list[_Group], value: dict[int, int]) -> Split:
    units: dict[str, int] = {}
    pods: dict[str, dict[str, int]] = {}
    coverage: dict[str, Coverage] = {}
    for pool in replicas:
        mine = [g for g in groups if g.pool == pool]
        rest = [g for g in mine if g.pod is None]
        # Pods not listed (new ones, scale-out) get the share of the pool's unnamed replicas; when
        # every replica is named, the smallest named share (a pod the split did not count gets the least).
        default = value[id(rest[0])] if rest else min(value[id(g)] for g in mine)
        units[pool] = default
        listed = {g.pod: value[id(g)] for g in mine if g.pod is not None and value[id(g)] != default}
        if listed:
            pods[pool] = dict(sorted(listed.items()))
        coverage[pool] = Coverage(
            replicas=replicas[pool],
            holding=sum(g.size for g in mine if value[id(g)] > 0),
            with_demand=sum(g.size for g in mine if g.weight),
            with_demand_holding=sum(g.size for g in mine if g.weight and value[id(g)] > 0),
        )
    return Split(quota, unit, replicas, units, pods, coverage)
