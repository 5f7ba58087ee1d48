"""A real Prometheus scrapes a real sidecar in front of the real engine and evaluates, through its HTTP
API, the exact queries the chart renders: the prometheus-adapter rule the operator's HPA reads, the
KEDA trigger, the SLO recording rules and every alert rule. The scaling signal is the pod's
`slaq_protected_load`; it is 0 while the pod idles and rises with the load of its critical and
standard requests.

The pod is scraped as a cluster would, by two Prometheus servers in turn: first as the
`prometheus.io/*` annotations have it (target labels `namespace` and `pod` only: the KEDA query's
`pool` is the sidecar's own label), then as the chart's PodMonitor has it (a `pool` target label too).
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
from typing import Callable, Iterator

import httpx
import pytest
import yaml

from e2e.prometheus import PrometheusServer, ScrapeJob, value
from e2e.traffic import Outcome, stream_completion
from slaq.api.table import TenantTable
from slaq.local.processes import Child, free_port, start_child, wait_ready
from tests.helm.chart import of_kind, render
from tests.sidecar.conftest import write_table
from tests.sidecar.tables import KEYS, entry
from tests.support.polling import wait_for

pytestmark = pytest.mark.engine

NAMESPACE, POOL, POD = "default", "tiny-cpu", "tiny-cpu-e2e-0"
# vip's objectives no CPU engine meets (every request misses: risk far above 1, error ratio 1);
# std's are met by anything (error ratio 0).
TENANTS = TenantTable(pool=f"{NAMESPACE}/{POOL}", revision="r1", tenants=[
    entry("vip", "critical", ttft_ms=1.0, tpot_ms=1.0, attainment_target=0.99),
    entry("std", "standard", ttft_ms=600_000.0, tpot_ms=600_000.0, attainment_target=0.95),
])
CHART_VALUES = {
    "alerts": {"enabled": True},
    "autoscaling": {"prometheusAdapter": {"enabled": True},
                    "keda": {"enabled": True, "pools": [{"name": POOL, "namespace": NAMESPACE, "minReplicas": 1, "maxReplicas": 4, "targetProtectedLoad": 0.8}]}},
}
QUERY_TIMEOUT_S = 60.0


def adapter_query(rule: dict, namespace: str, pods: list[str]) -> str:
    """The rule's metricsQuery as prometheus-adapter fills it in for a Pods metric of `pods`."""
    matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
    return rule["metricsQuery"].replace("<<.Series>>", "slaq_protected_load").replace("<<.LabelMatchers>>", matchers).replace("<<.GroupBy>>", "pod")


@pytest.fixture(scope="module")
def chart() -> dict:
    objects = render(CHART_VALUES)
    (adapter,) = (yaml.safe_load(c["data"]["config.yaml"])["rules"] for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-adapter-rules"))
    (scaled,) = of_kind(objects, "ScaledObject")
    (rule,) = of_kind(objects, "PrometheusRule")
    return {"adapter": adapter[0], "keda": scaled["spec"]["triggers"][0]["metadata"]["query"], "groups": rule["spec"]["groups"]}


@pytest.fixture(scope="module")
def sidecar(slaq_engine, tmp_path_factory) -> Iterator[tuple[str, int]]:
    from slaq.engine.tiny_model import ensure_tiny_model

    root = tmp_path_factory.mktemp("prometheus-e2e")
    table = root / "tenants.json"
    write_table(table, TENANTS)
    port, metrics_port = free_port(), free_port()
    command = [sys.executable, "-m", "slaq", "sidecar", "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
               "--engine-url", slaq_engine.base_url, "--tenant-table", str(table), "--served-model-name", slaq_engine.model,
               "--tokenizer", str(ensure_tiny_model()), "--access-log", "off"]
    child: Child = start_child("sidecar", command, root / "sidecar.log", f"http://127.0.0.1:{port}/ready")
    try:
        wait_ready([child], 120.0)
        yield f"http://127.0.0.1:{port}", metrics_port
    finally:
        child.stop()


@pytest.fixture
def prometheus(chart: dict) -> Iterator[Callable[[ScrapeJob], PrometheusServer]]:
    """Starts a Prometheus with the chart's rules and one scrape job; every one is stopped at the end."""
    servers: list[PrometheusServer] = []

    def start(job: ScrapeJob) -> PrometheusServer:
        servers.append(PrometheusServer(chart["groups"]))
        return servers[-1].start([job])

    try:
        yield start
    finally:
        for server in servers:
            server.close()


def _drive(url: str, requests: int, concurrency: int) -> list[Outcome]:
    async def run() -> list[Outcome]:
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
            async def one(i: int) -> Outcome:
                async with gate:
                    return await stream_completion(client, url, KEYS["vip" if i % 2 == 0 else "std"], max_tokens=16, seed=i)
            return await asyncio.gather(*(one(i) for i in range(requests)))
    return asyncio.run(run())


def test_the_charts_scaling_queries_and_rules_read_the_pods_protected_load(chart: dict, sidecar: tuple[str, int],
                                                                  prometheus: Callable[[ScrapeJob], PrometheusServer]) -> None:
    url, metrics_port = sidecar
    target = f"127.0.0.1:{metrics_port}"
    by_annotation = prometheus(ScrapeJob("pods-by-annotation", [target], {"namespace": NAMESPACE, "pod": POD}))
    _scaling_signal_follows_the_load(chart, url, by_annotation)
    _recording_and_alert_rules_evaluate(chart, by_annotation)
    by_annotation.close()
    # Scraped as the chart's PodMonitor does, with a pool target label: the same queries still find the pod.
    by_monitor = prometheus(ScrapeJob("pods-by-podmonitor", [target], {"namespace": NAMESPACE, "pod": POD, "pool": POOL}))
    (series,) = wait_for(lambda: by_monitor.query("slaq_protected_load"), QUERY_TIMEOUT_S, "the PodMonitor-style job's series", poll_s=0.5)
    assert (series["metric"]["pool"], series["metric"]["exported_pool"]) == (POOL, POOL)  # the sidecar's own label, renamed beside the target's
    (keda,) = by_monitor.query(chart["keda"], at=float(series["value"][0]))
    (per_pod,) = by_monitor.query(adapter_query(chart["adapter"], NAMESPACE, [POD]), at=float(series["value"][0]))
    assert value(keda) == value(per_pod) == value(series) and per_pod["metric"] == {"pod": POD}


def _scaling_signal_follows_the_load(chart: dict, url: str, prometheus: PrometheusServer) -> None:
    wait_for(lambda: [value(s) for s in prometheus.query('up{job="pods-by-annotation"}')] == [1.0], QUERY_TIMEOUT_S,
             "Prometheus to scrape the sidecar's metrics port", poll_s=0.5)

    # The adapter discovers the pod's series with its seriesQuery: namespace and pod are there.
    discovered = wait_for(lambda: prometheus.series(chart["adapter"]["seriesQuery"]), QUERY_TIMEOUT_S, "the adapter's series", poll_s=0.5)
    assert [(s["namespace"], s["pod"], s["pool"]) for s in discovered] == [(NAMESPACE, POD, POOL)]

    # Idle: the HPA's and KEDA's queries both read 0 for the pod.
    hpa = adapter_query(chart["adapter"], NAMESPACE, [POD])
    assert [(s["metric"], value(s)) for s in prometheus.query(hpa)] == [({"pod": POD}, 0.0)]
    assert [value(s) for s in prometheus.query(chart["keda"])] == [0.0]
    # Load: vip's (critical) and std's (standard) requests held by the pod; both queries rise together.
    outcomes: list[Outcome] = []
    load = threading.Thread(target=lambda: outcomes.extend(_drive(url, requests=16, concurrency=8)), daemon=True)
    load.start()
    risen = wait_for(lambda: [s for s in prometheus.query(chart["keda"]) if value(s) > 0.0], QUERY_TIMEOUT_S, "the KEDA query to rise with the load", poll_s=0.5)
    at = float(risen[0]["value"][0])
    (per_pod,) = prometheus.query(hpa, at=at)
    assert per_pod["metric"] == {"pod": POD} and value(per_pod) == value(risen[0])
    load.join(timeout=240.0)
    assert not load.is_alive() and len(outcomes) == 16 and all(o.done for o in outcomes), outcomes
    # A second round once Prometheus holds the SLO counters, so that their rate() sees them grow
    # (a counter's first sample is no increase: a burst within one scrape would read 0/0).
    wait_for(lambda: prometheus.query('slaq_slo_outcomes_total{tenant="vip"}'), QUERY_TIMEOUT_S, "vip's SLO outcomes scraped", poll_s=0.5)
    assert all(o.done for o in _drive(url, requests=8, concurrency=8))
    # The gateway's series comes through the same port (vLLM writes its gauges from its first step on).
    assert wait_for(lambda: prometheus.query(f'vllm:num_requests_waiting{{namespace="{NAMESPACE}",pod="{POD}"}}'), QUERY_TIMEOUT_S,
                    "the engine's vllm:num_requests_waiting through the metrics port", poll_s=0.5)


def _recording_and_alert_rules_evaluate(chart: dict, prometheus: PrometheusServer) -> None:
    # The recording rules: vip's error ratio is 1 (every request missed); std, which never missed,
    # has no miss series, hence no ratio (nothing to alert on); budgets are 1 - target for both.
    ratios = wait_for(lambda: [s for s in prometheus.query(f'slaq:slo_error_ratio:rate5m{{namespace="{NAMESPACE}"}}') if not math.isnan(value(s))],
                      QUERY_TIMEOUT_S, "the SLO error ratio over the second round", poll_s=0.5)
    assert {s["metric"]["tenant"]: value(s) for s in ratios} == {"vip": 1.0}
    misses = prometheus.query(f'slaq_slo_outcomes_total{{namespace="{NAMESPACE}",tenant="std"}}')
    assert {s["metric"]["outcome"] for s in misses} == {"met"}
    budgets = {s["metric"]["tenant"]: value(s) for s in prometheus.query("slaq:slo_error_budget")}
    assert budgets == pytest.approx({"vip": 0.01, "std": 0.05})
    # Every rule the chart renders evaluates without error against the real series.
    rules = wait_for(lambda: (r := prometheus.rules()) and all(x.get("lastEvaluation", "").startswith("20") for x in r) and r, QUERY_TIMEOUT_S,
                     "every rule evaluated once", poll_s=0.5)
    assert len(rules) == sum(len(g["rules"]) for g in chart["groups"])
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]


def test_a_pod_scraped_twice_counts_once_and_no_series_is_no_value(chart: dict) -> None:
    """A cluster may scrape a pod by its prometheus.io/* annotations and by the chart's PodMonitor at
    once: the KEDA query counts the pod once (a plain sum would double the pool's load, and KEDA its
    replicas). A pool with no series gives no value at all (not 0), which `ignoreNullValues: "false"`
    turns into the HPA holding its replicas."""
    import http.server

    class Gauge(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = f'slaq_protected_load{{pool="{POOL}"}} 0.7\n'.encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gauge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        target = f"127.0.0.1:{server.server_address[1]}"
        both = PrometheusServer(chart["groups"]).start([ScrapeJob("pods-by-annotation", [target], {"namespace": NAMESPACE, "pod": POD}),
                                                        ScrapeJob("pods-by-podmonitor", [target], {"namespace": NAMESPACE, "pod": POD, "pool": POOL})])
        try:
            wait_for(lambda: len(both.query("slaq_protected_load")) == 2, QUERY_TIMEOUT_S, "both jobs' series of the one pod", poll_s=0.5)
            assert [value(s) for s in both.query(chart["keda"])] == [0.7]
            assert [value(s) for s in both.query(chart["keda"].replace(POOL, "no-such-pool"))] == []
        finally:
            both.close()
    finally:
        server.shutdown()
        server.server_close()

