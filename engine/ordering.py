"""Waiting-queue ordering: which waiting request the engine admits next.

The order is the report's formula 1 (`slaq.scoring`), computed so that a step costs the same at
100 and at 10,000 waiting requests:

- Within a tier, requests wait in a heap whose key is static: the request's deadline (arrival +
  TTFT objective, or arrival + aging bound when it has none) minus a bounded fairness credit.
  Urgency (slack = deadline - now) and aging (now - arrival) are linear in time with the same
  slope for every request, so between two requests of a tier their difference is a constant:
  folding them into the key keeps the heap order correct as time passes, without re-keying.
  Only the tenant fairness credit changes the order over time; it is recomputed each step for
  a bounded head of each tier's heap (`REKEY_HEAD`), and it is bounded (a fraction of the
  request's own objective), so it can delay a request by at most that much: no starvation
  inside a tier.
- Across tiers there are only three candidates, the head of each tier's heap, and they are
  ranked with the full formula 1 of `slaq.scoring` at the current time and load (nonlinear
  urgency, load-adaptive weights), with its starvation rule: a request that has waited longer
  than the aging bound outranks every request that has not.
"""

from __future__ import annotations

from dataclasses import dataclass

from slaq.api.common import Tier
from slaq.api.pool import SchedulerSpec
from slaq.engine.fairness import VirtualTokenCounters
from slaq.engine.sla import RequestInfo
from slaq.scoring import TERMS, PoolView, RequestView, effective_weights

REKEY_HEAD = 4
LOWEST_RANK = len(Tier) - 1  # the lowest tier is kept from starving by aging, not protected here
MISSED_CLASS = 1 + LOWEST_RANK  # after the attainable requests of the protected tiers  # requests per tier whose fairness credit is refreshed each step


@dataclass
class WaitingOrder:
    spec: SchedulerSpec
    fairness: VirtualTokenCounters
    max_length_tokens: int

    def __post_init__(self) -> None:
        self.set_load(0.0)

    def set_load(self, load: float) -> None:
        self._pool = PoolView(load=min(1.0, max(0.0, load)), max_length_tokens=self.max_length_tokens, aging_bound_s=self.spec.aging_bound_seconds)
        # ScoreProfile.score's weighted terms, resolved once per step (the load is fixed within a
        # step): the same terms in the same order, so the sum is the same float.
        self._weighted_terms = tuple((TERMS[name], w) for name, w in effective_weights(self.spec.weights, self._pool.load).items() if w)

    def score(self, info: RequestInfo, now: float) -> float:
        """Formula 1 at this step's load: equal to `ScoreProfile.score` (tests/engine/test_policies.py)."""
        view, pool = self._view(info), self._pool
        return sum(w * term(view, now, pool) for term, w in self._weighted_terms)

    def tier_key(self, info: RequestInfo) -> float:
        """Static heap key within a tier (smaller runs earlier): deadline minus a bounded fairness credit."""
        horizon = info.ttft_s if info.ttft_s is not None else self.spec.aging_bound_seconds
        credit = self.spec.weights.fairness * (1.0 - self.fairness.service_share(info.tier.value, info.tenant))
        return info.deadline - credit * horizon

    def rank(self, info: RequestInfo, now: float) -> tuple[int, float]:
        """Cross-tier rank (smaller runs earlier): starving first; then requests that can still meet
        their TTFT objective, earliest deadline first; then the rest by descending formula-1 score.

        Formula 1 alone lets a lower tier's backlog outrank fresh higher-tier arrivals under a
        sustained overload (its urgency term saturates as the long objective runs out, so a batch
        request 40 s into its 60 s objective outscores a fresh standard one), and every tier then
        misses. Serving the attainable deadlines first (EDF) keeps the promises that can still be
        kept; a request whose deadline has passed gains nothing from going ahead of one that can
        still make it, and is ranked by formula 1 among the others that missed."""
        rank_class = self.rank_class(info, now)
        if 0 < rank_class < MISSED_CLASS:
            return (rank_class, info.deadline)
        return (rank_class, -self.score(info, now))

    def rank_class(self, info: RequestInfo, now: float) -> int:
        """The first element of `rank`, without formula 1: 0 starving (the same test as
        `ScoreProfile.rank_key`), 1 + tier rank for a request that can still meet its TTFT
        objective, MISSED_CLASS for the rest. Classes 1..LOWEST_RANK hold one tier each, so two
        tier heads can only tie in class 0 or MISSED_CLASS, and only a tie needs the score."""
        if now - info.arrival >= self._pool.aging_bound_s:
            return 0
        if info.ttft_s is not None and now < info.deadline and info.tier_rank < LOWEST_RANK:
            return 1 + info.tier_rank
        return MISSED_CLASS

    def _view(self, info: RequestInfo) -> RequestView:
        return RequestView(
            tier=info.tier,
            arrival=info.arrival,
            ttft_ms=info.ttft_s * 1000.0 if info.ttft_s is not None else None,
            prompt_tokens=info.prompt_tokens,
            predicted_output=info.predicted_output,
            tenant_service_share=self.fairness.service_share(info.tier.value, info.tenant),
        )
