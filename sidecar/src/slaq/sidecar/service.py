"""The request lifecycle without HTTP: identify → check → pod guard → quota → queue → enrich → settle.

The HTTP layer (`app.py`) hands bytes and headers in and gets an admitted `Flight` (or a
`SidecarError`) back; it reports the first token and the end of the response. Everything here
runs on one event loop and is tested without sockets.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

from slaq.api.common import Tier
from slaq.api.contract import RequestSLA, enrich_body
from slaq.api.pool import SchedulerSpec
from slaq.policy import PodPolicy
from slaq.policy.discipline import first_token_lead
from slaq.policy.views import PoolView, RequestView
from slaq.sidecar.admission import PodGuard, PodPressure, QuotaGate, Ticket
from slaq.sidecar.errors import BadRequest, ConcurrencyExceeded, Draining, InvalidField, QuotaExceeded, SidecarError, TokenRateExceeded, http_status
from slaq.sidecar.metrics import SidecarMetrics
from slaq.sidecar.payload import BodyLimits, InferencePayload, Kind, ParserPool, parse_payload
from slaq.sidecar.prediction import OutputLengthPredictor
from slaq.sidecar.protected_load import PROTECTED_TIERS, ProtectedLoad
from slaq.sidecar.queue import Dispatcher, QueuedRequest, RequestQueue
from slaq.sidecar.release import ReleaseGate
from slaq.sidecar.quota_store import QuotaStore
from slaq.sidecar.risk import SlaRisk
from slaq.sidecar.shared_quotas import SharedQuotaGate
from slaq.sidecar.tenants import Authenticator, Identity, TenantDirectory
from slaq.sidecar.tokens import EstimatingCounter, PromptBound, PromptCount, PromptCounter
from slaq.sidecar.turns import TenantTurns
from slaq.sidecar.usage import UsageLog

log = logging.getLogger(__name__)

PARSES_PER_TENANT = 2  # a tenant's large bodies in the parsing workers at once
COUNTING_THREADS = 2  # long prompts are counted here, off the event loop (encoded in the counter's encoder processes)
# Prompts admitted on their bound are counted on a thread of their own (they never queue ahead of a
# count someone waits for), a tenant at a time in turn (`TenantTurns`): one tenant's burst of long
# prompts does not hold back the others' settlements.
SETTLING_NICENESS = 10  # and 10 nice levels lower: nobody waits for these counts, so they take no CPU from the request path
# Nor do they start beside the request's own way to its first token: a count starts when the first
# token has been forwarded, or `SETTLE_AFTER_S` after admission if the first token takes longer (a
# request that waits in the queue, or a long prefill, does not keep its bound charged meanwhile).
# Started at admission, a 4k-token prompt's count added 2 ms to its TTFT at p99 on a 2-core machine,
# even in an encoder process (sidecar_latency.py --prompt-tokens 4096 --tokenizer tiny: added p99
# 6.15 ms, 4.12 ms with no count at all; started at the first token, docs/results.md#sidecar-latency-4k-tokenizer).
SETTLE_AFTER_S = 0.05


@dataclass(frozen=True)
class CoreConfig:
    served_model_name: str | None = None
    max_queue_depth: int = 1024
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    trust_gateway_headers: bool = False
    engine_queue_target: int = 16
    handover_target: int | None = None  # the batch tier's bound on the pipe to the engine (release.py, decision 0023); None: none
    max_length_tokens: int = 8192  # prompt + output that scores 0 on the length term
    max_num_seqs: int = 256  # the engine's batch limit, the load's slot count until the engine's own is learned
    limits: BodyLimits = field(default_factory=BodyLimits.default)  # the pool's bounds on a request body
    max_num_batched_tokens: int = 8192  # the engine's step token limit (the first-token lead counts prefill steps of it)


@dataclass(frozen=True, slots=True)
class Settlement:
    """How one admitted request ended, as the access log writes it (no text, no key)."""

    status: int
    prompt_tokens: int
    output_tokens: int | None
    queue_wait_s: float
    e2e_s: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    slo_outcome: str | None = None  # met, ttft_missed, tpot_missed, e2e_missed; None without objectives
    handover_s: float | None = None  # release to the engine → its first response byte
    pipe_ahead: int | None = None  # released requests without a first byte yet at this one's release


@dataclass(frozen=True, slots=True)
class Order:
    """A request checked and counted (or bounded), before its quota is charged."""

    payload: InferencePayload
    view: RequestView
    prompt_tokens: int  # charged: the exact count, or the bound until the count lands
    predicted_output: int
    reserved_tokens: int


@dataclass(slots=True, eq=False)
class Flight:
    """One admitted request, from admission to settlement."""

    key: int
    identity: Identity
    payload: InferencePayload
    ticket: Ticket
    entry: QueuedRequest
    prompt_tokens: int
    predicted_output: int
    arrival: float
    first_token_time: float | None = None
    done: bool = False
    settlement: Settlement | None = None
    counting: asyncio.Future[PromptCount] | None = None  # the exact count, when admitted on the prompt's bound (`prompt_tokens` is that bound until it lands)
    counted: bool = False  # that count has been applied
    count_timer: asyncio.TimerHandle | None = None  # that count not started yet: it starts at the first token or when this fires
    unsettled: tuple[int | None, int] | None = None  # (output tokens, status) of a request that ended before its count landed

    @property
    def tier(self) -> Tier:
        return self.identity.tenant.tier


def _lower_thread_priority() -> None:
    """The calling thread alone `SETTLING_NICENESS` levels nicer (Linux: a thread's id names it to
    setpriority; elsewhere that would lower the whole process, so it is left as it is)."""
    if sys.platform != "linux":
        return
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + SETTLING_NICENESS))
    except OSError as exc:  # a lower priority is always allowed; a sandbox may still refuse the call
        log.info("could not lower the priority of the thread counting admitted prompts: %s", exc)


def engine_priority(tier: Tier) -> int:
    """vLLM polarity (lower runs earlier): the tier rank. The slaq engine scheduler re-ranks from
    `vllm_xargs`; a stock vLLM with `--scheduling-policy priority` still runs tiers in order, FCFS
    (by arrival) within a tier."""
    return tier.rank


class SidecarCore:
    def __init__(
        self,
        config: CoreConfig,
        directory: TenantDirectory,
        *,
        counter: PromptCounter | None = None,
        clock: Callable[[], float] = time.time,
        quota_store: QuotaStore | None = None,
    ) -> None:
        self.config = config
        self.directory = directory
        self.auth = Authenticator(directory, trust_gateway_headers=config.trust_gateway_headers)
        self.counter = counter or EstimatingCounter()
        self.clock = clock
        self.quotas = QuotaGate()
        self.guard = PodGuard()
        self.predictor = OutputLengthPredictor()
        self.policy = PodPolicy.from_spec(config.scheduler)
        self.accounting = self.policy.accounting
        self.risk = SlaRisk()
        self.protected = ProtectedLoad(config.max_num_seqs, now=clock())
        self.usage = UsageLog()
        self.gate = ReleaseGate(engine_queue_target=config.engine_queue_target, handover_target=config.handover_target)
        self.queue = RequestQueue(self.policy.ranking, self.policy.discipline, self._current_view)
        self.queue.tiers.lead = self.first_token_lead
        self.dispatcher = Dispatcher(self.queue, self.gate, self.pool_view, clock)
        self.step_s = 0.0  # the engine's mean step time as the sidecar sees it: its streams' token intervals
        self._intervals_seen = 0
        self.engine_kv_usage: float | None = None
        self.engine_ready = True  # the engine answered its last health check (monitor.EngineMonitor)
        self.draining = False
        self.parsers = ParserPool()  # large bodies are parsed off the event loop
        self._counting: ThreadPoolExecutor | None = None  # and long prompts counted (started on first use)
        self._settling = TenantTurns("slaq-settle-count", initializer=_lower_thread_priority)  # and those admitted on their bound
        self._counts: collections.Counter[str] = collections.Counter()  # per tenant, prompts being counted there
        self._parsing: collections.Counter[str] = collections.Counter()  # per tenant, bodies in the parsing workers
        self._keys = itertools.count()
        self._risk_cache: tuple[float, float] = (-1.0, 0.0)
        self.metrics = SidecarMetrics(depth=lambda: dict(self.queue.depth_by_tier), risk=self.sla_risk, protected_load=self.protected_load,
                                      protected_pending=self.protected_prompts_pending, in_flight=lambda: self.gate.in_flight,
                                      targets=self.attainment_targets, pool=self.pool_name, tokenizer_loaded=lambda: self.counter.loaded)
        # With a store, tenants' whole quotas are counted there and `quotas` (the local shares) is its fallback.
        self.shared_quotas = SharedQuotaGate(self.quotas, quota_store, registry=self.metrics.registry) if quota_store is not None else None

    # pod state -----------------------------------------------------------------------------

    def load(self) -> float:
        """0 idle .. 1 saturated, the pod policy's definition (`slaq.policy.load`): requests released
        and not finished against the engine's batch limit, or its KV cache usage, the fuller."""
        slots = self.gate.engine_capacity or self.config.max_num_seqs
        return self.policy.load(self.gate.in_flight, slots, self.engine_kv_usage)

    def _current_view(self, entry: QueuedRequest) -> RequestView:
        """A queued request as the discipline sees it now: with its tenant's current VTC share, as the engine's view has."""
        view = entry.view
        share = self.accounting.service_share(view.tier.value, view.tenant)
        return view if share == view.tenant_service_share else dataclasses.replace(view, tenant_service_share=share)

    def first_token_lead(self, view: RequestView) -> float:
        """The discipline's lead-time rule at the step time the sidecar observed (0 until it has seen
        `step.stepsBeforeStepTime` token intervals, as the engine counts its timed steps)."""
        if self._intervals_seen < self.config.scheduler.step.steps_before_step_time:
            return 0.0
        return first_token_lead(self.step_s, view.prompt_tokens, self.config.max_num_batched_tokens)

    def _observe_token_interval(self, tpot_s: float, intervals: int) -> None:
        alpha = self.config.scheduler.step.step_time_alpha
        self.step_s = tpot_s if not self._intervals_seen else self.step_s + alpha * (tpot_s - self.step_s)
        self._intervals_seen += intervals

    def pool_view(self) -> PoolView:
        return PoolView(load=self.load(), max_length_tokens=self.config.max_length_tokens, aging_bound_s=self.config.scheduler.aging_bound_seconds)

    def pool_name(self) -> str:
        """The InferencePool's name (the table names it namespace/name), as the pod's pool label has it."""
        return self.directory.index.pool.rpartition("/")[2]

    def sla_risk(self) -> float:
        """The `slaq_sla_risk` gauge: max(observed, projected), see risk.py."""
        return self.risk.value(self.clock())

    def protected_load(self) -> float:
        """The `slaq_protected_load` gauge (the scaling signal), see protected_load.py."""
        # The configured batch limit, not the gate's learned `engine_capacity`: that is the most
        # requests seen running while the engine had a queue, which a prefill backlog at low load
        # sets far below what the pod holds, and the gauge read 1.0 on a quarter-loaded pod.
        return self.protected.value(self.clock(), self.config.max_num_seqs, self.gate.engine_running, self.engine_kv_usage, self.gate.in_flight, self.load(),
                                    engine_ready=self.engine_ready)

    def protected_prompts_pending(self) -> int:
        """The `slaq_protected_prompts_pending` gauge: critical and standard requests on this pod with
        no first token yet, queued here or released to the engine and not started. A gateway's
        queue metric (docs/gateway.md, decision 0029): a pod where one is pending would run a new
        protected prompt after it, and the tightest objectives have room for one prefill, not two."""
        return sum(self.queue.tiers.depth(tier.rank) + self.gate.not_started_by_rank[tier.rank] for tier in PROTECTED_TIERS)

    def current_risk(self) -> float:
        """What shedding acts on: the projected risk of the protected requests waiting now, those
        released to the engine only while the shed tiers hold part of it. Not the observed history:
        when nothing waits, refusing batch work saves nobody (an engine that is slow for the
        objectives is a capacity problem for the HPA, not a reason to refuse work on an idle pod).
        A request held here waits for the pipe to the engine, which batch work in flight takes. A
        released one is in the engine's priority queue ahead of any batch request: refusing batch
        work helps it only while batch work holds slots, KV cache or step time there; with none,
        it waits on its own tiers' work, and a batch request that fits beside is the design
        report's answer (scenario 4.5: C beside A while B waits for the KV cache; decision 0030).
        Cached for 100 ms: it scans the waiting requests."""
        now = self.clock()
        stamp, value = self._risk_cache
        if now - stamp > 0.1 or now < stamp:
            shed_held = any(self.gate.in_flight_by_rank[tier.rank] for tier in self.guard.shed_tiers)
            value = self.risk.projected(now, queued_only=not shed_held)
            self._risk_cache = (now, value)
        return value

    def attainment_targets(self) -> list[tuple[str, str, float]]:
        """(tenant, tier, target) for the tenants whose requests have objectives to meet."""
        return [(t.name, t.tier.value, t.attainment_target) for t in self.directory.index.by_name.values()
                if t.ttft_ms is not None or t.tpot_ms is not None]

    def pressure(self) -> PodPressure:
        return PodPressure(queue_depth=len(self.queue), max_queue_depth=self.config.max_queue_depth, waiting_risk=self.current_risk())

    # lifecycle -----------------------------------------------------------------------------

    def identify(self, headers: Mapping[str, str]) -> Identity:
        try:
            return self.auth.identify(headers)
        except SidecarError as error:
            self.refused(error, None)
            raise

    async def precheck(self, identity: Identity) -> None:
        """What can refuse a request before its body is read (and parsed): draining, the tenant's
        concurrency and request rate. Nothing is charged."""
        try:
            if self.draining:
                raise Draining("sidecar is draining; retry on another replica")
            if self.shared_quotas is not None:
                await self.shared_quotas.precheck(identity.tenant, self.clock())
            else:
                self.quotas.precheck(identity.tenant, self.clock())
        except SidecarError as error:
            self.refused(error, identity)
            raise

    def refused(self, error: SidecarError, identity: Identity | None) -> None:
        tier = identity.tenant.tier.value if identity else "none"
        self.metrics.rejections.labels(error.reason, tier).inc()
        if identity is not None and isinstance(error, QuotaExceeded):
            self.usage.refused(identity.tenant.name, self.clock())
            self.metrics.quota_refusals.labels(identity.tenant.name, tier, error.reason).inc()

    def check_in(self, identity: Identity, kind: Kind, raw: bytes, parsed: InferencePayload | SidecarError | None = None,
                 arrival: float | None = None) -> Flight:
        """Check and charge one request, ready to queue (everything `admit` does before it waits;
        no event loop needed, so the simulator runs it in simulated time). `parsed`: what a parsing
        worker made of `raw` (else it is parsed here); `arrival`: when the request came, if earlier.
        Charges this replica's shares: a sidecar with a quota store checks in through `admit`."""
        now = self.clock()
        arrival = now if arrival is None else arrival  # parsing and token counting are part of the sidecar's latency
        with self._refusals(identity, now):
            order = self._order(identity, kind, raw, parsed, arrival, identity.tenant.max_concurrency)
            ticket = self.quotas.admit(identity.tenant, order.reserved_tokens, now, slots=order.payload.n)
        return self._checked_in(identity, order, ticket, arrival, now)

    async def _check_in_on_bound(self, identity: Identity, kind: Kind, payload: InferencePayload, bound: PromptBound,
                                 arrival: float) -> Flight | None:
        """Check and charge a request at its prompt's bound, counting it exactly meanwhile; None, with
        nothing charged or refused, when its token quota does not admit it at the bound (count it first:
        the exact count may fit). Every other refusal does not depend on the count and stands."""
        now = self.clock()
        quotas = self.shared_quotas
        with self._refusals(identity, now):
            max_slots = quotas.max_slots(identity.tenant) if quotas is not None else identity.tenant.max_concurrency
            order = self._order(identity, kind, b"", payload, arrival, max_slots, bound=bound)
            try:
                if quotas is not None:
                    ticket = await quotas.admit(identity.tenant, order.reserved_tokens, now, slots=payload.n)
                else:
                    ticket = self.quotas.admit(identity.tenant, order.reserved_tokens, now, slots=payload.n)
            except TokenRateExceeded:
                return None
        flight = self._checked_in(identity, order, ticket, arrival, now)
        loop = asyncio.get_running_loop()
        flight.counting = loop.create_future()
        flight.counting.add_done_callback(lambda _: self._counted(flight))
        flight.count_timer = loop.call_later(SETTLE_AFTER_S, self._count, flight)
        return flight

    def _count(self, flight: Flight) -> None:
        """Start counting a prompt admitted on its bound (once): in its tenant's turn, apart from the
        event loop. A request settled meanwhile with the engine's count, or refunded, is not counted."""
        if flight.count_timer is None:
            return
        flight.count_timer.cancel()
        flight.count_timer = None
        counting = flight.counting
        assert counting is not None
        if flight.done and flight.unsettled is None:
            flight.counted = True
            counting.cancel()
            return
        job = asyncio.wrap_future(self._settling.submit(flight.identity.tenant.name, self.counter.measure_apart, flight.payload.kind, flight.payload.body))

        def landed(job: asyncio.Future[PromptCount]) -> None:
            if counting.done():
                return
            if job.cancelled():
                counting.cancel()
            elif job.exception() is not None:
                counting.set_exception(job.exception())  # type: ignore[arg-type]
            else:
                counting.set_result(job.result())

        job.add_done_callback(landed)

    def _counted(self, flight: Flight) -> None:
        """The exact count of a prompt admitted on its bound, landed: the charge comes down (or, were
        the bound ever short, goes up) to it, unless the request was settled without it (the engine's
        own count, or a refund); a request that ended waiting for it is settled now. Once per flight."""
        if flight.counted or flight.counting is None:
            return
        flight.counted = True
        try:
            count = flight.counting.result()
        except (Exception, asyncio.CancelledError) as exc:  # the count never came: the bound stands, against the tenant
            log.warning("counting a prompt admitted on its bound failed (%s: %s); its bound is charged", type(exc).__name__, exc)
            count = PromptCount(flight.prompt_tokens, "tokenizer")
        else:
            self.metrics.prompt_counts.labels(count.method).inc()
        if flight.done and flight.unsettled is None:
            return  # settled already, with the engine's count or a refund
        if count.tokens > flight.prompt_tokens:
            log.warning("a prompt counted %d tokens, over its bound of %d: the tokenizer breaks the bound's assumptions (tokens.py)",
                        count.tokens, flight.prompt_tokens)
        factor = flight.payload.prompt_charge_factor
        reserved = flight.ticket.reserved_tokens + (count.tokens - flight.prompt_tokens) * factor
        (self.shared_quotas or self.quotas).correct(flight.ticket, reserved, self.clock())
        flight.prompt_tokens = count.tokens
        if flight.unsettled is not None:
            output_tokens, status = flight.unsettled
            flight.unsettled = None
            self._charge(flight, output_tokens=output_tokens, engine_prompt_tokens=None, status=status, refund=False, now=self.clock())

    async def _check_in_shared(self, quotas: SharedQuotaGate, identity: Identity, kind: Kind, raw: bytes,
                               parsed: InferencePayload | SidecarError | None, arrival: float) -> Flight:
        """`check_in`, with the tenant's whole quota charged to the shared store."""
        now = self.clock()
        with self._refusals(identity, now):
            order = self._order(identity, kind, raw, parsed, arrival, quotas.max_slots(identity.tenant))
            ticket = await quotas.admit(identity.tenant, order.reserved_tokens, now, slots=order.payload.n)
        return self._checked_in(identity, order, ticket, arrival, now)

    @contextlib.contextmanager
    def _refusals(self, identity: Identity, now: float) -> Iterator[None]:
        try:
            yield
        except SidecarError as error:
            if isinstance(error, (BadRequest, TokenRateExceeded)):
                # A body read, parsed and counted, then refused, still costs a request of the rate:
                # else a tenant makes the pod parse megabytes for free, as often as it likes.
                (self.shared_quotas or self.quotas).charge_refused_body(identity.tenant, now)
            self.refused(error, identity)
            raise

    def _order(self, identity: Identity, kind: Kind, raw: bytes, parsed: InferencePayload | SidecarError | None, arrival: float,
               max_slots: int | None, bound: PromptBound | None = None) -> Order:
        """Parse, count and pass the pod guard; `max_slots`: the most completions one request may run.
        With `bound`, the prompt is not counted: the bound is charged and the estimate orders it."""
        if self.draining:
            raise Draining("sidecar is draining; retry on another replica")
        tenant = identity.tenant
        if isinstance(parsed, SidecarError):
            raise parsed
        payload = parsed or parse_payload(raw, kind, self.config.served_model_name, self.config.limits, tenant.cache_salt)
        if max_slots is not None and payload.n > max_slots:
            raise InvalidField("n", f"this request runs {payload.n} completions (n × prompts); tenant {tenant.name} may run "
                                    f"{max_slots} at once")
        if bound is None:
            counted = payload.prompt_count or self.counter.measure(kind, payload.body)
            self.metrics.prompt_counts.labels(counted.method).inc()
            prompt_tokens = ordering_tokens = counted.tokens
        else:
            # The length term, the first-token lead and the output prediction take the estimate (the
            # bound of an English prompt is ~5x its count); the engine orders on its own exact count.
            prompt_tokens, ordering_tokens = bound.tokens, bound.estimate
        predicted = self.predictor.predict(tenant.name, ordering_tokens, payload.max_tokens)
        view = RequestView(
            tier=tenant.tier,
            arrival=arrival,
            ttft_ms=identity.ttft_ms,
            prompt_tokens=ordering_tokens,
            predicted_output=predicted,
            tenant_service_share=self.accounting.service_share(tenant.tier.value, tenant.name),
            tenant=tenant.name,
        )
        wait_s = self.dispatcher.predicted_wait_s(view)
        self.guard.check(tenant.tier, identity.ttft_ms, wait_s, self.risk.engine_ttft(tenant.tier), self.pressure())
        reserved = prompt_tokens * payload.prompt_charge_factor + payload.n * (payload.max_tokens if payload.max_tokens is not None else predicted)
        return Order(payload, view, prompt_tokens, predicted, reserved)

    def _checked_in(self, identity: Identity, order: Order, ticket: Ticket, arrival: float, now: float) -> Flight:
        tenant = identity.tenant
        self.usage.admitted(tenant.name, now)
        self.protected.admitted(tenant.tier, now)
        flight = Flight(
            key=next(self._keys), identity=identity, payload=order.payload, ticket=ticket, entry=QueuedRequest(view=order.view),
            prompt_tokens=order.prompt_tokens, predicted_output=order.predicted_output, arrival=arrival,
        )
        self.risk.waiting(flight.key, arrival, identity.ttft_ms, flight.entry, tenant.tier)
        return flight

    async def admit(self, identity: Identity, kind: Kind, raw: bytes, arrival: float | None = None) -> Flight:
        """Check, charge and queue one request; returns once it is released to the engine. `arrival`:
        when the request reached the host, if earlier than now (the HTTP layer's stamp, arrival.py)."""
        arrival = self.clock() if arrival is None else min(arrival, self.clock())
        parsed: InferencePayload | SidecarError | None = None
        flight: Flight | None = None
        if not self.draining:
            parsed = await self._parse_off_loop(identity, kind, raw) if self.parsers.wants(raw) else self._parse(identity, kind, raw)
            if isinstance(parsed, InferencePayload) and self.counter.offloads(kind, parsed.body):
                # A long prompt: admitted on its bound when its quotas allow even that (counted meanwhile), else counted first.
                bound = self.counter.bound(kind, parsed.body)
                if bound is not None:
                    flight = await self._check_in_on_bound(identity, kind, parsed, bound, arrival)
                if flight is None:
                    parsed = await self._count_off_loop(identity, kind, parsed)
        if flight is None and self.shared_quotas is not None:
            flight = await self._check_in_shared(self.shared_quotas, identity, kind, raw, parsed, arrival)
        elif flight is None:
            flight = self.check_in(identity, kind, raw, parsed, arrival)
        try:
            await self.dispatcher.wait_turn(flight.entry)
        except asyncio.CancelledError:
            # Gone while queued: the engine never saw it, so nothing is charged.
            self.finish(flight, output_tokens=None, engine_prompt_tokens=None, status=499, refund=True)
            raise
        except SidecarError as error:  # shed from the queue (Dispatcher: expired)
            self.shed(flight, error)
            raise
        self.metrics.queue_wait.labels(flight.tier.value).observe(max(0.0, (flight.entry.release_time or flight.arrival) - flight.arrival))
        return flight

    def _parse(self, identity: Identity, kind: Kind, raw: bytes) -> InferencePayload | SidecarError:
        try:
            return parse_payload(raw, kind, self.config.served_model_name, self.config.limits, identity.tenant.cache_salt)
        except SidecarError as error:
            return error  # refused, and charged for, by check_in like any other

    async def _count_off_loop(self, identity: Identity, kind: Kind, payload: InferencePayload) -> InferencePayload | SidecarError:
        """A long prompt counted in a thread (tokenizing ~100k characters takes tens of milliseconds); at most
        `PARSES_PER_TENANT` of a tenant's at once, so one tenant's burst does not queue ahead of everyone's."""
        name = identity.tenant.name
        if self._counts[name] >= PARSES_PER_TENANT:
            return ConcurrencyExceeded(f"tenant {name} already has {PARSES_PER_TENANT} long prompts being counted", retry_after_s=1.0)
        if self._counting is None:
            self._counting = ThreadPoolExecutor(COUNTING_THREADS, thread_name_prefix="slaq-count")
        self._counts[name] += 1
        try:
            payload.prompt_count = await asyncio.get_running_loop().run_in_executor(self._counting, self.counter.measure_apart, kind, payload.body)
        finally:
            self._counts[name] -= 1
            if not self._counts[name]:
                del self._counts[name]
        return payload

    async def _parse_off_loop(self, identity: Identity, kind: Kind, raw: bytes) -> InferencePayload | SidecarError:
        """A large body, parsed by a worker process; at most `PARSES_PER_TENANT` of a tenant's at once,
        since a body is charged to its tenant's rate only once parsed: a burst of large bodies from one
        tenant would otherwise queue ahead of everyone's in the workers."""
        name = identity.tenant.name
        if self._parsing[name] >= PARSES_PER_TENANT:
            return ConcurrencyExceeded(f"tenant {name} already has {PARSES_PER_TENANT} large bodies being parsed", retry_after_s=1.0)
        self._parsing[name] += 1
        try:
            return await self.parsers.parse(raw, kind, self.config.served_model_name, self.config.limits, identity.tenant.cache_salt)
        except SidecarError as error:
            return error  # refused, and charged for, by check_in like any other
        finally:
            self._parsing[name] -= 1
            if not self._parsing[name]:
                del self._parsing[name]

    def shed(self, flight: Flight, error: SidecarError) -> None:
        """A queued request refused by the queue (shed: it could no longer be served in time). The
        engine never had it, so its token reservation flows back whole, as for a client that left the queue."""
        self.refused(error, flight.identity)
        self.finish(flight, output_tokens=None, engine_prompt_tokens=None, status=http_status(error), refund=True)

    def observe_engine(self, waiting: int | None, running: int | None, kv_usage: float | None, released_before: int | None,
                       waiting_by_rank: Sequence[int] | None = None, released_by_rank_before: Sequence[int] | None = None) -> None:
        """A scrape of the engine's gauges (`monitor.EngineMonitor`, or the simulator's engine):
        feed the release gate and the load, then release what the gate now lets go.
        `released_before` (`released_by_rank_before`): the gate's `released_total` (`released_by_rank`)
        when the scrape was sent; `waiting_by_rank`: the engine's waiting requests per tier rank."""
        self.gate.observe_engine(waiting, released_before, running, waiting_by_rank, released_by_rank_before)
        self.engine_kv_usage = kv_usage
        self.dispatcher.pump()

    def enriched_body(self, flight: Flight, request_id: str | None = None) -> bytes:
        """The body for the engine; `request_id` (the access line's) goes into `vllm_xargs` for the engine's audit line."""
        identity = flight.identity
        sla = RequestSLA(
            tenant=identity.tenant.name,
            tier=identity.tenant.tier,
            ttft_ms=identity.ttft_ms,
            tpot_ms=identity.tpot_ms,
            arrival=flight.arrival,
            predicted_output=flight.predicted_output,
            request_id=request_id,
        )
        payload = flight.payload
        if payload.serialised is None:
            fields = payload.body
        else:  # the rest is already serialised
            fields = {"stream_options": payload.body["stream_options"]} if "stream_options" in payload.body else {}
        body = enrich_body(fields, priority=engine_priority(identity.tenant.tier), cache_salt=identity.tenant.cache_salt, sla=sla)
        if payload.stream:
            # Tokens are settled from the engine's own usage, whatever the stream's shape; the usage
            # chunk goes back only to a client that asked for it (`proxy.client_usage_filter`). Where the engine
            # may produce tokens no chunk shows, it is asked for its count in every chunk.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            if payload.hides_tokens:
                body["stream_options"]["continuous_usage_stats"] = True
        # allow_nan=False: never re-send a non-finite number as `Infinity`/`NaN` (parsing refuses them already).
        encoded = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        if payload.serialised is None:
            return encoded
        # A worker serialised the checked body (without stream_options): the sidecar's fields go in front.
        return encoded[:-1] + b"," + payload.serialised[1:]

    def first_token(self, flight: Flight) -> None:
        now = self.clock()
        flight.first_token_time = now
        release = flight.entry.release_time
        self.risk.started(flight.key, None if release is None else now - release)
        if release is not None and flight.payload.stream and flight.entry.pipe_ahead is not None:
            self.metrics.observe_handover(flight.tier.value, flight.entry.pipe_ahead, max(0.0, now - release))
        self.dispatcher.first_byte(flight.entry)
        if flight.count_timer is not None:
            asyncio.get_running_loop().call_soon(self._count, flight)  # once the first token is on its way to the client

    def finish(self, flight: Flight, *, output_tokens: int | None, engine_prompt_tokens: int | None, status: int, refund: bool = False) -> None:
        """Settle quotas, learn the output length, record latency and SLO outcome. Idempotent.
        `refund`: the engine produced nothing for this request (it refused it, was unreachable, or
        never got it), so its token reservation flows back whole. A request admitted on its prompt's
        bound that ends before the count lands, and without the engine's count, is charged when the
        count lands (its concurrency slot is held until then: milliseconds)."""
        if flight.done:
            return
        flight.done = True
        now = self.clock()
        tenant = flight.identity.tenant
        tier = tenant.tier.value
        started = flight.first_token_time is not None
        self.risk.gone(flight.key)
        self.protected.settled(tenant.tier, now)
        self.dispatcher.finished(flight.entry, started)
        if engine_prompt_tokens is None and not refund and flight.counting is not None and not flight.counted:
            flight.unsettled = (output_tokens, status)
            if flight.counting.done():
                self._counted(flight)  # landed, its callback not run yet: settled now
        else:
            self._charge(flight, output_tokens=output_tokens, engine_prompt_tokens=engine_prompt_tokens, status=status, refund=refund, now=now)
        self._count(flight)  # a count not started yet: started now, or not at all when the engine's count settled it
        prompt = engine_prompt_tokens if engine_prompt_tokens is not None else flight.prompt_tokens
        e2e = now - flight.arrival
        queue_wait = flight.entry.queue_wait_s
        if status >= 400 or output_tokens is None:
            if status != 499:
                self.metrics.requests.labels(tenant.name, tier, str(status)).inc()
            flight.settlement = Settlement(status, prompt, output_tokens, queue_wait, e2e)
            return
        self.metrics.requests.labels(tenant.name, tier, str(status)).inc()
        self.metrics.e2e.labels(tenant.name, tier).observe(e2e)
        ttft = tpot = None
        if flight.payload.stream and flight.first_token_time is not None:
            ttft = flight.first_token_time - flight.arrival
            self.metrics.ttft.labels(tenant.name, tier).observe(ttft)
            if output_tokens > 1:
                tpot = (now - flight.first_token_time) / (output_tokens - 1)
                self.metrics.tpot.labels(tenant.name, tier).observe(tpot)
                self._observe_token_interval(tpot, output_tokens - 1)
        outcome = self._record_outcome(flight, e2e, ttft, tpot, output_tokens, now)
        release = flight.entry.release_time
        handover = None if ttft is None or release is None else max(0.0, flight.first_token_time - release)  # type: ignore[operator]
        flight.settlement = Settlement(status, prompt, output_tokens, queue_wait, e2e, ttft, tpot, outcome, handover, flight.entry.pipe_ahead)

    def _charge(self, flight: Flight, *, output_tokens: int | None, engine_prompt_tokens: int | None, status: int, refund: bool, now: float) -> None:
        """The token side of `finish`: the quota settled, and the same figures to fairness, usage and the counters."""
        tenant = flight.identity.tenant
        tier = tenant.tier.value
        prompt = engine_prompt_tokens if engine_prompt_tokens is not None else flight.prompt_tokens
        prompt_charge = prompt * flight.payload.prompt_charge_factor  # prompt logprobs: a second pass over the prompt
        used = 0 if refund else None if output_tokens is None else prompt_charge + output_tokens
        (self.shared_quotas or self.quotas).settle(flight.ticket, used, now)
        if output_tokens is not None and not refund:
            # The figures the bucket was settled with reach fairness, /slaq/usage and the token counters
            # too, for a stream cut short as for a complete answer.
            self.accounting.charge(tier, tenant.name, prompt_charge + output_tokens)
            self.usage.tokens(tenant.name, prompt_charge + output_tokens, now)
            self.metrics.tokens.labels(tenant.name, tier, "in").inc(prompt)
            self.metrics.tokens.labels(tenant.name, tier, "out").inc(output_tokens)
            if status < 400:
                # Learned by the prompt length it was predicted from (the estimate, for a prompt admitted on its bound).
                self.predictor.observe(tenant.name, flight.entry.view.prompt_tokens, output_tokens // max(1, flight.payload.n))

    def _record_outcome(self, flight: Flight, e2e: float, ttft: float | None, tpot: float | None, output_tokens: int, now: float) -> str | None:
        identity = flight.identity
        if identity.ttft_ms is None and identity.tpot_ms is None:
            return None
        tenant, tier = identity.tenant.name, identity.tenant.tier.value
        if ttft is None:
            # Non-streaming: the whole answer meets both objectives if it arrives by the time a
            # stream meeting them would have delivered its last token.
            budget_ms = (identity.ttft_ms or 0.0) + (identity.tpot_ms or 0.0) * max(0, output_tokens - 1)
            outcome = "met" if e2e * 1000.0 <= budget_ms else "e2e_missed"
            if budget_ms > 0:
                self.risk.finished(now, e2e, None, budget_ms, None)
        else:
            ttft_missed = identity.ttft_ms is not None and ttft * 1000.0 > identity.ttft_ms
            tpot_missed = identity.tpot_ms is not None and tpot is not None and tpot * 1000.0 > identity.tpot_ms
            outcome = "ttft_missed" if ttft_missed else "tpot_missed" if tpot_missed else "met"
            self.risk.finished(now, ttft, tpot, identity.ttft_ms, identity.tpot_ms)
        self.metrics.slo.labels(tenant, tier, outcome).inc()
        self.usage.outcome(tenant, outcome == "met", now)
        return outcome

    def usage_report(self) -> dict:
        index = self.directory.index
        concurrency = {name: self.quotas.in_flight(name) for name in index.by_name if self.quotas.in_flight(name)}
        return self.usage.report(index.pool, index.revision, concurrency, self.clock()).to_wire()
