"""What the scheduler keeps about each request it has seen (hot path: plain dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass

from slaq.api.common import Tier
from slaq.api.contract import RequestSLA
from slaq.engine.request_log import RequestFacts
from slaq.policy.views import RequestView

TIER_NAMES = tuple(tier.value for tier in Tier)  # indexed by tier rank (`Tier.value` is a slower property)


@dataclass(slots=True)
class RequestInfo:
    """SLA facts of one request, read once from its `extra_args`, plus the scheduler's bookkeeping."""

    tier: Tier
    tier_rank: int  # 0 is the most important tier
    tenant: str
    arrival: float  # time.time() clock
    ttft_s: float | None
    tpot_s: float | None
    deadline: float  # arrival + TTFT objective, or arrival + aging bound when there is none
    prompt_tokens: int
    predicted_output: int
    # Output tokens the scheduler plans for (`output_plan.OutputBound`): max_tokens, or the sidecar's
    # prediction raised to its error bound when the client set no max_tokens.
    planned_output: int = 0
    sidecar_prediction: int | None = None  # the sidecar's `slaq_predicted_output`, as sent
    # Output length at which the request counts as having made progress since it was last
    # preempted; before that it may not be preempted again (no thrashing).
    protected_until_output: int = 0
    preemptions: int = 0
    held_back_steps: int = 0  # consecutive steps its prefill sat out for an urgent arrival
    pace_anchor: tuple[float, int, int] | None = None  # (time, tokens delivered, preemptions): see tpot_budget.PaceClock
    facts: RequestFacts | None = None  # its audit line's facts while it is in the engine; None with the log off
    view: RequestView | None = None  # the policies' view of it, as last built (`WaitingOrder.view`)


def request_info(sla: RequestSLA, *, arrival: float, prompt_tokens: int, max_tokens: int, aging_bound_s: float) -> RequestInfo:
    arrival = sla.arrival if sla.arrival is not None else arrival
    ttft_s = sla.ttft_ms / 1000.0 if sla.ttft_ms is not None else None
    return RequestInfo(
        tier=sla.tier,
        tier_rank=sla.tier.rank,
        tenant=sla.tenant,
        arrival=arrival,
        ttft_s=ttft_s,
        tpot_s=sla.tpot_ms / 1000.0 if sla.tpot_ms is not None else None,
        deadline=arrival + (ttft_s if ttft_s is not None else aging_bound_s),
        prompt_tokens=prompt_tokens,
        predicted_output=sla.predicted_output if sla.predicted_output is not None else max_tokens,
        planned_output=max_tokens,
        sidecar_prediction=sla.predicted_output,
    )
