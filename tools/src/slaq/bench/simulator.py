"""The discrete-event simulator: a real vLLM scheduler driven in simulated time.

The loop mirrors vLLM 0.32's `EngineCore.step_with_batch_queue` with async scheduling (a batch
queue of two): the engine schedules step N+1 as soon as step N is launched, and only then waits
for step N's result and calls `update_from_output`. A request that arrives while step N runs is
therefore first seen when step N+2 is scheduled (at the end of step N), as on a real engine.

Each step's GPU time comes from `StepCostModel`; tokens are stamped with the simulated time at
which `update_from_output` delivers them. The scheduler reads simulated time through
`time.time()`/`time.monotonic()` (see `slaq.bench.clock`).

With a `PodFront` (`slaq bench sim --pod`, see `slaq.bench.pod`) requests reach the sidecar core
instead, at their own arrival times even while a step runs (the sidecar does not wait for the
engine's steps); what it releases reaches the engine at the release time, its refusals are
recorded, and its engine scrapes run every `scrape_interval_s`.

With a `SwapAccount` (`slaq.bench.kv_swap`: slaq's KV connector swaps preempted requests' KV to
host memory) each step also takes the time its host transfers cost, and a readmitted request
whose KV came back computes only what did not: the recompute tax counts recomputed work only.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from slaq.api.common import Tier
from slaq.bench import engine_harness as harness
from slaq.bench.clock import SimClock
from slaq.bench.errors import SimulationError
from slaq.bench.stepcost import ScheduledWork, StepCostModel, StepLoad
from slaq.bench.workload import BenchRequest, TierObjectives

if TYPE_CHECKING:
    from slaq.bench.kv_swap import SwapAccount
    from slaq.bench.pod import PodFront

BATCH_QUEUE_SIZE = 2  # vLLM's batch queue depth with async scheduling


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request (simulated seconds)."""

    request_id: str
    tenant: str
    tier: Tier
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    tokens_out: int = 0
    finished: bool = False
    preemptions: int = 0
    computed_tokens: int = 0  # the furthest position ever computed: the KV a preemption throws away
    recomputed_tokens: int = 0  # positions computed again after a preemption (the recompute tax)
    swapped_out_tokens: int = 0  # KV positions sealed into host memory when preempted (KV swap)
    swapped_in_tokens: int = 0  # ... and loaded back on readmission instead of recomputed
    released_s: float | None = None  # --pod: when the sidecar released it to the engine
    refused_status: int | None = None  # --pod: the sidecar refused it (HTTP status) ...
    refused_reason: str | None = None  # ... for this reason (e.g. request_rate); it never reached the engine
    client_retries: int = 0  # --pod: refusals the client retried after their Retry-After

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if self.first_token_s is None or self.last_token_s is None:
            return None
        return (self.last_token_s - self.first_token_s) / (self.tokens_out - 1) if self.tokens_out > 1 else 0.0

    @property
    def queue_wait_s(self) -> float | None:
        return None if self.first_scheduled_s is None else self.first_scheduled_s - self.arrival_s

    @property
    def sidecar_wait_s(self) -> float | None:
        return None if self.released_s is None else self.released_s - self.arrival_s


@dataclass
class RunResult:
    policy: str
    records: list[RequestRecord]
    makespan_s: float
    steps: int
    busy_s: float
    end_s: float
    overhead_s: list[float] = field(default_factory=list)
    stop_reason: str = "all requests finished"
    sees_kv: bool = True  # False where the KV work is out of sight (live: over HTTP), so no recompute tax
    behind_sidecar: bool = False  # --pod: the sidecar core admitted, queued and released the requests
    kv_swap: dict[str, Any] | None = None  # slaq's KV connector swapped victims (see slaq.bench.kv_swap); None: it did not run


ProgressCallback = Callable[[int, int], None]


@dataclass(slots=True)
class _InFlight:
    end_s: float
    output: Any
    sampled: dict[str, int]


class Simulator:
    """Runs one workload through one scheduler instance; single use."""

    def __init__(self, scheduler: Any, cost: StepCostModel, requests: Sequence[BenchRequest],
                 objectives: dict[Tier, TierObjectives], *, policy_name: str, clock: SimClock | None = None,
                 max_drain_s: float = 1800.0, progress: ProgressCallback | None = None, front: "PodFront | None" = None,
                 swap: "SwapAccount | None" = None) -> None:
        self.scheduler = scheduler
        self.cost = cost
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        self.objectives = objectives
        self.policy_name = policy_name
        self.clock = clock or SimClock()
        self.max_drain_s = max_drain_s
        self.progress = progress
        self.max_model_len = cost.profile.model.max_model_len
        self.records = {
            r.request_id: RequestRecord(r.request_id, r.tenant, r.tier, r.arrival_s, r.prompt_tokens, r.output_tokens)
            for r in self.requests
        }
        self._vllm_requests: dict[str, Any] = {}
        self._overhead: list[float] = []
        self._finished = 0
        self.front = front
        self.swap = swap
        if front is not None:
            front.connect(self._release, self._refused)

    def _admit(self, request: BenchRequest) -> None:
        sla = request.sla(self.objectives, self.clock.epoch)
        vllm_request = harness.make_request(
            request.request_id,
            request.prompt_tokens,
            # As an OpenAI server does without a client max_tokens: the rest of the context.
            max_tokens=max(1, self.max_model_len - request.prompt_tokens),
            arrival_time=self.clock.epoch + request.arrival_s,
            priority=request.tier.rank,
            extra_args=sla.to_xargs(),
        )
        self._vllm_requests[request.request_id] = vllm_request
        self.scheduler.add_request(vllm_request)

    def _release(self, request_id: str, body: dict[str, Any]) -> None:
        """The sidecar released a request now: the engine gets the body the sidecar enriched and,
        as vLLM's OpenAI server does, stamps its arrival on receipt."""
        self.records[request_id].released_s = self.clock.now
        prompt_tokens = len(body["prompt"])
        vllm_request = harness.make_request(
            request_id,
            prompt_tokens,
            max_tokens=body.get("max_tokens") or max(1, self.max_model_len - prompt_tokens),
            arrival_time=self.clock.wall(),
            priority=body.get("priority", 0),
            extra_args=body.get("vllm_xargs") or {},
        )
        self._vllm_requests[request_id] = vllm_request
        with self.clock.installed():
            self.scheduler.add_request(vllm_request)

    def _arrive(self, request: BenchRequest) -> None:
        if self.front is None:
            with self.clock.installed():
                self._admit(request)
            return
        self.front.arrive(request)

    def _refused(self, request_id: str, refusal: Any) -> None:
        record = self.records[request_id]
        record.refused_status, record.refused_reason = refusal.status, refusal.reason

    def _next_event_s(self, pending: deque[BenchRequest]) -> float:
        """The next arrival, or (with a pod front) the sidecar's next retry or engine scrape if sooner."""
        arrival = pending[0].arrival_s if pending else float("inf")
        return arrival if self.front is None else min(arrival, self.front.next_event_s())

    def _advance_to(self, t: float, pending: deque[BenchRequest]) -> None:
        """Move the clock to `t`. With a pod front, the sidecar's events up to `t` happen on the
        way, each at its own time; without one, arrivals wait for the loop's next turn."""
        if self.front is not None:
            while (event_s := self._next_event_s(pending)) <= t:
                self.clock.advance_to(max(self.clock.now, event_s))
                if pending and pending[0].arrival_s <= event_s:
                    self._arrive(pending.popleft())
                else:
                    self.front.fire(lambda: harness.engine_gauges(self.scheduler))
        self.clock.advance_to(max(self.clock.now, t))

    def _step_work(self, output: Any) -> tuple[StepLoad, dict[str, int]]:
        load, sampled = StepLoad(), {}
        for share in harness.step_shares(output, self._vllm_requests):
            record = self.records[share.request_id]
            end = share.context_tokens + share.new_tokens
            record.recomputed_tokens += max(0, min(end, record.computed_tokens) - share.context_tokens)
            record.computed_tokens = max(record.computed_tokens, end)
            if share.output_index is not None:
                last = share.output_index >= record.output_tokens - 1
                sampled[share.request_id] = harness.STOP_TOKEN if last else harness.FILLER_TOKEN
            load.add(ScheduledWork(share.new_tokens, share.context_tokens, share.output_index is not None))
            if record.first_scheduled_s is None:
                record.first_scheduled_s = self.clock.now
        return load, sampled

    def _deliver(self, engine_outputs: dict[int, Any]) -> None:
        now = self.clock.now
        for request_id, tokens, finished in harness.deliveries(engine_outputs):
            record = self.records[request_id]
            if tokens:
                if record.first_token_s is None:
                    record.first_token_s = now
                    if self.front is not None:
                        self.front.first_token(request_id)
                record.last_token_s = now
                record.tokens_out += tokens
            if finished and not record.finished:
                record.finished = True
                self._finished += 1
                if self.front is not None:
                    self.front.finished(request_id, record.tokens_out)

    def run(self) -> RunResult:
        if not self.requests:
            raise SimulationError("no requests to simulate")
        pending = deque(self.requests)
        inflight: deque[_InFlight] = deque()
        gpu_free_at, busy, steps, empty_spins = 0.0, 0.0, 0, 0
        deadline = self.requests[-1].arrival_s + self.max_drain_s
        stop_reason = "all requests finished"
        clock, scheduler, total = self.clock, self.scheduler, len(self.requests)
        while True:
            if self.front is None:
                while pending and pending[0].arrival_s <= clock.now:
                    self._arrive(pending.popleft())
            else:
                self._advance_to(clock.now, pending)
            if clock.now > deadline:
                stop_reason = f"stopped {self.max_drain_s:.0f} s of simulated time after the last arrival"
                break
            if scheduler.has_requests():
                started = time.perf_counter()
                with clock.installed():
                    output = scheduler.schedule()
                self._overhead.append(time.perf_counter() - started)
                load, sampled = self._step_work(output)
                seconds = self.cost.seconds(load)
                if self.swap is not None:
                    seconds += self.swap.charge(output, self.records, seconds)
                start = max(clock.now, gpu_free_at)
                gpu_free_at = start + seconds
                busy += seconds
                steps += seconds > 0
                inflight.appendleft(_InFlight(gpu_free_at, output, sampled))
                executed = harness.step_has_tokens(output)
                if len(inflight) < BATCH_QUEUE_SIZE and (executed or scheduler.has_requests()):
                    continue
            elif not inflight:
                if not pending and not (self.front is not None and self.front.holding()):
                    break
                self._advance_to(self._next_event_s(pending), pending)
                continue
            step = inflight.pop()
            self._advance_to(max(clock.now, step.end_s), pending)
            req_ids = harness.scheduled_ids(step.output)
            started = time.perf_counter()
            with clock.installed():
                engine_outputs = scheduler.update_from_output(step.output, harness.model_runner_output(req_ids, step.sampled))
            if self._overhead:
                self._overhead[-1] += time.perf_counter() - started
            self._deliver(engine_outputs)
            if self.progress is not None and steps % 50 == 0:
                self.progress(self._finished, total)
            # A scheduler holding requests that schedules nothing while nothing runs would spin
            # forever in simulated time: wait for the next arrival, or give up.
            if not req_ids and not any(harness.step_has_tokens(s.output) for s in inflight):
                empty_spins += 1
                if empty_spins > 2 * BATCH_QUEUE_SIZE:
                    if not pending and not (self.front is not None and self.front.holding()):
                        stop_reason = "the scheduler holds requests but schedules nothing"
                        break
                    self._advance_to(self._next_event_s(pending), pending)
                    empty_spins = 0
            else:
                empty_spins = 0
        if self.progress is not None:
            self.progress(self._finished, total)
        for req_id, request in self._vllm_requests.items():
            self.records[req_id].preemptions = harness.preemptions(request)
        if self.front is not None:
            for req_id, retries in self.front.retries.items():
                self.records[req_id].client_retries = retries
        last_token = max((r.last_token_s for r in self.records.values() if r.last_token_s is not None), default=0.0)
        return RunResult(
            policy=self.policy_name,
            records=list(self.records.values()),
            makespan_s=max(last_token, self.requests[-1].arrival_s) - self.requests[0].arrival_s,
            steps=steps,
            busy_s=busy,
            end_s=clock.now,
            overhead_s=self._overhead,
            stop_reason=stop_reason,
            behind_sidecar=self.front is not None,
            kv_swap=None if self.swap is None else self.swap.summary(self.cost.profile),
        )
