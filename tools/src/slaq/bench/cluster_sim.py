"""A pool of simulated pods behind a router, scaled by a controller, on one simulated clock.

Events, in time order (ties: pod state changes, pod events, arrivals, the Prometheus scrape,
the controller's sync, a pod failure): each arrival goes to the router, which picks among the
ready pods; each pod runs its own engine loop and sidecar (`cluster_pod`); every 15 s Prometheus
scrapes every pod that answers, and the controller syncs (offset by half a scrape, so it reads
the scrape before it) and sets the replica count. The "Deployment" then creates pods (each ready
after the cold start) or removes them as a ReplicaSet picks: pods not yet ready first, then the
newest. A removed pod drains (the router stops sending; what it holds finishes, or is lost at
the pool's drain timeout). A failed pod loses what it held and is replaced at once.

GPU time counts each pod from its creation (cold start included) to its end.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from slaq.api.common import Tier
from slaq.bench.clock import SimClock
from slaq.bench.cluster_hpa import SYNC_PERIOD_S, PodPhase
from slaq.bench.cluster_pod import ClusterPod, PodState
from slaq.bench.cluster_router import Router
from slaq.bench.cluster_signals import PROMETHEUS_SCRAPE_S, PodView, Prometheus
from slaq.bench.pod import PodConfig, tenant_table
from slaq.bench.policies import PolicySpec
from slaq.bench.pool_profile import PoolProfile
from slaq.bench.simulator import RequestRecord
from slaq.bench.workload import BenchRequest, TierObjectives

# Cold start of a replica (see tools/src/slaq/bench/README.md, "Cold start"): Pending while a node with free
# GPUs takes it and the (cached) image starts, then Running-not-Ready while vLLM loads the weights
# and captures CUDA graphs.
DEFAULT_PENDING_S = 30.0
DEFAULT_LOADING_S = 120.0


@dataclass(frozen=True)
class ClusterOptions:
    spec: PolicySpec
    profile: PoolProfile
    pod: PodConfig = field(default_factory=PodConfig)
    pending_s: float = DEFAULT_PENDING_S
    loading_s: float = DEFAULT_LOADING_S
    drain_timeout_s: float = 120.0
    fail_at_s: float | None = None
    max_drain_s: float = 1800.0
    timeline_s: float = SYNC_PERIOD_S
    kv_swap: bool = True
    gpus_per_pod: int = 2  # TP=2: GPU-hours count both


@dataclass
class ClusterResult:
    records: list[RequestRecord]
    pods: list[dict[str, Any]]
    scale_events: list[dict[str, Any]]
    timeline: list[dict[str, Any]]
    lost: dict[str, str]  # request id -> why (failed pod, drain timeout, no ready pod)
    gpu_seconds: float
    end_s: float
    stop_reason: str
    failure: dict[str, Any] | None = None


class Signal(Protocol):
    """What sets the replica count (cluster_signals): every sync, from the pods and their metrics."""

    name: str

    @property
    def initial_replicas(self) -> int: ...

    def sync(self, now: float, current: int, pods: Sequence[PodView], prometheus: Prometheus) -> int: ...


class ClusterSimulator:
    def __init__(self, requests: Sequence[BenchRequest], objectives: dict[Tier, TierObjectives], signal: Signal, router: Router,
                 options: ClusterOptions, *, progress: Callable[[int, int], None] | None = None) -> None:
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        self.objectives = objectives
        self.signal = signal
        self.router = router
        self.options = options
        self.progress = progress
        self.clock = SimClock()
        self.table = tenant_table(self.requests, objectives, options.pod.quotas) if options.spec.behind_sidecar else None
        self.records = {r.request_id: RequestRecord(r.request_id, r.tenant, r.tier, r.arrival_s, r.prompt_tokens, r.output_tokens)
                        for r in self.requests}
        self.pods: list[ClusterPod] = []
        self.routed_to: dict[str, str] = {}  # request id -> the pod that has it now
        self.routes: dict[str, list[str]] = {}  # request id -> every pod it was sent to (client retries go through the router)
        self.prometheus = Prometheus()
        self.scale_events: list[dict[str, Any]] = []
        self.lost: dict[str, str] = {}
        self.timeline: list[dict[str, Any]] = []
        self.settled = 0
        self._serial = 0
        self.failure: dict[str, Any] | None = None
        self.retries: dict[str, int] = {}  # request id -> refusals the client retried
        self._retry_heap: list[tuple[float, int, BenchRequest]] = []
        self._retry_seq = itertools.count()

    # -- pods ---------------------------------------------------------------------------------

    def _on_done(self, record: RequestRecord) -> None:
        self.settled += 1
        pod = self._pod_by_name.get(self.routed_to.get(record.request_id, ""))
        if pod is not None:
            self.router.finished(pod)

    def _new_pod(self, now: float, *, warm: bool = False) -> ClusterPod:
        o = self.options
        self._serial += 1
        pod = ClusterPod(f"pod-{self._serial}", o.spec, o.profile, self.objectives, self.table, self.clock, pod=o.pod, created_s=now,
                         pending_s=0.0 if warm else o.pending_s, loading_s=0.0 if warm else o.loading_s, on_done=self._on_done,
                         retry=self._retry, retries=self.retries, kv_swap=o.kv_swap)
        self.pods.append(pod)
        self._pod_by_name[pod.name] = pod
        return pod

    def _members(self) -> list[ClusterPod]:
        """The scale target's pods (not being deleted, not failed): status.replicas."""
        return [p for p in self.pods if p.state in (PodState.PENDING, PodState.LOADING, PodState.READY)]

    def _views(self) -> list[PodView]:
        views = []
        for pod in self.pods:
            phase = {PodState.PENDING: PodPhase.PENDING, PodState.LOADING: PodPhase.RUNNING, PodState.READY: PodPhase.RUNNING,
                     PodState.DRAINING: PodPhase.DELETING}.get(pod.state)
            if phase is not None:
                views.append(PodView(pod.name, phase, pod.state is PodState.READY))
        return views

    def _scale_to(self, now: float, desired: int) -> None:
        members = self._members()
        current = len(members)
        if desired > current:
            for _ in range(desired - current):
                self._new_pod(now)
        elif desired < current:
            # A ReplicaSet deletes pods not yet ready first, then the newest.
            order = {id(p): i for i, p in enumerate(self.pods)}
            victims = sorted(members, key=lambda p: (p.state is PodState.READY, -p.created_s, -order[id(p)]))[: current - desired]
            for pod in victims:
                pod.drain(now, self.options.drain_timeout_s)
        if desired != current:
            self.scale_events.append({"at_s": round(now, 3), "from": current, "to": desired})

    def _retry(self, request: BenchRequest, at_s: float) -> None:
        pod = self._pod_by_name.get(self.routed_to.get(request.request_id, ""))
        if pod is not None:
            self.router.finished(pod)
        heapq.heappush(self._retry_heap, (at_s, next(self._retry_seq), request))

    def _lose(self, records: Sequence[RequestRecord], why: str) -> None:
        for record in records:
            if record.request_id not in self.lost and not record.finished:
                self.lost[record.request_id] = why
                self.settled += 1

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> ClusterResult:
        o = self.options
        self._pod_by_name: dict[str, ClusterPod] = {}
        for _ in range(self.signal.initial_replicas):
            self._new_pod(0.0, warm=True)
        pending = deque(self.requests)
        total = len(self.requests)
        next_scrape, next_sync, next_sample = 0.0, SYNC_PERIOD_S / 2, 0.0
        fail_at = o.fail_at_s if o.fail_at_s is not None else math.inf
        deadline = (self.requests[-1].arrival_s if self.requests else 0.0) + o.max_drain_s
        stop_reason = "all requests finished"
        clock = self.clock
        progress_mark = 0
        while True:
            if not pending and not self._retry_heap and self.settled >= total:
                break
            pod_due, due_pod = math.inf, None
            for pod in self.pods:
                if pod.alive:
                    t = pod.next_event_s()
                    if pod.state in (PodState.PENDING, PodState.LOADING):
                        t = min(t, pod.loaded_at_s if pod.state is PodState.PENDING else pod.ready_at_s)
                    if t < pod_due:
                        pod_due, due_pod = t, pod
            arrival = pending[0].arrival_s if pending else math.inf
            retry = self._retry_heap[0][0] if self._retry_heap else math.inf
            now = min(pod_due, arrival, retry, next_scrape, next_sync, fail_at, next_sample)
            if now > deadline:
                stop_reason = f"stopped {o.max_drain_s:.0f} s of simulated time after the last arrival"
                break
            clock.advance_to(max(clock.now, now))
            now = clock.now
            if pod_due <= now and due_pod is not None:
                self._pod_event(due_pod, now)
            elif arrival <= now:
                self._arrive(pending.popleft(), now)
            elif retry <= now:
                self._arrive(heapq.heappop(self._retry_heap)[2], now)
            elif next_sample <= now:
                self._sample(now)
                next_sample += o.timeline_s
            elif next_scrape <= now:
                for pod in self.pods:
                    if pod.alive:
                        self.prometheus.record(pod.name, pod.scrape(), now)
                next_scrape += PROMETHEUS_SCRAPE_S
            elif next_sync <= now:
                members = self._members()
                desired = self.signal.sync(now, len(members), self._views(), self.prometheus)
                self._scale_to(now, desired)
                next_sync += SYNC_PERIOD_S
            elif fail_at <= now:
                self._fail(now)
                fail_at = math.inf
            if self.progress is not None and self.settled - progress_mark >= 50:
                progress_mark = self.settled
                self.progress(self.settled, total)
        for pod in self.pods:
            pod.finalize()
        for request_id, retries in self.retries.items():
            self.records[request_id].client_retries = retries
        end = clock.now
        gpu = sum(p.gpu_seconds(end) for p in self.pods) * o.gpus_per_pod
        return ClusterResult(
            records=list(self.records.values()),
            pods=[{"name": p.name, "created_s": round(p.created_s, 3), "ready_s": round(p.ready_at_s, 3),
                   "ended_s": None if p.ended_s is None else round(p.ended_s, 3), "state": p.state.value,
                   "steps": p.steps, "busy_s": round(p.busy_s, 3)} for p in self.pods],
            scale_events=self.scale_events,
            timeline=self.timeline,
            lost=self.lost,
            gpu_seconds=gpu,
            end_s=end,
            stop_reason=stop_reason,
            failure=self.failure,
        )

    def _pod_event(self, pod: ClusterPod, now: float) -> None:
        before = pod.state
        pod.advance_state(now)
        if pod.state is PodState.DRAINING and now >= pod.drain_deadline_s:
            self._lose(pod.expire_drain(now), "drain timeout")
            return
        if pod.state is not before:
            pod.pump()
            return
        pod.fire()

    def _arrive(self, request: BenchRequest, now: float) -> None:
        record = self.records[request.request_id]
        ready = [p for p in self.pods if p.state is PodState.READY]
        if not ready:
            self._lose([record], "no ready pod")
            return
        pod = self.router.pick(ready, now)
        self.routed_to[request.request_id] = pod.name
        self.routes.setdefault(request.request_id, []).append(pod.name)
        pod.dispatch(request, record)

    def _fail(self, now: float) -> None:
        ready = [p for p in self.pods if p.state is PodState.READY]
        if not ready:
            self.failure = {"at_s": now, "pod": None, "lost": 0}
            return
        victim = max(ready, key=lambda p: len(p.held))  # the busiest pod: the worst case
        lost = victim.fail(now)
        self._lose(lost, "pod failed")
        self.failure = {"at_s": round(now, 3), "pod": victim.name, "lost": len(lost),
                        "lost_by_tier": {t.value: sum(1 for r in lost if r.tier is t) for t in Tier}}
        self._new_pod(now)  # the ReplicaSet replaces it
        self.scale_events.append({"at_s": round(now, 3), "from": len(self._members()) - 1, "to": len(self._members()), "replaced": victim.name})

    def _sample(self, now: float) -> None:
        members = self._members()
        risks = [p.metrics.sla_risk for p in members if p.metrics is not None and p.metrics.sla_risk is not None]
        loads = [p.metrics.protected_load for p in members if p.metrics is not None and p.metrics.protected_load is not None]
        self.timeline.append({
            "t_s": round(now, 3),
            "replicas": len(members),
            "ready": sum(1 for p in members if p.state is PodState.READY),
            "draining": sum(1 for p in self.pods if p.state is PodState.DRAINING),
            "mean_sla_risk": round(sum(risks) / len(risks), 4) if risks else None,
            "mean_protected_load": round(sum(loads) / len(loads), 4) if loads else None,
        })

