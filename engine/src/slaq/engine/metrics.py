"""The engine's Prometheus metrics.

The scheduler runs in vLLM's EngineCore process, not in the API server process that answers
`/metrics`. `slaq engine` points `PROMETHEUS_MULTIPROC_DIR` at a fresh directory before vLLM
starts; vLLM's `/metrics` then serves a multiprocess registry, so the series written here (and
vLLM's own `vllm:*` series) appear together on the server's `/metrics`. Without that variable
(unit tests) they live in the default in-process registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

from prometheus_client import Counter, Gauge, Histogram

from slaq.api.common import Tier

PREFIX = "slaq_engine_"
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass(frozen=True)
class EngineMetrics:
    arrivals: Counter
    preemptions: Counter
    kv_blocks_in_use: Gauge
    queue_depth: Gauge
    step_seconds: Histogram
    prefix_hit_tokens: Counter
    prefix_query_tokens: Counter
    info: Gauge
    table_reloads: Counter
    kv_erased_blocks: Counter
    kv_swap_blocks: Counter
    kv_swap_victims: Counter
    kv_swap_seal_seconds_per_token: Gauge
    step_time_model: Gauge
    _prefix_children: dict = field(default_factory=dict, compare=False, repr=False)  # (id(counter), tier, tenant) -> label child
    _tier_values: list = field(default_factory=list, compare=False, repr=False)  # what the per-tier gauges were last set to

    def observe_step(self, seconds: float, queue_depth: Sequence[int], kv_blocks: Sequence[int]) -> None:
        """Per-tier values indexed by tier rank. Label children are looked up once, and a gauge is set
        only when its value changed (each set takes a lock; most steps change few of them)."""
        self.step_seconds.observe(seconds)
        values = (*queue_depth, *kv_blocks)
        last = self._tier_values
        if len(last) != len(values):
            last[:] = [None] * len(values)
        for index, (gauge, value) in enumerate(zip(self._tier_children(), values)):
            if last[index] != value:
                gauge.set(value)
                last[index] = value

    @lru_cache(maxsize=1)
    def _tier_children(self) -> tuple:
        return tuple(self.queue_depth.labels(tier=t.value) for t in Tier) + tuple(self.kv_blocks_in_use.labels(tier=t.value) for t in Tier)

    def observe_step_model(self, fixed_s: float, per_token_s: float, per_kv_token_s: float, per_pair_s: float = 0.0) -> None:
        """The scheduler's learned step-time model (what the swap rule prices a recompute with)."""
        for term, value in (("fixed", fixed_s), ("per_token", per_token_s), ("per_kv_token", per_kv_token_s), ("per_pair", per_pair_s)):
            self.step_time_model.labels(term=term).set(value)

    def count_arrival(self, tier: Tier) -> None:
        self.arrivals.labels(tier=tier.value).inc()

    def count_preemption(self, tier: Tier, reason: str) -> None:
        self.preemptions.labels(tier=tier.value, reason=reason).inc()

    def count_prefix(self, tier: str, tenant: str, queried: int, hit: int) -> None:
        if queried:
            self._prefix_child(self.prefix_query_tokens, tier, tenant).inc(queried)
        if hit:
            self._prefix_child(self.prefix_hit_tokens, tier, tenant).inc(hit)

    def _prefix_child(self, counter: Counter, tier: str, tenant: str):
        """A label child, looked up once per series: `labels()` takes a lock and builds the label
        tuple on every call, and this runs for every admitting tenant every step. A series is still
        created only when it is first counted."""
        key = (id(counter), tier, tenant)
        child = self._prefix_children.get(key)
        if child is None:
            child = self._prefix_children[key] = counter.labels(tier=tier, tenant=tenant)
        return child


@lru_cache(maxsize=1)
def engine_metrics() -> EngineMetrics:
    """Process-wide metrics (a registry accepts each name once)."""
    return EngineMetrics(
        arrivals=Counter(PREFIX + "arrivals", "Requests the scheduler received (what the sidecar released to the engine), by tier; counted when they join the waiting queue, paused or not.", ["tier"]),
        preemptions=Counter(PREFIX + "preemptions", "Requests preempted by the slaq scheduler, by tier of the victim and reason.", ["tier", "reason"]),
        kv_blocks_in_use=Gauge(PREFIX + "kv_blocks_in_use", "KV cache blocks held by running requests, by tier.", ["tier"], multiprocess_mode="mostrecent"),
        queue_depth=Gauge(PREFIX + "queue_depth", "Requests waiting in the engine, by tier.", ["tier"], multiprocess_mode="mostrecent"),
        step_seconds=Histogram(PREFIX + "schedule_step_seconds", "Wall time of one schedule() call of the slaq scheduler.", buckets=STEP_BUCKETS),
        prefix_hit_tokens=Counter(PREFIX + "prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache at admission, by tier and tenant.", ["tier", "tenant"]),
        prefix_query_tokens=Counter(PREFIX + "prefix_cache_query_tokens", "Prompt tokens looked up in the prefix cache at admission, by tier and tenant.", ["tier", "tenant"]),
        table_reloads=Counter(PREFIX + "tenant_table_reloads", "Changed tenant tables the scheduler read while running, by outcome (applied, kept_previous).", ["outcome"]),
        kv_erased_blocks=Counter(PREFIX + "kv_erased_blocks", "KV cache blocks zeroed before reuse, by reason (reuse: handed to another tenant; free: freed by an onFree tenant; tenant_removed; salt_changed).", ["reason"]),
        kv_swap_blocks=Counter(PREFIX + "kv_swap_blocks", "KV blocks of preempted requests sealed into host memory (out) or restored from it (in), by outcome (out: ok, refused when the host copy is full or empty, recompute when recomputing costs less; in: ordered, and failed when missing or tampered, then recomputed).", ["direction", "outcome"]),
        kv_swap_victims=Counter(PREFIX + "kv_swap_victims", "Preempted requests whose KV was sealed into host memory (choice swapped) or left to recompute (recomputed), by tier and reason (cost: the swap rule compared sealing and opening against recomputing; always: swapChoice always; no_room: the host cache cannot hold it; no_rule, no_host_cache).", ["tier", "choice", "reason"]),
        kv_swap_seal_seconds_per_token=Gauge(PREFIX + "kv_swap_seal_seconds_per_token", "What the swap rule charges per token for sealing a victim's KV and opening it again.", multiprocess_mode="mostrecent"),
        step_time_model=Gauge(PREFIX + "step_time_model_seconds", "The scheduler's step-time model learned from measured steps: a step takes fixed + per_token x tokens + per_kv_token x KV tokens held (seconds per unit).", ["term"], multiprocess_mode="mostrecent"),
        info=Gauge(PREFIX + "scheduler_info", "The scheduler class serving this engine (value 1).", ["scheduler", "vllm"], multiprocess_mode="mostrecent"),
    )
