"""The dashboard, the adapter rules and the KEDA query ask for series the sidecar really exports."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from slaq.api.common import Tier
from tests.helm.chart import CHART, of_kind, render

# Labels Prometheus adds to every scraped series itself (target labels), plus the pool label the
# PodMonitor copies from the pod, and histogram buckets' `le`.
TARGET_LABELS = {"namespace", "pod", "pool", "le"}
_METRIC = re.compile(r"\b(slaq_[a-z_]+)\b")
_BY = re.compile(r"by \(([^)]*)\)")


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Sample name -> label names, from a real SidecarMetrics with one observation of each kind."""
    from slaq.sidecar.metrics import SidecarMetrics

    metrics = SidecarMetrics(depth=lambda: {tier: 0 for tier in Tier}, risk=lambda: 0.5, in_flight=lambda: 0)
    labels = {"tenant": "vip", "tier": "critical"}
    metrics.ttft.labels(**labels).observe(0.1)
    metrics.tpot.labels(**labels).observe(0.01)
    metrics.e2e.labels(**labels).observe(1.0)
    metrics.queue_wait.labels(tier="critical").observe(0.01)
    metrics.slo.labels(**labels, outcome="met").inc()
    metrics.rejections.labels(reason="quota", tier="batch").inc()
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def _queries() -> list[tuple[str, str]]:
    dashboard = json.loads((CHART / "files" / "dashboards" / "slaq.json").read_text(encoding="utf-8"))
    queries = [(f"dashboard: {p['title']}", t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
    queries += [(f"dashboard variable {v['name']}", v["query"]["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"]
    values = {
        "autoscaling": {
            "prometheusAdapter": {"enabled": True},
            "keda": {"enabled": True, "pools": [{"name": "p", "namespace": "n", "minReplicas": 1, "maxReplicas": 2, "targetSlaRisk": 0.8}]},
        }
    }
    objects = render(values)
    (rules,) = (yaml.safe_load(c["data"]["config.yaml"]) for c in of_kind(objects, "ConfigMap"))
    queries += [("adapter seriesQuery", r["seriesQuery"]) for r in rules["rules"]]
    queries += [("keda query", s["spec"]["triggers"][0]["metadata"]["query"]) for s in of_kind(objects, "ScaledObject")]
    return queries


QUERIES = _queries()


def _labels_used(query: str, name: str) -> set[str]:
    """Labels a query groups by, and those it matches on `name`."""
    used = {label.strip() for group in _BY.findall(query) for label in group.split(",") if label.strip()}
    for matchers in re.findall(rf"\b{name}{{([^}}]*)}}", query):
        used |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
    return used


def test_label_extraction_sees_groupings_and_matchers() -> None:
    query = 'sum by (tier, le) (rate(slaq_ttft_seconds_bucket{namespace=~"$ns",pool="p"}[5m]))'
    assert _labels_used(query, "slaq_ttft_seconds_bucket") == {"tier", "le", "namespace", "pool"}


@pytest.mark.parametrize(("where", "query"), QUERIES, ids=[w for w, _ in QUERIES])
def test_query_names_exported_series_and_labels(exported: dict[str, set[str]], where: str, query: str) -> None:
    names = set(_METRIC.findall(query))
    assert names, f"{where}: no slaq metric in {query!r}"
    for name in names:
        assert name in exported, f"{where}: the sidecar exports no {name} (it has {sorted(exported)})"
        unknown = _labels_used(query, name) - exported[name] - TARGET_LABELS
        assert not unknown, f"{where}: {name} has no label(s) {sorted(unknown)}"


def test_every_dashboard_topic_reads_a_sidecar_metric(exported: dict[str, set[str]]) -> None:
    wanted = {"slaq_ttft_seconds_bucket", "slaq_tpot_seconds_bucket", "slaq_slo_outcomes_total", "slaq_queue_depth",
              "slaq_rejections_total", "slaq_sla_risk"}
    used = {name for where, query in QUERIES if where.startswith("dashboard") for name in _METRIC.findall(query)}
    assert wanted <= used
    assert wanted <= set(exported)
