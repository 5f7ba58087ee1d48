"""Reading usage from sidecars: the real HTTP source against a local stand-in sidecar."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp.web
import yaml

from slaq.api.pool import InferencePool
from slaq.api.runtime import METRICS_PATH, USAGE_PATH, TenantUsage, UsageReport
from slaq.operator.attainment import OutcomeCounter
from slaq.operator.client import Connection, KubeClient
from slaq.operator.usage import HttpUsageSource, PodObservation, bound_only, mean_sla_risk, parse_sla_risk, sum_usage
from slaq.testing.kube import KubeEmulator

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"
METRICS = ("# HELP slaq_sla_risk Per-pod SLA risk.\n# TYPE slaq_sla_risk gauge\nslaq_sla_risk 0.75\n"
           "# TYPE slaq_slo_outcomes counter\nslaq_slo_outcomes_total{outcome=\"met\",tenant=\"vip\",tier=\"critical\"} 9.0\n"
           "slaq_slo_outcomes_created{outcome=\"met\",tenant=\"vip\",tier=\"critical\"} 1.7e+09\n")


@contextlib.asynccontextmanager
async def stand_in_pool(kube: KubeEmulator, usage: Callable[[aiohttp.web.Request], Awaitable[aiohttp.web.StreamResponse]],
                        metrics: str) -> AsyncIterator[tuple[KubeClient, InferencePool]]:
    """The example CPU pool with one Running pod (and two a source must skip) whose sidecar answers
    `usage` and `metrics` on the pool's metrics port; the API client and the pool."""
    app = aiohttp.web.Application()
    app.router.add_get(USAGE_PATH, usage)
    app.router.add_get(METRICS_PATH, lambda _: aiohttp.web.Response(text=metrics))
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    api = KubeClient(Connection(server=str(kube.url).rstrip("/")))
    try:
        pool = InferencePool.model_validate(yaml.safe_load((EXAMPLES / "pool-cpu.yaml").read_text()))
        pool.spec.sidecar.metrics_port = port  # usage and metrics are read on the metrics port
        labels = {"app.kubernetes.io/name": "slaq", "slaq.dev/pool": "tiny-cpu"}
        pods = [("ready", labels, "Running", "127.0.0.1"), ("pending", labels, "Pending", None),
                ("other-pool", {**labels, "slaq.dev/pool": "x"}, "Running", "127.0.0.1")]
        for name, pod_labels, phase, ip in pods:
            status = {"phase": phase, **({"podIP": ip} if ip else {})}
            resp = await kube.post("/api/v1/namespaces/default/pods", json={"metadata": {"name": name, "labels": pod_labels}, "status": status})
            assert resp.status in (201, 409)  # 409: a second observation in the same emulator
        yield api, pool
    finally:
        await api.close()
        await runner.cleanup()


async def observe_stand_in(kube: KubeEmulator, report: UsageReport, metrics: str, **limits: int) -> list[PodObservation]:
    """HttpUsageSource over `stand_in_pool`, whose sidecar answers `report` and `metrics`."""
    async with stand_in_pool(kube, lambda _: aiohttp.web.json_response(report.to_wire()), metrics) as (api, pool):
        return list(await HttpUsageSource(api, **limits).observe(pool))


async def test_http_source_reads_running_pods_of_the_pool(kube: KubeEmulator) -> None:
    report = UsageReport(pool="default/tiny-cpu", tenants={"vip": TenantUsage(requests_per_minute=12.0, refused_per_minute=3.0)})
    observations = await observe_stand_in(kube, report, METRICS)
    assert [(o.pod, o.sla_risk) for o in observations] == [("ready", 0.75)]
    assert observations[0].usage == report
    assert observations[0].outcomes == {("vip", "critical", "met"): OutcomeCounter(9.0, 1.7e9)}


async def test_an_oversized_answer_is_refused_not_held(kube: KubeEmulator) -> None:
    report = UsageReport(pool="default/tiny-cpu", tenants={"vip": TenantUsage(requests_per_minute=12.0)})
    flood = METRICS + "".join(f'slaq_slo_outcomes_total{{outcome="met",tenant="t{i}",tier="batch"}} 1.0\n' for i in range(2000))
    [observation] = await observe_stand_in(kube, report, flood, max_metrics_bytes=len(METRICS) + 1000)
    assert observation.usage == report and observation.sla_risk is None and observation.outcomes is None  # metrics refused: not read, not empty
    assert await observe_stand_in(kube, report, METRICS, max_usage_bytes=20) == []  # the usage report refused: no observation


def test_a_pods_report_counts_only_for_the_tenants_its_pool_serves() -> None:
    report = UsageReport(pool="p", tenants={"mine": TenantUsage(requests_per_minute=5.0), "other": TenantUsage(requests_per_minute=9e6)})
    outcomes = {("mine", "batch", "met"): OutcomeCounter(3.0), ("other", "critical", "ttft_missed"): OutcomeCounter(1e6)}
    kept = bound_only(PodObservation("pod", report, 0.5, outcomes), {"mine"})
    assert set(kept.usage.tenants) == {"mine"} and set(kept.outcomes) == {("mine", "batch", "met")} and kept.sla_risk == 0.5


def test_pool_usage_is_the_sum_over_pods_and_risk_the_mean() -> None:
    def obs(rpm: float, risk: float | None) -> PodObservation:
        return PodObservation("p", UsageReport(pool="p", tenants={"a": TenantUsage(requests_per_minute=rpm, concurrency=1)}), risk)

    observations = [obs(1.0, 0.5), obs(2.0, None), obs(3.0, 1.0)]
    assert sum_usage(observations)["a"] == TenantUsage(requests_per_minute=6.0, concurrency=3)
    assert mean_sla_risk(observations) == 0.75 and mean_sla_risk([]) is None
    assert parse_sla_risk(METRICS) == 0.75 and parse_sla_risk("other_metric 1\n") is None


async def test_a_running_pod_that_misses_reads_keeps_its_last_demand_for_two_reads(kube: KubeEmulator) -> None:
    """A read that times out (the busiest pod is the likeliest to) does not take the pod's demand
    away at once: its last usage is carried, with no risk and outcomes None (not read), for
    CARRY_READS reads; then it drops out; it is fresh again when it answers."""
    from slaq.operator.usage import CARRY_READS

    report = UsageReport(pool="default/tiny-cpu", tenants={"vip": TenantUsage(requests_per_minute=80.0)})
    answering = {"usage": True}

    async def usage(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response(report.to_wire()) if answering["usage"] else aiohttp.web.Response(status=503)

    async with stand_in_pool(kube, usage, METRICS) as (api, pool):
        source = HttpUsageSource(api)
        [fresh] = await source.observe(pool)
        assert not fresh.carried and fresh.sla_risk == 0.75 and fresh.outcomes
        answering["usage"] = False
        for _ in range(CARRY_READS):
            [carried] = await source.observe(pool)
            assert (carried.pod, carried.usage, carried.carried, carried.sla_risk, carried.outcomes) == ("ready", report, True, None, None)
        assert await source.observe(pool) == []  # silent past the carry: its share goes to the others
        answering["usage"] = True
        [again] = await source.observe(pool)
        assert not again.carried and again.usage == report
        answering["usage"] = False
        source.forget_pool("default/tiny-cpu")  # the pool was deleted: nothing of it is carried
        assert await source.observe(pool) == []


def test_what_the_carry_keeps_a_pod_that_missed_a_read_from_losing() -> None:
    """Why a silent pod is carried: 100 requests/min over three pods, routing skewed onto a; a's
    share follows its demand. Were a left out of one read, it would fall to the pool's unnamed
    replicas' share, with no demand: from 80 to under 10. Carried, it keeps its share."""
    from slaq.operator.quotas import Slot, split_quota

    skewed = Slot("ns/p", 3, pods={"a": 80.0, "b": 1.0, "c": 1.0})
    previous = split_quota(100, [skewed], unit=1000, min_floor_units=1)
    before = previous.pods["ns/p"].get("a", previous.units["ns/p"])
    assert before >= 70_000
    carried = split_quota(100, [skewed], unit=1000, min_floor_units=1, previous=previous)
    assert carried.pods["ns/p"].get("a", carried.units["ns/p"]) >= before - 1000
    dropped = split_quota(100, [Slot("ns/p", 3, pods={"b": 1.0, "c": 1.0})], unit=1000, min_floor_units=1, previous=previous)
    assert dropped.pods["ns/p"].get("a", dropped.units["ns/p"]) < 10_000
