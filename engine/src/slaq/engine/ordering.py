"""The engine's view of the pod ranking (`slaq.policy.ranking`): which waiting request goes next.

The ranking is computed so that a step costs the same at 100 and at 10,000 waiting requests:
within a tier, requests wait in a heap keyed by the ranking's static `within_tier_key` (fairness
credit refreshed each step for a bounded head, `queue.rekeyHead`); across tiers only the three tier
heads are compared, with the ranking's class order and, between heads of the same class, its
formula 1 at the step's time and load. This module only turns the engine's `RequestInfo` into
the policy's `RequestView` and fixes the step's load; it decides nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from slaq.api.pool import SchedulerSpec
from slaq.engine.sla import TIER_NAMES, RequestInfo
from slaq.policy import PodPolicy
from slaq.policy.ranking import LOWEST_RANK, MISSED_CLASS, STARVING_CLASS, Rank
from slaq.policy.views import PoolView, RequestView

__all__ = ["LOWEST_RANK", "MISSED_CLASS", "STARVING_CLASS", "WaitingOrder"]


@dataclass
class WaitingOrder:
    policy: PodPolicy
    max_length_tokens: int

    def __post_init__(self) -> None:
        self.set_load(0.0)

    @property
    def spec(self) -> SchedulerSpec:
        return self.policy.spec

    def set_load(self, load: float) -> None:
        self.pool = PoolView(load=min(1.0, max(0.0, load)), max_length_tokens=self.max_length_tokens, aging_bound_s=self.spec.aging_bound_seconds)

    def view(self, info: RequestInfo) -> RequestView:
        """The request's view with its tenant's current service share. Every other field is fixed when
        the request arrives, so the view last built is kept on `info` and built again only when the
        share moved: the queue asks for views of its heads several times a step."""
        share = self.policy.accounting.service_share(TIER_NAMES[info.tier_rank], info.tenant)
        view = info.view
        if view is None or view.tenant_service_share != share:
            view = info.view = RequestView(
                tier=info.tier,
                arrival=info.arrival,
                ttft_ms=info.ttft_s * 1000.0 if info.ttft_s is not None else None,
                prompt_tokens=info.prompt_tokens,
                predicted_output=info.predicted_output,
                tenant_service_share=share,
                tenant=info.tenant,
            )
        return view

    def key_tokens(self) -> tuple[int, ...]:
        """Per tier rank, what moves whenever a tenant's service share in the tier may have (the
        views' only field that changes after arrival): the queue refreshes a head's keys only then."""
        version = self.policy.accounting.version
        return tuple([version(name) for name in TIER_NAMES])

    def score(self, info: RequestInfo, now: float) -> float:
        return self.policy.ranking.score(self.view(info), now, self.pool)

    def tier_key(self, info: RequestInfo) -> float:
        return self.policy.ranking.within_tier_key(self.view(info), self.pool.aging_bound_s)

    def rank(self, info: RequestInfo, now: float) -> Rank:
        return self.policy.ranking.rank(self.view(info), now, self.pool)

    def rank_class(self, info: RequestInfo, now: float) -> int:
        return self.policy.ranking.rank_class(self.view(info), now, self.pool)
