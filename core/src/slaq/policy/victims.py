"""Which running requests to preempt first for an urgent arrival (a read-only ordering).

`lowest-tier-cheapest`: lowest tier first, then the least computed tokens (cheapest to
recompute), then the latest arrival. Hosts only ever preempt victims of a strictly lower tier
than the request they make room for (`may_preempt_for`), so two requests never preempt each other;
for a request that has missed its TTFT objective, only victims of the lowest tier, which it
outranks in any class (an attainable request of a protected tier, preempted for it, would be
admitted again ahead of it: the preemption would buy nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, TypeVar, runtime_checkable

from slaq.policy.ranking import LOWEST_RANK
from slaq.policy.registry import Registry


class VictimFacts(Protocol):
    """What a victim policy may know about a running request."""

    @property
    def tier_rank(self) -> int: ...
    @property
    def computed_tokens(self) -> int: ...
    @property
    def arrival(self) -> float: ...


V = TypeVar("V", bound=VictimFacts)


@runtime_checkable
class VictimOrder(Protocol):
    """The order in which to preempt running requests (first: preempted first); a permutation of them."""

    def order(self, candidates: Sequence[V]) -> list[V]: ...


@dataclass(frozen=True)
class LowestTierCheapest:
    def order(self, candidates: Sequence[V]) -> list[V]:
        return sorted(candidates, key=lambda c: (-c.tier_rank, c.computed_tokens, -c.arrival))


def may_preempt_for(victim_tier_rank: int, for_tier_rank: int, missed: bool = False) -> bool:
    """Only a strictly lower tier may be preempted for a request; only the lowest for a missed one."""
    return victim_tier_rank > for_tier_rank and (not missed or victim_tier_rank >= LOWEST_RANK)


VICTIMS: Registry[type[VictimOrder]] = Registry("victim order", VictimOrder)
VICTIMS.register("lowest-tier-cheapest", LowestTierCheapest)
