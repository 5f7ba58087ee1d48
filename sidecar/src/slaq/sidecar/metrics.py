"""Prometheus metrics of one sidecar (its own registry, served on the metrics port's /metrics).

Histograms are per tenant and tier (tenants are bounded by the tenant table); gauges that
describe the pod right now (queue depth per tier, SLA risk, in-flight) are read at scrape time.
`slaq_sla_risk` and `slaq_protected_load` name their pool themselves (`pool`, from the tenant table), so the pool's scaling query
finds it whether Prometheus scrapes by PodMonitor (which adds a `pool` target label of the same
value) or by the pod's `prometheus.io/*` annotations (which add none).
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from slaq.api.common import Tier

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
ADDED_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
HANDOVER_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
# `slaq_handover_seconds`'s `ahead` label: how many released requests had no first byte yet (were
# in the pipe to the engine, or waiting in it) when the request was released, in groups.
PIPE_AHEAD_GROUPS = ((0, "0"), (1, "1-3"), (4, "4-7"), (8, "8-15"), (16, "16+"))
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)


# (tenant, tier, attainment target) of every tenant with objectives, from the tenant table.
Targets = Callable[[], Iterable[tuple[str, str, float]]]


class _PodGauges(Collector):
    def __init__(self, depth: Callable[[], Mapping[Tier, int]], risk: Callable[[], float], protected_load: Callable[[], float],
                 protected_pending: Callable[[], int], in_flight: Callable[[], int], targets: Targets, pool: Callable[[], str]) -> None:
        self._depth, self._risk, self._protected_load, self._protected_pending = depth, risk, protected_load, protected_pending
        self._in_flight, self._targets, self._pool = in_flight, targets, pool

    def collect(self) -> Iterable[GaugeMetricFamily]:
        depth = GaugeMetricFamily("slaq_queue_depth", "Requests waiting in the sidecar queue, per tier.", labels=["tier"])
        for tier, count in self._depth().items():
            depth.add_metric([tier.value], count)
        yield depth
        risk = GaugeMetricFamily("slaq_sla_risk", "Per-pod SLA risk: 1.0 at the SLO boundary (see sidecar/README.md).", labels=["pool"])
        risk.add_metric([self._pool()], self._risk())
        yield risk
        load = GaugeMetricFamily("slaq_protected_load", "Share of the pod's capacity its critical and standard requests need: "
                                 "1.0 at capacity, the pool's scaling signal (see sidecar/README.md).", labels=["pool"])
        load.add_metric([self._pool()], self._protected_load())
        yield load
        yield GaugeMetricFamily("slaq_protected_prompts_pending", "Critical and standard requests on this pod with no first token yet "
                                "(queued in the sidecar, or released to the engine and not started): a gateway's queue metric (docs/gateway.md).",
                                value=self._protected_pending())
        yield GaugeMetricFamily("slaq_in_flight_requests", "Requests released to the engine and not finished.", value=self._in_flight())
        targets = GaugeMetricFamily("slaq_attainment_target", "Each tenant's TenantSLA attainmentTarget: the SLO alerts' error budget is 1 minus it.", labels=["tenant", "tier"])
        for tenant, tier, target in self._targets():
            targets.add_metric([tenant, tier], target)
        yield targets


class SidecarMetrics:
    def __init__(self, *, depth: Callable[[], Mapping[Tier, int]], risk: Callable[[], float], in_flight: Callable[[], int], targets: Targets = lambda: (),
                 protected_load: Callable[[], float] = lambda: 0.0, protected_pending: Callable[[], int] = lambda: 0,
                 pool: Callable[[], str] = lambda: "", tokenizer_loaded: Callable[[], bool] = lambda: False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram("slaq_ttft_seconds", "Time to first token, arrival at the sidecar to first byte back.", ["tenant", "tier"], buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("slaq_tpot_seconds", "Mean time per output token after the first.", ["tenant", "tier"], buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("slaq_e2e_seconds", "End-to-end request latency at the sidecar.", ["tenant", "tier"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("slaq_queue_wait_seconds", "Time spent in the sidecar queue before release to the engine.", ["tier"], buckets=LATENCY_BUCKETS, registry=r)
        self.added = Histogram("slaq_sidecar_added_seconds", "The sidecar's own share of TTFT: its work before the request leaves for the engine (queue wait excluded) plus forwarding the first token.", buckets=ADDED_BUCKETS, registry=r)
        self.handover = Histogram("slaq_handover_seconds", "Release to the engine to its first response byte (streaming requests), by tier and by the "
                                  "requests released ahead of it without a first byte yet (ahead: 0, 1-3, 4-7, 8-15, 16+).", ["tier", "ahead"],
                                  buckets=HANDOVER_BUCKETS, registry=r)
        self.slo = Counter("slaq_slo_outcomes", "Finished requests with objectives, by outcome (met, ttft_missed, tpot_missed).", ["tenant", "tier", "outcome"], registry=r)
        self.rejections = Counter("slaq_rejections", "Refused requests by reason.", ["reason", "tier"], registry=r)
        self.tokens = Counter("slaq_tokens", "Tokens by direction (in: prompt, out: completion).", ["tenant", "tier", "direction"], registry=r)
        self.requests = Counter("slaq_requests", "Requests answered after admission, by upstream status class.", ["tenant", "tier", "code"], registry=r)
        self.quota_refusals = Counter("slaq_quota_refusals", "Requests refused because the tenant was over a quota (request_rate, token_rate, concurrency).", ["tenant", "tier", "quota"], registry=r)
        self.prompt_counts = Counter("slaq_prompt_counts", "Prompts counted, by method: tokenizer (the model's own, as the engine counts), "
                                     "token_ids (a token-id prompt) or estimate (no tokenizer loaded, or it failed on the input).", ["method"], registry=r)
        Gauge("slaq_tokenizer_loaded", "1 when the model's tokenizer counts prompt tokens (--tokenizer, loaded), 0 when they are estimated.",
              registry=r).set_function(lambda: float(tokenizer_loaded()))
        self.engine_up = Gauge("slaq_sidecar_engine_up", "1 when the engine answered this scrape's request for its metrics, else 0.", registry=r)
        r.register(_PodGauges(depth, risk, protected_load, protected_pending, in_flight, targets, pool))

    def observe_handover(self, tier: str, pipe_ahead: int, seconds: float) -> None:
        group = next(label for least, label in reversed(PIPE_AHEAD_GROUPS) if pipe_ahead >= least)
        self.handover.labels(tier, group).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
