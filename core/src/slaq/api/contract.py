"""The request-enrichment contract between whoever admits a request and the engine's scheduler.

The sidecar (or a benchmark, or a simulator) strips client-sent `priority`, `cache_salt` and
`vllm_xargs`, then sets them itself: `priority` in vLLM's polarity (lower runs earlier), a
per-tenant secret `cache_salt`, and `vllm_xargs` with the keys below. vLLM hands `vllm_xargs` to
the scheduler as `request.sampling_params.extra_args`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from slaq.api.common import Tier

CLIENT_FIELDS_STRIPPED = ("priority", "cache_salt", "vllm_xargs")

XARG_TENANT = "slaq_tenant"
XARG_TIER = "slaq_tier"
XARG_TTFT_MS = "slaq_ttft_ms"
XARG_TPOT_MS = "slaq_tpot_ms"
XARG_ARRIVAL = "slaq_arrival"
XARG_PREDICTED_OUTPUT = "slaq_predicted_output"
XARG_REQUEST_ID = "slaq_request_id"  # the sidecar's request id, which the engine's audit line carries (engine/src/slaq/engine/request_log.py)
XARG_KEYS = (XARG_TENANT, XARG_TIER, XARG_TTFT_MS, XARG_TPOT_MS, XARG_ARRIVAL, XARG_PREDICTED_OUTPUT, XARG_REQUEST_ID)
REQUEST_ID_MAX_CHARS = 128

DEFAULT_TENANT = "anonymous"


@dataclass(frozen=True, slots=True)
class RequestSLA:
    """SLA facts about one request, as the engine's scheduler sees them (hot path: a plain dataclass),
    and the admitting side's id for it, so the engine's audit line joins the sidecar's."""

    tenant: str = DEFAULT_TENANT
    tier: Tier = Tier.STANDARD
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    arrival: float | None = None
    predicted_output: int | None = None
    request_id: str | None = None

    def to_xargs(self) -> dict[str, Any]:
        """Absent facts are left out: vLLM 0.32's server answers 400 to a null value in `vllm_xargs`."""
        xargs = {
            XARG_TENANT: self.tenant,
            XARG_TIER: self.tier.value,
            XARG_TTFT_MS: self.ttft_ms,
            XARG_TPOT_MS: self.tpot_ms,
            XARG_ARRIVAL: self.arrival,
            XARG_PREDICTED_OUTPUT: self.predicted_output,
            XARG_REQUEST_ID: self.request_id,
        }
        return {key: value for key, value in xargs.items() if value is not None}

    @classmethod
    def from_extra_args(cls, extra: Mapping[str, Any] | None) -> "RequestSLA":
        """Lenient parse: a request without the keys (or with malformed ones) is `standard` with no objectives."""
        if not extra:
            return cls()
        try:
            tier = Tier(extra.get(XARG_TIER, Tier.STANDARD.value))
        except ValueError:
            tier = Tier.STANDARD
        return cls(
            tenant=str(extra.get(XARG_TENANT) or DEFAULT_TENANT),
            tier=tier,
            ttft_ms=_positive(extra.get(XARG_TTFT_MS)),
            tpot_ms=_positive(extra.get(XARG_TPOT_MS)),
            arrival=_finite(extra.get(XARG_ARRIVAL)),
            predicted_output=_count(extra.get(XARG_PREDICTED_OUTPUT)),
            request_id=_identifier(extra.get(XARG_REQUEST_ID)),
        )


def _identifier(value: Any) -> str | None:
    """A printable string of at most REQUEST_ID_MAX_CHARS characters, else None (it goes into log lines)."""
    if not isinstance(value, str) or not value or len(value) > REQUEST_ID_MAX_CHARS or not value.isprintable():
        return None
    return value


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _positive(value: Any) -> float | None:
    number = _finite(value)
    return number if number is not None and number > 0 else None


def _count(value: Any) -> int | None:
    number = _finite(value)
    return int(number) if number is not None and number >= 0 else None


def enrich_body(body: dict[str, Any], *, priority: int, cache_salt: str, sla: RequestSLA) -> dict[str, Any]:
    """A copy of a client's request body with the client's scheduling fields replaced by ours."""
    enriched = {k: v for k, v in body.items() if k not in CLIENT_FIELDS_STRIPPED}
    enriched["priority"] = priority
    enriched["cache_salt"] = cache_salt
    enriched["vllm_xargs"] = sla.to_xargs()
    return enriched
