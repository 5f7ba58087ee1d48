"""SLO capacity: the highest load at which a policy still keeps the promises.

A load meets the SLO when every tier with a target attains it (by default critical >= 0.99 and
standard >= 0.95, the issue's definition). The search runs the policy at loads that bracket the
boundary and then bisects it down to `resolution`: start at `start`; while it meets, step up by
`growth`x; while it fails, step down by the same factor; then bisect between the highest load that
met and the lowest that failed, over the loads that are multiples of `resolution` (1.9, 2.0, 2.1 at
0.1; not the midpoints 1.969 or 2.0625), until none is left between them. The capacity is then a
load that was run and met, at most `resolution` below the lowest that failed. Attainment is assumed to fall with load (it does on these traces;
every probe is kept in the result, so a non-monotone case shows). A policy that fails even at
`floor` has an SLO capacity of 0; one that meets at `ceiling` reports the ceiling, marked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

from slaq.api.common import Tier

DEFAULT_TARGETS: Mapping[Tier, float] = {Tier.CRITICAL: 0.99, Tier.STANDARD: 0.95}

Probe = Callable[[float], Mapping[str, float]]  # load -> attainment by tier name


@dataclass
class SloCapacity:
    capacity: float  # the highest load found to meet every target (0: none did)
    bounded: bool  # False: it met at the ceiling, the capacity is at least that
    probes: list[dict] = field(default_factory=list)  # {"load", "meets", tier: attainment}, in the order run

    def describe(self) -> dict:
        return {"slo_capacity": round(self.capacity, 4), "bounded": self.bounded, "probes": self.probes}


def meets(attainment: Mapping[str, float], targets: Mapping[Tier, float]) -> bool:
    return all(attainment.get(tier.value, 0.0) >= target for tier, target in targets.items())


def search(probe: Probe, targets: Mapping[Tier, float] = DEFAULT_TARGETS, *, start: float = 1.0, growth: float = 1.5,
           resolution: float = 0.1, floor: float = 0.1, ceiling: float = 6.0) -> SloCapacity:
    if not (0 < floor <= start <= ceiling) or growth <= 1.0 or resolution <= 0:
        raise ValueError(f"need 0 < floor <= start <= ceiling, growth > 1 and resolution > 0 (got {floor}, {start}, {ceiling}, {growth}, {resolution})")
    result = SloCapacity(0.0, True)
    seen: dict[float, bool] = {}

    def run(load: float) -> bool:
        load = round(load, 4)
        if load not in seen:
            attainment = probe(load)
            seen[load] = meets(attainment, targets)
            result.probes.append({"load": load, "meets": seen[load], **{k: round(v, 4) for k, v in attainment.items()}})
        return seen[load]

    good, bad = None, None
    load = start
    if run(load):
        good = load
        while bad is None:
            if load >= ceiling:
                result.capacity, result.bounded = ceiling, False
                return result
            load = min(ceiling, load * growth)
            if run(load):
                good = load
            else:
                bad = load
    else:
        bad = load
        while good is None:
            if load <= floor:
                return result  # fails even at the floor: capacity 0
            load = max(floor, load / growth)
            if run(load):
                good = load
            else:
                bad = load
    # Grid indices strictly between the two: an open interval longer than `resolution` holds one,
    # so when none is left, bad - good <= resolution.
    low, high = math.floor(good / resolution + 1e-9) + 1, math.ceil(bad / resolution - 1e-9) - 1
    while low <= high:
        index = (low + high) // 2
        if run(index * resolution):
            good, low = index * resolution, index + 1
        else:
            bad, high = index * resolution, index - 1
    result.capacity = round(good, 4)
    return result
