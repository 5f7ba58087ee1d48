"""The ranking both queues use: class order first, then the report's formula 1.

    rank = (class, arrival)           for class 0 (starving: the longest waiting first)
         = (class, deadline)          for class 1 .. LOWEST_RANK (attainable, earliest deadline first)
         = (class, -formula 1 score)  for MISSED_CLASS

Classes, smaller first: 0 a request that has waited past the aging bound (starving); 1 + tier
rank a request of a protected tier (every tier but the lowest) that can still meet its TTFT
objective; MISSED_CLASS the rest. Among starving requests the one that arrived first goes first:
by formula 1 a higher tier's starving backlog (a flood of critical requests the batch cannot hold)
outscored a batch request that had waited far longer, for ever. Formula 1 alone lets a lower tier's backlog outrank fresh
higher-tier arrivals under sustained overload (its urgency saturates as the long objective runs
out, so a batch request 40 s into its 60 s objective outscores a fresh standard one), and then
every tier misses: serving the attainable deadlines first keeps the promises that can still be
kept. Formula 1 (`score`):

    score = alpha(load) * urgency + beta(load) * length + w_wait * waiting + w_tier * tier
            + w_fair * fairness
    alpha(load) = w_urgency * (1 + load / 2)     # report: 0.4 + 0.2 * load
    beta(load)  = w_length * (1 - load)          # report: 0.2 * (1 - load)

with the terms of `slaq.policy.terms` and the weights of the pool's `spec.scheduler.weights`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from slaq.api.common import Tier
from slaq.api.pool import SchedulerSpec, ScoreWeights
from slaq.policy.registry import Registry
from slaq.policy.terms import TERMS, Term
from slaq.policy.views import PoolView, RequestView

STARVING_CLASS = 0
LOWEST_RANK = len(Tier) - 1  # the lowest tier is kept from starving by aging, not protected by class
MISSED_CLASS = 1 + LOWEST_RANK

Rank = tuple[int, float]


LOAD_ADAPTED = {"urgency": lambda load: 1.0 + load / 2.0, "length": lambda load: 1.0 - load}  # report: alpha, beta


def effective_weights(weights: ScoreWeights, load: float) -> dict[str, float]:
    """One weight per registered term (`slaq.policy.terms.TERMS`), read from the field of the same
    name in `weights`, after the report's load adaptation (urgency up, length down as load rises).
    A registered term without a weight field is an error, not a term silently left out."""
    load = min(1.0, max(0.0, load))
    result: dict[str, float] = {}
    for name in TERMS:
        weight = getattr(weights, name, None)
        if not isinstance(weight, float):
            raise TypeError(f"term {name!r} is registered in slaq.policy.terms but ScoreWeights has no weight {name!r}")
        if weights.load_adaptive and name in LOAD_ADAPTED:
            weight *= LOAD_ADAPTED[name](load)
        result[name] = weight
    return result


def deadline(request: RequestView, aging_bound_s: float) -> float:
    """Arrival plus the TTFT objective, or plus the aging bound when there is none."""
    return request.arrival + (request.ttft_ms / 1000.0 if request.ttft_ms is not None else aging_bound_s)


@runtime_checkable
class Ranking(Protocol):
    """What the queue discipline asks of a ranking (`from_spec` builds one from the pool's spec)."""

    @classmethod
    def from_spec(cls, spec: SchedulerSpec) -> "Ranking": ...
    def rank_class(self, request: RequestView, now: float, pool: PoolView) -> int: ...
    def rank(self, request: RequestView, now: float, pool: PoolView) -> Rank: ...
    def score(self, request: RequestView, now: float, pool: PoolView) -> float: ...
    def within_tier_key(self, request: RequestView, aging_bound_s: float) -> float: ...


@dataclass
class DeadlineClassRanking:
    """Class order (starving, attainable by tier, missed) with formula 1 inside the classes that need it."""

    weights: ScoreWeights
    _terms_at: tuple[float, tuple[tuple[Term, float], ...]] | None = field(default=None, repr=False)

    @classmethod
    def from_spec(cls, spec: SchedulerSpec) -> "DeadlineClassRanking":
        return cls(spec.weights)

    def _weighted_terms(self, load: float) -> tuple[tuple[Term, float], ...]:
        # Resolved once per load (a step, or a queue snapshot): the same terms in the same order.
        cached = self._terms_at
        if cached is None or cached[0] != load:
            cached = self._terms_at = (load, tuple((TERMS[name], w) for name, w in effective_weights(self.weights, load).items() if w))
        return cached[1]

    def score(self, request: RequestView, now: float, pool: PoolView) -> float:
        """Formula 1: higher runs earlier."""
        return sum(w * term(request, now, pool) for term, w in self._weighted_terms(pool.load))

    def rank_class(self, request: RequestView, now: float, pool: PoolView) -> int:
        if now - request.arrival >= pool.aging_bound_s:
            return STARVING_CLASS
        if request.ttft_ms is not None and request.tier.rank < LOWEST_RANK and now < deadline(request, pool.aging_bound_s):
            return 1 + request.tier.rank
        return MISSED_CLASS

    def rank(self, request: RequestView, now: float, pool: PoolView) -> Rank:
        """Sort ascending: the smallest rank runs first. Two ranks of different classes compare
        by class alone, so a host that knows the classes differ need not compute the score."""
        rank_class = self.rank_class(request, now, pool)
        if rank_class == STARVING_CLASS:
            return (rank_class, request.arrival)
        if rank_class < MISSED_CLASS:
            return (rank_class, deadline(request, pool.aging_bound_s))
        return (rank_class, -self.score(request, now, pool))

    def within_tier_key(self, request: RequestView, aging_bound_s: float) -> float:
        """A static key ordering one tier's requests (smaller first): the deadline less a bounded
        fairness credit. Urgency and aging move at the same rate for every request, so within a
        tier their difference is constant: a heap on this key stays ordered as time passes. The
        credit is at most a fraction (the fairness weight) of the request's own horizon, so it
        delays a request by at most that much: no starvation within a tier."""
        horizon = request.ttft_ms / 1000.0 if request.ttft_ms is not None else aging_bound_s
        credit = self.weights.fairness * (1.0 - request.tenant_service_share)
        return deadline(request, aging_bound_s) - credit * horizon


RANKINGS: Registry[type[DeadlineClassRanking]] = Registry("ranking", Ranking)
RANKINGS.register("deadline-classes", DeadlineClassRanking)
