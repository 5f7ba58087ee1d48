"""What the operator observes on a pool's pods: per-tenant usage and SLA risk.

`UsageSource` is the seam: the operator asks it for one observation per serving pod. The real
source (`HttpUsageSource`) lists the pool's running pods and reads USAGE_PATH and METRICS_PATH
on each sidecar's metrics port (demand, `slaq_sla_risk`, and the SLO outcome counters that
attainment.py turns into `TenantSLA.status.attainment`); tests inject their own source, so they
need no pods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

from slaq.api.pool import InferencePool
from slaq.api.runtime import METRICS_PATH, USAGE_PATH, TenantUsage, UsageReport
from slaq.operator.attainment import OutcomeCounter, SeriesKey
from slaq.operator.client import KubeClient
from slaq.operator.names import pool_selector_labels

SLA_RISK_METRIC = "slaq_sla_risk"
SLO_OUTCOMES_METRIC = "slaq_slo_outcomes"  # the counter family; samples are `_total`, creation times `_created`


@dataclass(frozen=True)
class PodObservation:
    pod: str
    usage: UsageReport
    sla_risk: float | None = None
    # slaq_slo_outcomes_total; None: /metrics could not be read (attainment keeps the pod's last reading)
    outcomes: Mapping[SeriesKey, OutcomeCounter] | None = field(default_factory=dict)
    carried: bool = False  # the pod did not answer: `usage` is its last answer's (HttpUsageSource)


class UsageSource(Protocol):
    async def observe(self, pool: InferencePool) -> Sequence[PodObservation]:
        """One observation per pod of the pool that answered; pods that did not are left out."""
        ...


def bound_only(observation: PodObservation, tenants: set[str]) -> PodObservation:
    """What a pod reports of the tenants its pool serves: demand or SLO outcomes it reports for any
    other tenant name are dropped (a pod cannot steer another pool's tenants' quotas or attainment)."""
    usage = observation.usage.model_copy(update={"tenants": {t: u for t, u in observation.usage.tenants.items() if t in tenants}})
    outcomes = None if observation.outcomes is None else {
        series: counter for series, counter in observation.outcomes.items() if series[0] in tenants}
    return PodObservation(observation.pod, usage, observation.sla_risk, outcomes, observation.carried)


class PoolUsage(dict[str, TenantUsage]):
    """A pool's usage per tenant (the sum over its pods), remembering what each pod that answered
    reported: the quota split gives each pod a share that follows its own demand."""

    def __init__(self, totals: Mapping[str, TenantUsage] | None = None, pods: Mapping[str, Mapping[str, TenantUsage]] | None = None) -> None:
        super().__init__(totals or {})
        self.pods: dict[str, Mapping[str, TenantUsage]] = dict(pods or {})  # pod name -> tenant -> its usage there

    def by_pod(self, tenant: str) -> dict[str, TenantUsage | None]:
        """The tenant's usage on each pod that answered (None: the pod saw none of it)."""
        return {pod: tenants.get(tenant) for pod, tenants in self.pods.items()}


def sum_usage(observations: Sequence[PodObservation]) -> PoolUsage:
    """A pool's usage per tenant: the sum over its pods, with each pod's report kept."""
    totals: dict[str, TenantUsage] = {}
    for obs in observations:
        for tenant, u in obs.usage.tenants.items():
            t = totals.get(tenant) or TenantUsage()
            totals[tenant] = TenantUsage(
                requests_per_minute=t.requests_per_minute + u.requests_per_minute,
                tokens_per_minute=t.tokens_per_minute + u.tokens_per_minute,
                concurrency=t.concurrency + u.concurrency,
                refused_per_minute=t.refused_per_minute + u.refused_per_minute,
                slo_met_per_minute=t.slo_met_per_minute + u.slo_met_per_minute,
                slo_missed_per_minute=t.slo_missed_per_minute + u.slo_missed_per_minute,
            )
    return PoolUsage(totals, {obs.pod: obs.usage.tenants for obs in observations})


def mean_sla_risk(observations: Sequence[PodObservation]) -> float | None:
    """The pool's SLA risk as its HPA sees it: the mean over pods that report one."""
    risks = [o.sla_risk for o in observations if o.sla_risk is not None]
    return round(sum(risks) / len(risks), 3) if risks else None


def parse_sla_risk(metrics_text: str) -> float | None:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == SLA_RISK_METRIC:
            for sample in family.samples:
                return float(sample.value)
    return None


def parse_slo_outcomes(metrics_text: str) -> dict[SeriesKey, OutcomeCounter]:
    """Every `slaq_slo_outcomes_total{tenant, tier, outcome}` series with its `_created` time."""
    totals: dict[SeriesKey, float] = {}
    created: dict[SeriesKey, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if not sample.name.startswith(SLO_OUTCOMES_METRIC + "_"):
                continue
            labels = sample.labels
            key = (labels.get("tenant", ""), labels.get("tier", ""), labels.get("outcome", ""))
            if sample.name == SLO_OUTCOMES_METRIC + "_total":
                totals[key] = float(sample.value)
            elif sample.name == SLO_OUTCOMES_METRIC + "_created":
                created[key] = float(sample.value)
    return {key: OutcomeCounter(value, created.get(key)) for key, value in totals.items()}


# A pod's answers are read up to this many bytes (a usage report of 10,000 tenants is about 2 MB,
# their SLO series on /metrics a few times that): a larger one is refused, never held in memory.
MAX_USAGE_BYTES = 8 * 2**20
MAX_METRICS_BYTES = 32 * 2**20


class ResponseTooLarge(ValueError):
    pass


async def read_capped(http: httpx.AsyncClient, url: str, limit: int) -> bytes:
    """The body of GET `url`; ResponseTooLarge past `limit` bytes (read as it streams, not after)."""
    async with http.stream("GET", url) as response:
        response.raise_for_status()
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > limit:
                raise ResponseTooLarge(f"{url}: more than {limit} bytes")
        return bytes(body)


# Reads for which a running pod that does not answer keeps its last answer's demand.
CARRY_READS = 2


class HttpUsageSource:
    """Reads USAGE_PATH and METRICS_PATH from every running pod of a pool (metrics port), concurrently,
    each answer capped in size (a pod that sends more adds nothing).

    A pod still running that does not answer (a read timed out: the busiest pod is the likeliest
    to) is observed with its last answer's usage for up to `carry_reads` reads in a row (`carried`;
    no risk, outcomes None). Left out at once, it would join its pool's unnamed replicas in the
    quota split with no demand, and a tenant routed mostly to it would lose most of its share
    there for the ticks the split takes to give it back (quotas.py smoothing). A pod that stays
    silent, or stops running, or is being deleted, drops out and its share goes to the others."""

    def __init__(self, api: KubeClient, *, timeout_s: float = 3.0, max_usage_bytes: int = MAX_USAGE_BYTES,
                 max_metrics_bytes: int = MAX_METRICS_BYTES, carry_reads: int = CARRY_READS) -> None:
        self._api = api
        self._timeout = timeout_s
        self._max_usage, self._max_metrics = max_usage_bytes, max_metrics_bytes
        self._carry_reads = carry_reads
        self._last: dict[str, dict[str, tuple[UsageReport, int]]] = {}  # pool key -> pod -> (last usage, reads missed since)

    def forget_pool(self, key: str) -> None:
        """The pool was deleted: its pods' last answers go."""
        self._last.pop(key, None)

    async def observe(self, pool: InferencePool) -> Sequence[PodObservation]:
        pods = await self._api.list("pods", pool.metadata.namespace,
                                    labels=pool_selector_labels(pool.metadata.name))
        targets = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods
                   if p.get("status", {}).get("phase") == "Running" and p.get("status", {}).get("podIP")
                   and not p["metadata"].get("deletionTimestamp")}
        async with httpx.AsyncClient(timeout=self._timeout) as http:
            results = await asyncio.gather(*(self._one(http, name, ip, pool.spec.sidecar.metrics_port) for name, ip in targets.items()))
        key = f"{pool.metadata.namespace}/{pool.metadata.name}"
        last, kept = self._last.get(key, {}), {}
        observations: list[PodObservation] = []
        for name, result in zip(targets, results):
            if result is not None:
                kept[name] = (result.usage, 0)
                observations.append(result)
            elif name in last and last[name][1] < self._carry_reads:
                usage, missed = last[name]
                kept[name] = (usage, missed + 1)
                observations.append(PodObservation(name, usage, None, None, carried=True))
        self._last[key] = kept  # pods no longer running drop out here
        return observations

    async def _one(self, http: httpx.AsyncClient, pod: str, ip: str, port: int) -> PodObservation | None:
        base = f"http://{ip}:{port}"
        try:
            usage = UsageReport.model_validate_json(await read_capped(http, base + USAGE_PATH, self._max_usage))
        except (httpx.HTTPError, ValueError):
            return None  # a pod that cannot answer yet (starting, draining) adds no demand
        try:
            text = (await read_capped(http, base + METRICS_PATH, self._max_metrics)).decode("utf-8")
            risk, outcomes = parse_sla_risk(text), parse_slo_outcomes(text)
        except (httpx.HTTPError, ValueError):
            risk, outcomes = None, None
        return PodObservation(pod, usage, risk, outcomes)


class StaticUsageSource:
    """A fixed set of observations per pool key (`namespace/name`): for tests and dry runs."""

    def __init__(self, observations: Mapping[str, Sequence[PodObservation]] | None = None) -> None:
        self.observations: dict[str, list[PodObservation]] = {k: list(v) for k, v in (observations or {}).items()}

    async def observe(self, pool: InferencePool) -> Sequence[PodObservation]:
        return list(self.observations.get(f"{pool.metadata.namespace}/{pool.metadata.name}", []))
