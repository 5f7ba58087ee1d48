"""The pod as it ships, in simulated time: the real sidecar core in front of the simulated engine.

`slaq bench sim --pod` puts `slaq.sidecar.service.SidecarCore` (authentication, the pod guard,
tenant quotas, output-length prediction, the queue with the pod policy's ranking, the release
gate) between the workload and the engine scheduler, as a pool pod runs them:

- each request reaches the sidecar at its arrival as a streaming `/v1/completions` body (token-id
  prompt, no `max_tokens`) with its tenant's bearer key;
- a refusal (a `SidecarError`) of status 429 or 503 with a Retry-After is retried by the client
  after that delay, up to `client_retries` times, as the OpenAI clients do (2 retries by default);
  a request still refused then, or refused otherwise, is recorded with its status and reason and
  goes no further. Its TTFT, once served, counts from the first attempt;
- a request the gate releases goes to the engine at that moment with the body the sidecar
  enriched (`priority`, `vllm_xargs` with the predicted output, the sidecar's arrival stamp);
- the engine's first token and its end are reported back (`first_token`, `finish`), and every
  `scrape_interval_s` the engine's gauges (waiting, running, KV use) reach the core as
  `EngineMonitor` would scrape them.

The core reads the simulator's clock (its `clock` argument), never the wall clock. TTFT is
measured from the arrival at the sidecar, so time held in its queue counts. The proxy's
per-request cost (~1 ms, `tools/src/slaq/bench/sidecar_latency.py`) is not simulated.
"""

from __future__ import annotations

import heapq
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from slaq.api.common import Tier
from slaq.api.pool import SchedulerSpec
from slaq.api.table import ReplicaShare, TenantEntry, TenantTable, derive_cache_salt, hash_api_key
from slaq.bench.clock import SimClock
from slaq.bench.workload import BenchRequest, TierObjectives
from slaq.sidecar.errors import SidecarError, http_status
from slaq.sidecar.queue import QueuedRequest
from slaq.sidecar.service import CoreConfig, Flight, SidecarCore
from slaq.sidecar.tenants import TenantDirectory

SCRAPE_INTERVAL_S = 0.25  # EngineMonitor's default poll interval
SIM_POOL = "bench/sim"
_SALT_KEY = b"slaq-bench-sim"


@dataclass(frozen=True)
class PodConfig:
    """What the pod's sidecar is configured with; the engine scheduler gets the same `scheduler`."""

    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    quotas: Mapping[str, ReplicaShare] = field(default_factory=dict)  # tenant name -> this replica's share
    engine_queue_target: int = 16
    max_queue_depth: int = 1024
    scrape_interval_s: float = SCRAPE_INTERVAL_S
    client_retries: int = 2  # the OpenAI clients' default max_retries for 429 / 5xx

    def describe(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler.to_wire(),
            "quotas": {name: share.model_dump(mode="json", exclude_none=True) for name, share in sorted(self.quotas.items())},
            "engine_queue_target": self.engine_queue_target,
            "max_queue_depth": self.max_queue_depth,
            "scrape_interval_s": self.scrape_interval_s,
            "client_retries": self.client_retries,
        }


def tenant_key(tenant: str) -> str:
    return f"sk-sim-{tenant}"


def tenant_table(requests: Sequence[BenchRequest], objectives: Mapping[Tier, TierObjectives],
                 quotas: Mapping[str, ReplicaShare]) -> TenantTable:
    """One entry per tenant of the workload, with its tier's objectives and its quota share."""
    tiers = {r.tenant: r.tier for r in requests}
    unknown = sorted(set(quotas) - set(tiers))
    if unknown:
        from slaq.bench.errors import WorkloadError

        raise WorkloadError(f"--quota names tenant(s) not in the workload: {', '.join(unknown)} (known: {', '.join(sorted(tiers))})")
    entries = []
    for name, tier in sorted(tiers.items()):
        goal = objectives[tier]
        entries.append(TenantEntry(
            name=name,
            tier=tier,
            ttft_ms=None if goal.ttft_s is None else goal.ttft_s * 1000.0,
            tpot_ms=None if goal.tpot_s is None else goal.tpot_s * 1000.0,
            key_hashes=[hash_api_key(tenant_key(name))],
            cache_salt=derive_cache_salt(_SALT_KEY, name),
            share=quotas.get(name, ReplicaShare()),
        ))
    return TenantTable(pool=SIM_POOL, revision="sim", tenants=entries)


def request_body(request: BenchRequest) -> bytes:
    """A streaming completion with a token-id prompt (counted exactly) and no max_tokens."""
    return json.dumps({"prompt": [1] * request.prompt_tokens, "stream": True}, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    reason: str


RETRIED_STATUSES = frozenset({429, 503})

# (request id, the body the sidecar sends the engine) for each released request.
Submit = Callable[[str, dict[str, Any]], None]
# (request id, the final refusal) for each request the client gives up on.
Refuse = Callable[[str, Refusal], None]
Gauges = Callable[[], tuple[int, int, float, "list[int] | None"]]


class PodFront:
    """The sidecar core of one simulated pod; the simulator calls it at each event's time."""

    def __init__(self, config: PodConfig, table: TenantTable, clock: SimClock, *, max_num_seqs: int, max_model_len: int,
                 max_num_batched_tokens: int = 8192) -> None:
        self.config = config
        self.core = SidecarCore(
            CoreConfig(max_queue_depth=config.max_queue_depth, scheduler=config.scheduler, engine_queue_target=config.engine_queue_target,
                       max_length_tokens=max_model_len, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens),
            TenantDirectory.from_table(table),
            clock=clock.wall,
        )
        self.core.dispatcher.on_release = self._released
        self.core.dispatcher.on_shed = self._shed
        self.clock = clock
        self.next_scrape_s = 0.0
        self.retries: dict[str, int] = {}  # request id -> refusals the client retried
        self._retry_heap: list[tuple[float, int, BenchRequest]] = []
        self._retry_seq = itertools.count()
        self._submit: Submit | None = None
        self._refuse: Refuse | None = None
        self._flights: dict[str, Flight] = {}
        self._ids: dict[QueuedRequest, str] = {}  # compared by identity
        self._queued: dict[str, BenchRequest] = {}  # request id -> the request, while the sidecar holds it

    def connect(self, submit: Submit, refuse: Refuse) -> None:
        self._submit, self._refuse = submit, refuse

    def next_event_s(self) -> float:
        """When the sidecar next acts on its own: a client's retry or the next engine scrape."""
        return min(self.next_scrape_s, self._retry_heap[0][0]) if self._retry_heap else self.next_scrape_s

    def fire(self, gauges: Gauges) -> None:
        """Run the event due at `next_event_s()` (the clock is there): a retry, else a scrape."""
        if self._retry_heap and self._retry_heap[0][0] <= self.next_scrape_s:
            self.arrive(heapq.heappop(self._retry_heap)[2])
        else:
            self.scrape(*gauges())

    def arrive(self, request: BenchRequest) -> None:
        """The request reaches the sidecar now: released to the engine, queued, or refused."""
        try:
            identity = self.core.identify({"authorization": f"Bearer {tenant_key(request.tenant)}"})
            flight = self.core.check_in(identity, "completions", request_body(request))
        except SidecarError as error:
            self._refused(request, error)
            return
        self._flights[request.request_id] = flight
        self._ids[flight.entry] = request.request_id
        self._queued[request.request_id] = request
        self.core.dispatcher.offer(flight.entry)

    def _refused(self, request: BenchRequest, error: SidecarError) -> None:
        status, tried = http_status(error), self.retries.get(request.request_id, 0)
        if status in RETRIED_STATUSES and error.retry_after_s is not None and tried < self.config.client_retries:
            self.retries[request.request_id] = tried + 1
            heapq.heappush(self._retry_heap, (self.clock.now + error.retry_after_s, next(self._retry_seq), request))
        elif self._refuse is not None:
            self._refuse(request.request_id, Refusal(status, error.reason))

    def _shed(self, entry: QueuedRequest, error: SidecarError) -> None:
        """The queue shed a request it could no longer serve in time: the client sees the refusal
        (and retries it after Retry-After, as a refusal at the door)."""
        request_id = self._ids.pop(entry)
        flight = self._flights.pop(request_id)
        self.core.shed(flight, error)
        self._refused(self._queued.pop(request_id), error)

    def _released(self, entry: QueuedRequest) -> None:
        request_id = self._ids.pop(entry)
        self._queued.pop(request_id, None)
        if self._submit is None:
            raise RuntimeError("PodFront.connect() was not called")
        self._submit(request_id, json.loads(self.core.enriched_body(self._flights[request_id])))

    def scrape(self, waiting: int, running: int, kv_usage: float, waiting_by_rank: Sequence[int] | None = None) -> None:
        """The engine's gauges as `EngineMonitor` reads them; the next scrape is one interval on."""
        gate = self.core.gate
        self.core.observe_engine(waiting, running, kv_usage, gate.released_total, waiting_by_rank, gate.released_by_rank)
        self.next_scrape_s += self.config.scrape_interval_s

    def first_token(self, request_id: str) -> None:
        self.core.first_token(self._flights[request_id])

    def finished(self, request_id: str, output_tokens: int) -> None:
        flight = self._flights.pop(request_id)
        self.core.finish(flight, output_tokens=output_tokens, engine_prompt_tokens=flight.prompt_tokens, status=200)

    def holding(self) -> int:
        """Requests queued in the sidecar or waiting for a client's retry."""
        return len(self.core.queue) + len(self._retry_heap)
