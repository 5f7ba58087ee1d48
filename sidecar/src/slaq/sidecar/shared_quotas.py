"""Exact cluster-wide quotas: admission against a shared store, the local shares as the fallback.

`SharedQuotaGate` offers what `admission.QuotaGate` offers (precheck, admit, settle, the charge
of a refused body), deciding on the tenant's whole quota (`Tenant.cluster_quota`) in the store
(`quota_store.QuotaStore`) instead of this replica's share. Every store call is bounded by the
store timeout and goes through a circuit breaker: a call that fails or times out is decided on
the local shares (QuotaGate, the mode without a store), and after `failure_threshold` failures
in a row the breaker opens and every decision is local at once, until a probe (one call each
`reset_after_s`) finds the store again. So a dead or stalled store costs a request at most one
store timeout, never refuses everything, and never admits more than the local shares would.

Nothing admitted is lost across a fallback: every ticket remembers where it was charged and is
settled there (a settlement the store missed is owed and paid when it answers again); the slots
held here are counted locally whatever admitted them, and a heartbeat writes them to the store,
so when the store returns its concurrency counts are right within one heartbeat.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Awaitable, Callable, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from slaq.api.table import ClusterQuota
from slaq.sidecar.admission import QuotaGate, Ticket
from slaq.sidecar.breaker import BreakerState, CircuitBreaker
from slaq.sidecar.errors import ConcurrencyExceeded, RequestRateExceeded, TokenRateExceeded
from slaq.sidecar.quota_store import Decision, QuotaStore, Verdict
from slaq.sidecar.tenants import Tenant

log = logging.getLogger(__name__)

T = TypeVar("T")
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class _Failed:
    """What `_call` returns when the store did not answer (the caller falls back)."""


FAILED = _Failed()


class StoreMetrics:
    def __init__(self, registry: CollectorRegistry | None, breaker: CircuitBreaker) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.fallbacks = Counter("slaq_quota_store_fallbacks", "Store calls that failed or timed out, or were skipped while the breaker was open, "
                                 "so the local shares decided (by operation).", ["operation"], registry=r)
        self.latency = Histogram("slaq_quota_store_seconds", "Latency of answered quota store calls (by operation).", ["operation"],
                                 buckets=STORE_BUCKETS, registry=r)
        r.register(_StateGauge(breaker))


class _StateGauge(Collector):
    def __init__(self, breaker: CircuitBreaker) -> None:
        self._breaker = breaker

    def collect(self):  # type: ignore[no-untyped-def]
        state = self._breaker.state
        family = GaugeMetricFamily("slaq_quota_store_state", "The quota store's circuit breaker: 1 for its state now (closed: the store decides; "
                                   "open: the local shares decide; half_open: a probe is due or in flight).", labels=["state"])
        for each in BreakerState:
            family.add_metric([each.value], 1.0 if each is state else 0.0)
        yield family
        mode = GaugeMetricFamily("slaq_quota_mode", "Where tenant quotas are decided now: 1 for store (the whole quota, shared) or local (this replica's share).",
                                 labels=["mode"])
        mode.add_metric(["store"], 1.0 if state is BreakerState.CLOSED else 0.0)
        mode.add_metric(["local"], 0.0 if state is BreakerState.CLOSED else 1.0)
        yield mode


def counted_in_store(tenant: Tenant) -> bool:
    """Whether the store has anything to count for `tenant`: a table entry with its whole quota
    (tables of earlier operators have none; then its share decides) that limits something."""
    quota = tenant.cluster_quota
    return quota is not None and (quota.requests_per_minute is not None or quota.tokens_per_minute is not None or quota.max_concurrency is not None)


class SharedQuotaGate:
    def __init__(self, local: QuotaGate, store: QuotaStore, *, registry: CollectorRegistry | None = None) -> None:
        self.local = local
        self.store = store
        self.breaker = CircuitBreaker(failure_threshold=store.settings.failures_to_open, reset_after_s=store.settings.probe_after_s)
        self.metrics = StoreMetrics(registry, self.breaker)
        self.timeout_s = store.settings.timeout_s
        self.heartbeat_s = store.settings.lease_s / 3.0
        # Slots not yet in `local.in_flight` but possibly in the store: reservations sent and not
        # answered, releases sent and not acknowledged. A heartbeat counts them (errs high, never low).
        self._reserving: collections.Counter[str] = collections.Counter()
        self._releasing: collections.Counter[str] = collections.Counter()
        self._tenants: set[str] = set()  # tenants whose slots the store may hold for this sidecar
        self._owed: dict[str, tuple[ClusterQuota, int, float]] = {}  # tenant → (quota, requests, token delta) the store missed
        self._tasks: set[asyncio.Task] = set()
        self._last_beat = float("-inf")

    # admission ---------------------------------------------------------------------------

    def max_slots(self, tenant: Tenant) -> int | None:
        """The most completions one request of `tenant` may run: its whole concurrency quota."""
        if counted_in_store(tenant):
            return tenant.cluster_quota.max_concurrency  # type: ignore[union-attr]
        return tenant.max_concurrency

    async def precheck(self, tenant: Tenant, now: float, slots: int = 1) -> None:
        """As QuotaGate.precheck (concurrency and request rate, nothing charged), on the whole quota."""
        if not counted_in_store(tenant):
            self.local.precheck(tenant, now, slots)
            return
        quota = tenant.cluster_quota
        assert quota is not None
        decision = await self._call("precheck", lambda: self.store.reserve(tenant.name, quota, 0, slots, charge=False))
        if isinstance(decision, _Failed):
            self.local.precheck(tenant, now, slots)
            return
        _raise_refusal(tenant, quota, decision, 0, slots)

    async def admit(self, tenant: Tenant, tokens: int, now: float, slots: int = 1) -> Ticket:
        """As QuotaGate.admit, on the whole quota; on the local share when the store does not answer."""
        if not counted_in_store(tenant):
            return self.local.admit(tenant, tokens, now, slots)
        quota = tenant.cluster_quota
        assert quota is not None
        name = tenant.name
        self._tenants.add(name)
        self._reserving[name] += slots
        try:
            decision = await self._call("reserve", lambda: self.store.reserve(name, quota, tokens, slots))
        finally:
            self._reserving[name] -= slots
            if not self._reserving[name]:
                del self._reserving[name]
        if isinstance(decision, _Failed):
            return self.local.admit(tenant, tokens, now, slots)
        _raise_refusal(tenant, quota, decision, tokens, slots)
        return self.local.hold(tenant, tokens, now, slots)

    def charge_refused_body(self, tenant: Tenant, now: float) -> None:
        if not counted_in_store(tenant):
            self.local.charge_refused_body(tenant, now)
            return
        quota = tenant.cluster_quota
        assert quota is not None
        self._spawn(self._settle_in_store(tenant.name, quota, requests=1, token_delta=0, slots=0))

    def settle(self, ticket: Ticket, used_tokens: int | None, now: float) -> None:
        """As QuotaGate.settle; a ticket charged to the store is settled there (in the background:
        `finish` is synchronous), one charged locally (a fallback) here."""
        if ticket.settled:
            return
        self.local.settle(ticket, used_tokens, now)
        if not ticket.in_store:
            return
        quota = ticket.tenant.cluster_quota
        assert quota is not None
        name = ticket.tenant.name
        delta = 0 if used_tokens is None else ticket.reserved_tokens - used_tokens
        self._releasing[name] += ticket.slots
        self._spawn(self._settle_in_store(name, quota, requests=0, token_delta=delta, slots=ticket.slots))

    def correct(self, ticket: Ticket, reserved_tokens: int, now: float) -> None:
        """As QuotaGate.correct; for a ticket charged to the store, the difference is settled there
        (in the background, owed if the store does not answer)."""
        if ticket.settled or not ticket.in_store:
            self.local.correct(ticket, reserved_tokens, now)
            return
        quota = ticket.tenant.cluster_quota
        assert quota is not None
        delta = ticket.reserved_tokens - reserved_tokens
        ticket.reserved_tokens = reserved_tokens
        self._spawn(self._settle_in_store(ticket.tenant.name, quota, requests=0, token_delta=delta, slots=0))

    def in_flight(self, tenant_name: str) -> int:
        return self.local.in_flight(tenant_name)

    # store calls ---------------------------------------------------------------------------

    async def _call(self, operation: str, call: Callable[[], Awaitable[T]]) -> T | _Failed:
        """One store call, bounded by the store timeout and guarded by the breaker."""
        if not self.breaker.allow():
            self.metrics.fallbacks.labels(operation).inc()
            return FAILED
        started = time.perf_counter()
        was = self.breaker.state
        try:
            async with asyncio.timeout(self.timeout_s):
                value = await call()
        except (RedisError, OSError, TimeoutError) as error:
            self.breaker.failed()
            self.metrics.fallbacks.labels(operation).inc()
            if self.breaker.state is not BreakerState.CLOSED and was is BreakerState.CLOSED:
                log.warning("quota store unreachable (%s: %s); deciding on this replica's shares until it answers",
                            type(error).__name__, error)
            return FAILED
        except BaseException:  # cancelled (the client went away): no outcome, and a probe's place freed
            self.breaker.abandoned()
            raise
        self.metrics.latency.labels(operation).observe(time.perf_counter() - started)
        if was is not BreakerState.CLOSED:
            log.info("quota store answers again; deciding on the whole quotas")
        self.breaker.succeeded()
        return value

    async def _settle_in_store(self, name: str, quota: ClusterQuota, *, requests: int, token_delta: float, slots: int) -> None:
        try:
            done = await self._call("settle", lambda: self.store.settle(name, quota, requests=requests, token_delta=token_delta, slots=slots))
        finally:
            if slots:
                self._releasing[name] -= slots
                if not self._releasing[name]:
                    del self._releasing[name]
        if isinstance(done, _Failed) and (requests or token_delta):
            # The slots heal by heartbeat; the charge or refund is owed, paid when the store answers.
            _, owed_requests, owed_delta = self._owed.get(name, (quota, 0, 0.0))
            self._owed[name] = (quota, owed_requests + requests, owed_delta + token_delta)

    def held_here(self, name: str) -> int:
        """Slots of `name` this sidecar may hold in the store (see `_reserving`)."""
        return self.local.in_flight(name) + self._reserving[name] + self._releasing[name]

    async def beat(self) -> bool:
        """Write this sidecar's slots per tenant (renewing its leases) and pay what is owed;
        False when the store did not answer."""
        self._last_beat = time.monotonic()
        for name in list(self._tenants):
            slots = self.held_here(name)
            if isinstance(await self._call("heartbeat", lambda: self.store.heartbeat(name, slots)), _Failed):
                return False
            if slots == 0 and not self.held_here(name):
                self._tenants.discard(name)
        for name in list(self._owed):
            quota, requests, delta = self._owed.pop(name)
            await self._settle_in_store(name, quota, requests=requests, token_delta=delta, slots=0)
        return True

    async def run(self) -> None:
        """Heartbeats every lease/3, and a probe of an open breaker every `reset_after_s`: the
        store's return is noticed without waiting for a request, and counts are rewritten at once."""
        tick = min(self.heartbeat_s, self.breaker.reset_after_s)
        while True:
            if self.breaker.state is BreakerState.HALF_OPEN:
                if not isinstance(await self._call("probe", self.store.ping), _Failed):
                    await self.beat()
            elif self.breaker.state is BreakerState.CLOSED and time.monotonic() - self._last_beat >= self.heartbeat_s:
                await self.beat()
            await asyncio.sleep(tick)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the settlements in flight (tests; shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        """Settle what is in flight, hand this sidecar's slots back (so a graceful stop does not wait
        for leases to run out), close the client."""
        await self.drain()
        if self.breaker.state is BreakerState.CLOSED:
            for name in list(self._tenants):
                await self._call("heartbeat", lambda: self.store.heartbeat(name, 0))
        await self.store.aclose()


def _raise_refusal(tenant: Tenant, quota: ClusterQuota, decision: Decision, tokens: int, slots: int) -> None:
    retry = 60.0 if decision.retry_after_s is None else decision.retry_after_s
    if decision.verdict is Verdict.CONCURRENCY:
        raise ConcurrencyExceeded(f"tenant {tenant.name} already has {decision.detail} completions in flight across the cluster; "
                                  f"this request runs {slots} (limit {quota.max_concurrency})", retry_after_s=retry)
    if decision.verdict is Verdict.REQUEST_RATE:
        raise RequestRateExceeded(f"tenant {tenant.name} exceeded {quota.requests_per_minute:g} requests/min across the cluster",
                                  retry_after_s=retry)
    if decision.verdict is Verdict.TOKEN_RATE:
        raise TokenRateExceeded(f"tenant {tenant.name} exceeded {quota.tokens_per_minute:g} tokens/min across the cluster "
                                f"(this request reserves {tokens})", retry_after_s=retry)
