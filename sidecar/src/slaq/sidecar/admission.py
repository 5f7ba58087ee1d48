"""Admission: per-tenant quotas (token buckets, concurrency) and pod-level guards (shedding, deadlines).

Tenant quotas come from the tenant table's per-replica share. Tokens are charged up front as
prompt tokens plus the output reserved (max_tokens, or the predicted output when the client set
none) and settled when the request ends: the unused reservation flows back, an overrun is
charged. A bucket holds one minute's worth (the burst a per-minute quota allows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from slaq.api.common import Tier
from slaq.sidecar.errors import (
    ConcurrencyExceeded,
    DeadlineUnreachable,
    QueueFull,
    RequestRateExceeded,
    Shedding,
    TokenRateExceeded,
)
from slaq.sidecar.tenants import Tenant


class TokenBucket:
    """Refills at `per_minute / 60` per second up to `per_minute`; may go into debt when settled."""

    __slots__ = ("per_minute", "level", "stamp")

    def __init__(self, per_minute: float, now: float) -> None:
        self.per_minute = per_minute
        self.level = per_minute
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.per_minute, self.level + (now - self.stamp) * self.per_minute / 60.0)
            self.stamp = now

    def retry_after(self, cost: float, now: float) -> float | None:
        """Seconds until `cost` fits, 0 when it fits now, None when it never can (a zero quota).

        A request larger than the whole bucket needs a full bucket, so large requests are slowed
        down, never locked out.
        """
        if self.per_minute <= 0:
            return None
        self._refill(now)
        need = min(cost, self.per_minute)
        if self.level >= need:
            return 0.0
        return (need - self.level) * 60.0 / self.per_minute

    def take(self, cost: float, now: float) -> None:
        self._refill(now)
        self.level -= cost

    def give(self, amount: float, now: float) -> None:
        self._refill(now)
        self.level = min(self.per_minute, self.level + amount)

    def reconfigure(self, per_minute: float, now: float) -> None:
        """A new share from the tenant table. The sidecar learns it at the tenant's next request,
        so the new rate refills the time since the previous one (refilling it at the old rate
        would refuse a tenant whose quota was just raised)."""
        self.per_minute = per_minute
        self._refill(now)
        self.level = min(self.level, per_minute)


@dataclass(slots=True)
class TenantQuotaState:
    requests: TokenBucket | None
    tokens: TokenBucket | None
    in_flight: int = 0


@dataclass(slots=True)
class Ticket:
    """What an admitted request holds until it is settled."""

    tenant: Tenant
    reserved_tokens: int
    slots: int = 1  # concurrency slots held: the completions the engine runs (`n` × prompts)
    settled: bool = False
    in_store: bool = False  # charged to the shared store (shared_quotas.py), not to this replica's buckets


def _bucket(state_bucket: TokenBucket | None, per_minute: float | None, now: float) -> TokenBucket | None:
    if per_minute is None:
        return None
    if state_bucket is None:
        return TokenBucket(per_minute, now)
    if state_bucket.per_minute != per_minute:
        state_bucket.reconfigure(per_minute, now)
    return state_bucket


class QuotaGate:
    """Per-tenant request-rate, token-rate and concurrency limits on this replica."""

    def __init__(self) -> None:
        self._states: dict[str, TenantQuotaState] = {}

    def _state(self, tenant: Tenant, now: float) -> TenantQuotaState:
        state = self._states.get(tenant.name)
        if state is None:
            state = TenantQuotaState(_bucket(None, tenant.requests_per_minute, now), _bucket(None, tenant.tokens_per_minute, now))
            self._states[tenant.name] = state
        else:
            # The table may have changed this tenant's share since its last request.
            state.requests = _bucket(state.requests, tenant.requests_per_minute, now)
            state.tokens = _bucket(state.tokens, tenant.tokens_per_minute, now)
        return state

    def precheck(self, tenant: Tenant, now: float, slots: int = 1) -> TenantQuotaState:
        """Refuse a tenant at its concurrency or request-rate limit; charges nothing, so the HTTP
        layer runs it before reading the body."""
        state = self._state(tenant, now)
        if tenant.max_concurrency is not None and state.in_flight + slots > tenant.max_concurrency:
            raise ConcurrencyExceeded(
                f"tenant {tenant.name} already has {state.in_flight} completions in flight; this request runs {slots} "
                f"(limit {tenant.max_concurrency})",
                retry_after_s=1.0,
            )
        if state.requests is not None:
            wait = state.requests.retry_after(1, now)
            if wait != 0.0:
                raise RequestRateExceeded(
                    f"tenant {tenant.name} exceeded {state.requests.per_minute:g} requests/min on this replica",
                    retry_after_s=60.0 if wait is None else wait,
                )
        return state

    def admit(self, tenant: Tenant, tokens: int, now: float, slots: int = 1) -> Ticket:
        """Charge one request of `slots` completions and `tokens` to the tenant, or raise a
        QuotaExceeded naming the limit."""
        state = self.precheck(tenant, now, slots)
        if state.tokens is not None:
            wait = state.tokens.retry_after(tokens, now)
            if wait != 0.0:
                raise TokenRateExceeded(
                    f"tenant {tenant.name} exceeded {state.tokens.per_minute:g} tokens/min on this replica "
                    f"(this request reserves {tokens})",
                    retry_after_s=60.0 if wait is None else wait,
                )
            state.tokens.take(tokens, now)
        if state.requests is not None:
            state.requests.take(1, now)
        state.in_flight += slots
        return Ticket(tenant=tenant, reserved_tokens=tokens, slots=slots)

    def hold(self, tenant: Tenant, tokens: int, now: float, slots: int = 1) -> Ticket:
        """A request admitted against the shared store: counted in flight here (so a fallback to
        the local shares sees it), charged to no bucket here."""
        self._state(tenant, now).in_flight += slots
        return Ticket(tenant=tenant, reserved_tokens=tokens, slots=slots, in_store=True)

    def charge_refused_body(self, tenant: Tenant, now: float) -> None:
        """A body read and refused (malformed, a field outside the allowlist) costs one request of the
        tenant's rate, so a tenant cannot make the pod parse refused bodies for free."""
        state = self._state(tenant, now)
        if state.requests is not None:
            state.requests.take(1, now)

    def settle(self, ticket: Ticket, used_tokens: int | None, now: float) -> None:
        """End of a request: release its concurrency slot and true up its token charge.

        `used_tokens` None means unknown (e.g. the client went away mid-stream before usage was
        seen): the reservation stands, which errs against the tenant rather than the pod. 0 refunds
        it all (the engine refused or never saw the request).
        """
        if ticket.settled:
            return
        ticket.settled = True
        state = self._states.get(ticket.tenant.name)
        if state is None:
            return
        state.in_flight = max(0, state.in_flight - ticket.slots)
        if state.tokens is not None and used_tokens is not None and not ticket.in_store:
            delta = ticket.reserved_tokens - used_tokens
            if delta >= 0:
                state.tokens.give(delta, now)
            else:
                state.tokens.take(-delta, now)

    def correct(self, ticket: Ticket, reserved_tokens: int, now: float) -> None:
        """The reservation of a request still in flight, recomputed (its prompt, admitted on a bound,
        now counted): the difference flows back to the bucket, or is charged. Settling later starts
        from the corrected reservation, so nothing is charged twice."""
        if ticket.settled:
            return
        delta = ticket.reserved_tokens - reserved_tokens
        ticket.reserved_tokens = reserved_tokens
        state = self._states.get(ticket.tenant.name)
        if state is None or state.tokens is None or ticket.in_store:
            return
        if delta >= 0:
            state.tokens.give(delta, now)
        else:
            state.tokens.take(-delta, now)

    def in_flight(self, tenant_name: str) -> int:
        state = self._states.get(tenant_name)
        return state.in_flight if state else 0


@dataclass(frozen=True, slots=True)
class PodPressure:
    """What the pod-level guard needs to know about the pod right now."""

    queue_depth: int
    max_queue_depth: int
    waiting_risk: float  # the projected SLA risk of protected requests waiting now (`SidecarCore.current_risk`)


@dataclass
class PodGuard:
    """Pod-level refusals, decided before any tenant quota is charged.

    - Shedding: the batch tier is refused while the pod is saturated (queue filled beyond
      `shed_queue_fraction`, or the projected SLA risk of waiting requests at or above `shed_risk`: `SidecarCore.current_risk`),
      so the capacity goes to tiers with promises.
    - Queue full: nobody is queued beyond `max_queue_depth`.
    - Deadline: a request whose TTFT objective is shorter than the wait predicted for it is
      refused now rather than served late (a gateway can retry it elsewhere).
    """

    shed_queue_fraction: float = 0.5
    shed_risk: float = 1.0
    shed_tiers: frozenset[Tier] = field(default_factory=lambda: frozenset({Tier.BATCH}))

    def saturated(self, pressure: PodPressure) -> bool:
        return pressure.queue_depth >= self.shed_queue_fraction * pressure.max_queue_depth or pressure.waiting_risk >= self.shed_risk

    def check(self, tier: Tier, ttft_ms: float | None, queue_wait_s: float, engine_ttft_s: float, pressure: PodPressure) -> None:
        """`queue_wait_s`: the wait predicted in this queue; `engine_ttft_s`: the engine's recent
        release-to-first-token time."""
        predicted_ttft_s = queue_wait_s + engine_ttft_s if queue_wait_s > 0 else 0.0
        if tier in self.shed_tiers and self.saturated(pressure):
            raise Shedding(
                f"pod saturated (queue {pressure.queue_depth}/{pressure.max_queue_depth}, waiting SLA risk {pressure.waiting_risk:.2f}); "
                f"{tier.value} tier is shed",
                retry_after_s=max(1.0, predicted_ttft_s),
            )
        if pressure.queue_depth >= pressure.max_queue_depth:
            raise QueueFull(f"queue full ({pressure.max_queue_depth} requests)", retry_after_s=max(1.0, predicted_ttft_s))
        # Only the queue ahead is grounds for refusal: when the engine alone is slower than the
        # objective, no replica of this pool does better and refusing would turn misses into an outage.
        if (
            ttft_ms is not None
            and queue_wait_s > 0
            and engine_ttft_s * 1000.0 < ttft_ms
            and math.isfinite(predicted_ttft_s)
            and predicted_ttft_s * 1000.0 > ttft_ms
        ):
            raise DeadlineUnreachable(
                f"predicted time to first token {predicted_ttft_s * 1000:.0f} ms (queue {queue_wait_s * 1000:.0f} ms + "
                f"engine {engine_ttft_s * 1000:.0f} ms) exceeds the {ttft_ms:g} ms objective",
                retry_after_s=max(1.0, predicted_ttft_s),
            )
