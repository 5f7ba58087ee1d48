"""One pod of a simulated pool: its own engine scheduler and step-time model, behind the real
sidecar core for slaq pods (`slaq.bench.pod`) or alone for stock vLLM pods, on the pool's clock.

The engine loop is `slaq.bench.simulator.Simulator.run`'s, cut into events so that one clock can
drive many pods: `pump()` schedules steps while fewer than two are in flight (vLLM's batch queue
with async scheduling) and `fire()` runs whatever the pod has due next (a step's end, a sidecar
retry or engine scrape). The request bookkeeping (`_release`, `_step_work`, `_deliver`) is the
single-pod simulator's own, on a `Simulator` instance that never runs its loop.

A pod's life: starting (Pending for `pending_s`, then Running but not Ready while the engine
loads the model), ready (the router sends it requests), draining (scaled down: no new requests;
what it holds runs to the end, or is lost when the drain timeout passes), gone; or failed at any
time (everything it held is lost).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from slaq.api.common import Tier
from slaq.api.table import TenantTable
from slaq.bench import engine_harness as harness
from slaq.bench.clock import SimClock
from slaq.bench.kv_swap import SwapAccount, transfer_config
from slaq.bench.policies import PolicySpec
from slaq.bench.pod import RETRIED_STATUSES, PodConfig, PodFront
from slaq.bench.pool_profile import PoolProfile
from slaq.bench.runner import _configured
from slaq.bench.simulator import BATCH_QUEUE_SIZE, RequestRecord, Simulator, _InFlight
from slaq.bench.stepcost import StepCostModel
from slaq.bench.workload import BenchRequest, TierObjectives
from slaq.sidecar.errors import SidecarError, http_status

# (the request, when the client sends it again) for a refusal the client retries.
Retry = Callable[[BenchRequest, float], None]


class PoolFront(PodFront):
    """The pod's sidecar core, where a refusal the client retries (429/503 with a Retry-After)
    goes back through the pool's router after the delay, as a client's retry through a Service
    does, instead of to this pod. `retries` is the pool's count per request."""

    def __init__(self, *args: Any, retry: Retry, retries: dict[str, int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retries = retries
        self._retry = retry

    def _refused(self, request: BenchRequest, error: SidecarError) -> None:
        status, tried = http_status(error), self.retries.get(request.request_id, 0)
        if status in RETRIED_STATUSES and error.retry_after_s is not None and tried < self.config.client_retries:
            self.retries[request.request_id] = tried + 1
            self._retry(request, self.clock.now + error.retry_after_s)
        else:
            super()._refused(request, error)


class PodState(str, enum.Enum):
    PENDING = "pending"  # not yet Running: scheduled, pulling, starting containers
    LOADING = "loading"  # Running, not Ready: the engine loads the model (the sidecar already serves /metrics)
    READY = "ready"
    DRAINING = "draining"
    GONE = "gone"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class PodMetrics:
    """What the pod exports on /metrics at one scrape (None: the series is absent)."""

    at_s: float
    sla_risk: float | None  # slaq_sla_risk (the sidecar; stock pods have none)
    waiting: int | None  # requests waiting: vllm:num_requests_waiting, plus the sidecar's queue on slaq pods
    kv_usage: float | None  # vllm:kv_cache_usage_perc
    running: int | None
    protected_load: float | None = None  # slaq_protected_load (the sidecar; stock pods have none)
    protected_pending: int | None = None  # slaq_protected_prompts_pending (the sidecar; stock pods have none)


class ClusterPod:
    def __init__(self, name: str, spec: PolicySpec, profile: PoolProfile, objectives: dict[Tier, TierObjectives],
                 table: TenantTable | None, clock: SimClock, *, pod: PodConfig, created_s: float, pending_s: float,
                 loading_s: float, on_done: Callable[[RequestRecord], None], retry: Retry, retries: dict[str, int],
                 kv_swap: bool = True) -> None:
        self.name = name
        self.clock = clock
        self.created_s = created_s
        self.loaded_at_s = created_s + pending_s
        self.ready_at_s = created_s + pending_s + loading_s
        self.ended_s: float | None = None
        self.drain_deadline_s = float("inf")
        self.state = PodState.PENDING if pending_s > 0 else (PodState.LOADING if loading_s > 0 else PodState.READY)
        self._on_done = on_done
        self._retry = retry
        cost = StepCostModel(profile)
        scheduler_cls = spec.load()
        front = None
        if spec.behind_sidecar and table is not None:
            scheduler_cls = _configured(scheduler_cls, pod)
            front = PoolFront(pod, table, clock, max_num_seqs=profile.engine.max_num_seqs, max_model_len=profile.model.max_model_len,
                              max_num_batched_tokens=profile.engine.max_num_batched_tokens, retry=self._retry_elsewhere, retries=retries)
            front.next_scrape_s = self.ready_at_s
        connector = transfer_config(profile) if kv_swap and spec.ships_kv_connector else None
        self.scheduler = harness.build_scheduler(scheduler_cls, harness.engine_setup(profile, spec.scheduling_policy, kv_transfer_config=connector))
        swap = SwapAccount.install(self.scheduler, cost) if connector else None
        self.front = front
        self.sim = Simulator(self.scheduler, cost, [], objectives, policy_name=spec.name, clock=clock, front=front, swap=swap)
        if front is not None:
            front.connect(self._released, self.sim._refused)
        self.cost, self.swap = cost, swap
        self._inflight: deque[_InFlight] = deque()
        self._gpu_free_at = 0.0
        self._empty_spins = 0
        self._stalled = False
        self.busy_s = 0.0
        self.steps = 0
        self.held: dict[str, RequestRecord] = {}  # dispatched here, not yet finished or refused
        self.metrics: PodMetrics | None = None  # the last scrape

    # -- life cycle ---------------------------------------------------------------------------

    def advance_state(self, now: float) -> None:
        if self.state is PodState.PENDING and now >= self.loaded_at_s:
            self.state = PodState.LOADING
        if self.state is PodState.LOADING and now >= self.ready_at_s:
            self.state = PodState.READY

    @property
    def alive(self) -> bool:
        return self.state not in (PodState.GONE, PodState.FAILED)

    def drain(self, now: float, timeout_s: float) -> None:
        """Scaled down: the router stops sending (the endpoint goes); what is held runs to the end."""
        if self.state in (PodState.PENDING, PodState.LOADING):
            self._end(now, PodState.GONE)
            return
        self.state = PodState.DRAINING
        self.drain_deadline_s = now + timeout_s
        self._maybe_gone(now)

    def fail(self, now: float) -> list[RequestRecord]:
        """The pod dies: what it held is lost (returned)."""
        lost = list(self.held.values())
        self._end(now, PodState.FAILED)
        return lost

    def _end(self, now: float, state: PodState) -> None:
        self.state = state
        self.ended_s = now
        self._inflight.clear()
        self.held.clear()

    def _maybe_gone(self, now: float) -> bool:
        if self.state is PodState.DRAINING and not self.held and not self._inflight:
            self._end(now, PodState.GONE)
            return True
        return False

    def expire_drain(self, now: float) -> list[RequestRecord]:
        """The drain timeout passed with requests still held: the pod stops and they are lost."""
        lost = list(self.held.values())
        self._end(now, PodState.GONE)
        return lost

    def gpu_seconds(self, until_s: float) -> float:
        """Time this pod held its GPUs (from creation, cold start included, to its end)."""
        end = self.ended_s if self.ended_s is not None else until_s
        return max(0.0, end - self.created_s)

    # -- requests -----------------------------------------------------------------------------

    def dispatch(self, request: BenchRequest, record: RequestRecord) -> None:
        """The router sent `request` here now."""
        self.sim.records[request.request_id] = record
        self.held[request.request_id] = record
        self._stalled = False
        if self.front is not None:
            self.front.arrive(request)
        else:
            with self.clock.installed():
                self.sim._admit(request)
        self.pump()

    def _released(self, request_id: str, body: dict[str, Any]) -> None:
        self.sim._release(request_id, body)
        self._stalled = False

    def _retry_elsewhere(self, request: BenchRequest, at_s: float) -> None:
        self.held.pop(request.request_id, None)
        self._retry(request, at_s)

    def _settle(self, request_id: str) -> None:
        record = self.held.pop(request_id, None)
        if record is not None:
            self._on_done(record)

    # -- the engine loop, as events -----------------------------------------------------------

    def next_event_s(self) -> float:
        if not self.alive or self.state is PodState.PENDING:
            return float("inf")
        due = self._inflight[-1].end_s if self._inflight else float("inf")
        if self.front is not None:
            due = min(due, self.front.next_event_s())
        if self.state is PodState.DRAINING:
            due = min(due, self.drain_deadline_s)
        return due

    def fire(self) -> None:
        """Run what is due now (the clock is at `next_event_s()`)."""
        now = self.clock.now
        if self._inflight and self._inflight[-1].end_s <= now:
            self._complete()
            self.pump()
            return
        if self.front is not None and self.front.next_event_s() <= now:
            self.front.fire(lambda: harness.engine_gauges(self.scheduler))
            self._note_refusals()
            if self._maybe_gone(now):
                return
            if not self._inflight:
                self._stalled = False
                self.pump()

    def _note_refusals(self) -> None:
        for request_id in [r for r, rec in self.held.items() if rec.refused_status is not None]:
            self._settle(request_id)

    def pump(self) -> None:
        """Schedule steps while the batch queue has room, as the single-pod loop's top does."""
        if not self.alive or self.state in (PodState.PENDING, PodState.LOADING) or self._stalled:
            self._note_refusals()
            return
        self._note_refusals()
        if self._inflight and len(self._inflight) >= BATCH_QUEUE_SIZE:
            return
        scheduler, clock = self.scheduler, self.clock
        while scheduler.has_requests() and len(self._inflight) < BATCH_QUEUE_SIZE:
            with clock.installed():
                output = scheduler.schedule()
            load, sampled = self.sim._step_work(output)
            seconds = self.cost.seconds(load)
            if self.swap is not None:
                seconds += self.swap.charge(output, self.sim.records, seconds)
            start = max(clock.now, self._gpu_free_at)
            self._gpu_free_at = start + seconds
            self.busy_s += seconds
            self.steps += seconds > 0
            self._inflight.appendleft(_InFlight(self._gpu_free_at, output, sampled))
            executed = harness.step_has_tokens(output)
            if not (len(self._inflight) < BATCH_QUEUE_SIZE and (executed or scheduler.has_requests())):
                break

    def _complete(self) -> None:
        step = self._inflight.pop()
        req_ids = harness.scheduled_ids(step.output)
        with self.clock.installed():
            engine_outputs = self.scheduler.update_from_output(step.output, harness.model_runner_output(req_ids, step.sampled))
        self.sim._deliver(engine_outputs)
        for request_id, _tokens, finished in harness.deliveries(engine_outputs):
            if finished:
                self._settle(request_id)
        if not req_ids and not any(harness.step_has_tokens(s.output) for s in self._inflight):
            self._empty_spins += 1
            if self._empty_spins > 2 * BATCH_QUEUE_SIZE:
                self._stalled, self._empty_spins = True, 0  # wait for the pod's next event
        else:
            self._empty_spins = 0
        self._maybe_gone(self.clock.now)

    # -- what the pod exports -----------------------------------------------------------------

    def scrape(self) -> PodMetrics | None:
        """The pod's /metrics now (None: nothing answers: pending, gone or failed). While the engine
        loads, only the sidecar answers (slaq_sla_risk of an idle pod); vLLM's series are absent."""
        now = self.clock.now
        if self.state in (PodState.PENDING, PodState.GONE, PodState.FAILED):
            return None
        core = None if self.front is None else self.front.core
        risk, protected, pending = (None, None, None) if core is None else (core.sla_risk(), core.protected_load(), core.protected_prompts_pending())
        if self.state is PodState.LOADING:
            self.metrics = PodMetrics(now, risk, None, None, None, protected, pending)
            return self.metrics
        waiting, running, kv_usage, _ = harness.engine_gauges(self.scheduler)
        if self.front is not None:
            waiting += self.front.holding()
        self.metrics = PodMetrics(now, risk, waiting, kv_usage, running, protected, pending)
        return self.metrics

    def finalize(self) -> None:
        for req_id, request in self.sim._vllm_requests.items():
            record = self.sim.records.get(req_id)
            if record is not None:
                record.preemptions = harness.preemptions(request)

