"""Read-only views the policies see: a queued request and the pool it waits in (hot path: plain dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass

from slaq.api.common import Tier


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a policy may know about a waiting request."""

    tier: Tier
    arrival: float  # seconds, time.time() clock
    ttft_ms: float | None  # TTFT objective; None: no latency promise
    prompt_tokens: int
    predicted_output: int
    tenant_service_share: float = 0.0  # share of its tier's counted service this tenant received, in [0, 1]
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class PoolView:
    """What a policy may know about the pool."""

    load: float  # 0 idle .. 1 saturated (values above 1 are clipped), see slaq.policy.load
    max_length_tokens: int  # prompt + output length that scores 0 on the length term
    aging_bound_s: float  # waiting this long makes the waiting term 1 and the request "starving"
