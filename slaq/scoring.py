"""The dynamic priority score of the design report (formula 1), as small composable terms.

    score = alpha(load) * urgency + beta(load) * length + w_wait * waiting + w_tier * tier
            + w_fair * fairness
    alpha(load) = w_urgency * (1 + load / 2)     # report: 0.4 + 0.2 * load
    beta(load)  = w_length * (1 - load)          # report: 0.2 * (1 - load)

Each term is a pure function of a read-only request view, the clock and the pool's state, and
returns a value in [0, 1]; a higher score runs earlier. The weights come from the pool's
`spec.scheduler.weights`. Starvation is bounded separately from the weighted sum: a request that
has waited longer than the aging bound outranks every request that has not (`rank_key`).

Both the sidecar queue and the engine scheduler rank with these terms; TERMS is the registry a
shared contract test runs over, so a new term is tested the day it is added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from slaq.api.common import Tier
from slaq.api.pool import ScoreWeights

TIER_VALUE: Mapping[Tier, float] = {Tier.CRITICAL: 1.0, Tier.STANDARD: 0.5, Tier.BATCH: 0.0}


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a scoring term may know about a queued request."""

    tier: Tier
    arrival: float  # seconds, time.time() clock
    ttft_ms: float | None  # TTFT objective; None: no latency promise
    prompt_tokens: int
    predicted_output: int
    tenant_service_share: float = 0.0  # share of its tier's recent service this tenant received, in [0, 1]


@dataclass(frozen=True, slots=True)
class PoolView:
    """What a scoring term may know about the pool."""

    load: float  # 0 idle .. 1 saturated (values above 1 are clipped)
    max_length_tokens: int  # prompt + output length that scores 0 on the length term
    aging_bound_s: float  # waiting this long makes the waiting term 1 and the request "starving"


Term = Callable[[RequestView, float, PoolView], float]


def urgency(request: RequestView, now: float, pool: PoolView) -> float:
    """1 / (1 + slack / objective): 0.5 on arrival, 1 once the TTFT deadline has passed."""
    if request.ttft_ms is None:
        return 0.0
    objective_s = request.ttft_ms / 1000.0
    slack_s = max(0.0, request.arrival + objective_s - now)
    return 1.0 / (1.0 + slack_s / objective_s)


def waiting(request: RequestView, now: float, pool: PoolView) -> float:
    """Aging: grows linearly with waiting time and saturates at the aging bound."""
    return min(1.0, max(0.0, now - request.arrival) / pool.aging_bound_s)


def length(request: RequestView, now: float, pool: PoolView) -> float:
    """Shorter requests (prompt plus predicted output) score higher."""
    total = request.prompt_tokens + request.predicted_output
    return 1.0 - min(1.0, total / max(1, pool.max_length_tokens))


def tier(request: RequestView, now: float, pool: PoolView) -> float:
    return TIER_VALUE[request.tier]


def fairness(request: RequestView, now: float, pool: PoolView) -> float:
    """Within a tier, tenants that received less service recently score higher (VTC-style)."""
    return 1.0 - min(1.0, max(0.0, request.tenant_service_share))


TERMS: Mapping[str, Term] = {
    "urgency": urgency,
    "waiting": waiting,
    "length": length,
    "tier": tier,
    "fairness": fairness,
}


def effective_weights(weights: ScoreWeights, load: float) -> dict[str, float]:
    """The weights after the report's load adaptation (urgency up, length down as load rises)."""
    load = min(1.0, max(0.0, load))
    urgency_w, length_w = weights.urgency, weights.length
    if weights.load_adaptive:
        urgency_w, length_w = urgency_w * (1.0 + load / 2.0), length_w * (1.0 - load)
    return {"urgency": urgency_w, "waiting": weights.waiting, "length": length_w, "tier": weights.tier, "fairness": weights.fairness}


@dataclass(frozen=True)
class ScoreProfile:
    """A weighted sum of registered terms."""

    weights: ScoreWeights

    def score(self, request: RequestView, now: float, pool: PoolView) -> float:
        return sum(w * TERMS[name](request, now, pool) for name, w in effective_weights(self.weights, pool.load).items() if w)

    def rank_key(self, request: RequestView, now: float, pool: PoolView) -> tuple[int, float]:
        """Sort ascending: starving requests first, then by descending score."""
        starving = now - request.arrival >= pool.aging_bound_s
        return (0 if starving else 1, -self.score(request, now, pool))
