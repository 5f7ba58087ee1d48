"""The dashboard, the adapter rules, the KEDA query and the alerts ask for series the sidecar really
exports, or the engine does (its `slaq_engine_*` series reach Prometheus through the sidecar's
metrics port)."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from slaq.api.common import Tier
from tests.helm.chart import CHART, kinds, of_kind, render, render_failure

# Labels Prometheus adds to every scraped series itself (target labels), plus the pool label the
# PodMonitor copies from the pod, and histogram buckets' `le`.
TARGET_LABELS = {"namespace", "pod", "pool", "le"}
_METRIC = re.compile(r"\b(slaq_[a-z_]+)\b")
_BY = re.compile(r"by \(([^)]*)\)")


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Sample name -> label names, from a real SidecarMetrics with one observation of each kind."""
    from slaq.sidecar.metrics import SidecarMetrics

    metrics = SidecarMetrics(depth=lambda: {tier: 0 for tier in Tier}, risk=lambda: 0.5, in_flight=lambda: 0,
                             targets=lambda: [("vip", "critical", 0.99)])
    labels = {"tenant": "vip", "tier": "critical"}
    metrics.ttft.labels(**labels).observe(0.1)
    metrics.tpot.labels(**labels).observe(0.01)
    metrics.e2e.labels(**labels).observe(1.0)
    metrics.queue_wait.labels(tier="critical").observe(0.01)
    metrics.slo.labels(**labels, outcome="met").inc()
    metrics.rejections.labels(reason="quota", tier="batch").inc()
    metrics.requests.labels(**labels, code="200").inc()
    metrics.tokens.labels(**labels, direction="in").inc()
    metrics.quota_refusals.labels(**labels, quota="request_rate").inc()
    metrics.engine_up.set(1)
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.render().decode() + _engine_text()):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def _engine_text() -> str:
    """The engine's slaq_engine_* series, from its real metrics with one observation of each kind
    (they live in this process' default registry outside vLLM)."""
    from prometheus_client import REGISTRY, generate_latest

    from slaq.engine.metrics import engine_metrics

    engine = engine_metrics()
    engine.observe_step(0.01, [0, 0, 0], [1, 2, 3])
    engine.count_preemption(Tier.BATCH, "kv_full")
    engine.count_prefix("critical", "vip", queried=10, hit=5)
    engine.kv_erased_blocks.labels(reason="reuse").inc()
    engine.kv_swap_blocks.labels(direction="out", outcome="ok").inc()
    engine.table_reloads.labels(outcome="applied").inc()
    engine.info.labels(scheduler="slaq", vllm="0.32.0").set(1)
    text = generate_latest(REGISTRY).decode()
    return "\n".join(line for line in text.splitlines() if "slaq_engine_" in line) + "\n"


def _queries() -> list[tuple[str, str]]:
    dashboard = json.loads((CHART / "files" / "dashboards" / "slaq.json").read_text(encoding="utf-8"))
    queries = [(f"dashboard: {p['title']}", t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
    queries += [(f"dashboard variable {v['name']}", v["query"]["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"]
    values = {
        "autoscaling": {
            "prometheusAdapter": {"enabled": True},
            "keda": {"enabled": True, "pools": [{"name": "p", "namespace": "n", "minReplicas": 1, "maxReplicas": 2, "targetProtectedLoad": 0.8}]},
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


def test_the_dashboard_shows_the_engine(exported: dict[str, set[str]]) -> None:
    """Preemptions by reason, KV blocks by tier, prefix reuse, erase and swap counters, step time."""
    wanted = {"slaq_engine_preemptions_total": "reason", "slaq_engine_kv_blocks_in_use": "tier",
              "slaq_engine_prefix_cache_hit_tokens_total": "tier", "slaq_engine_prefix_cache_query_tokens_total": "tier",
              "slaq_engine_kv_erased_blocks_total": "reason", "slaq_engine_kv_swap_blocks_total": "direction",
              "slaq_engine_schedule_step_seconds_bucket": "le"}
    for name, grouping in wanted.items():
        panels = [where for where, query in QUERIES if where.startswith("dashboard") and name in _METRIC.findall(query)
                  and grouping in _labels_used(query, name)]
        assert panels, f"no dashboard panel reads {name} by {grouping}"


# The alerts ----------------------------------------------------------------------------------------

ALERTS_ON = {"alerts": {"enabled": True}}


def _rule_groups(values: dict | None = None) -> list[dict]:
    (rule,) = of_kind(render(values or ALERTS_ON), "PrometheusRule")
    return rule["spec"]["groups"]


def _rules() -> list[dict]:
    return [r for group in _rule_groups() for r in group["rules"]]


def _selectors(expr) -> tuple[list, set[str]]:
    """(vector selectors, labels named in by/without/on/ignoring clauses) of a parsed expression."""
    import promql_parser as promql

    selectors: list = []
    grouping: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, promql.VectorSelector):
            selectors.append(node)
        elif isinstance(node, promql.AggregateExpr) and node.modifier is not None:
            grouping.update(node.modifier.labels)
        elif isinstance(node, promql.BinaryExpr) and node.modifier is not None and node.modifier.matching is not None:
            grouping.update(node.modifier.matching.labels)

    promql.walk(expr, visit)
    return selectors, grouping


def test_alerts_are_absent_by_default() -> None:
    assert "PrometheusRule" not in kinds(render())


def test_alerts_render_with_the_namespace_and_labels_asked_for() -> None:
    (rule,) = of_kind(render({"alerts": {"enabled": True, "namespace": "monitoring", "labels": {"release": "kube-prom"}}}), "PrometheusRule")
    assert rule["metadata"]["namespace"] == "monitoring" and rule["metadata"]["labels"]["release"] == "kube-prom"


def test_every_alert_expression_parses_and_names_only_exported_series(exported: dict[str, set[str]]) -> None:
    """A real PromQL parser reads every expression; each series is one a sidecar exports (or one these
    rules record), and every label a matcher or a grouping names is one that series carries."""
    import promql_parser as promql

    recorded: dict[str, set[str]] = {}
    for rule in _rules():
        expr = promql.parse(rule["expr"])  # raises on a syntax error
        selectors, grouping = _selectors(expr)
        assert selectors, rule
        carried: set[str] = set()
        for selector in selectors:
            labels = exported.get(selector.name, recorded.get(selector.name))
            assert labels is not None, f"{rule.get('alert') or rule.get('record')}: nothing exports or records {selector.name}"
            carried |= labels
            matched = {m.name for m in selector.matchers.matchers}
            assert matched <= labels | TARGET_LABELS, f"{selector.name} has no label(s) {sorted(matched - labels - TARGET_LABELS)}"
        assert grouping <= carried | TARGET_LABELS, f"{rule}: groups by {sorted(grouping - carried - TARGET_LABELS)}, which no series has"
        if "record" in rule:
            recorded[rule["record"]] = grouping
    assert set(recorded) >= {"slaq:slo_error_budget", "slaq:slo_error_ratio:rate1h"}


def test_slo_alerts_follow_the_workbooks_multiwindow_multi_burn_rate_table() -> None:
    burns = [r for r in _rules() if r.get("alert") == "SlaqErrorBudgetBurn"]
    got = sorted((r["labels"]["long_window"], r["labels"]["short_window"], r["labels"]["severity"]) for r in burns)
    assert got == sorted([("1h", "5m", "critical"), ("6h", "30m", "critical"), ("1d", "2h", "warning"), ("3d", "6h", "warning")])
    factors = {"1h": "14.4", "6h": "6", "1d": "3", "3d": "1"}
    for rule in burns:
        long, short = rule["labels"]["long_window"], rule["labels"]["short_window"]
        assert f"slaq:slo_error_ratio:rate{long} > on (namespace, tenant, tier) ({factors[long]} * slaq:slo_error_budget)" in rule["expr"]
        assert f"slaq:slo_error_ratio:rate{short} > on (namespace, tenant, tier) ({factors[long]} * slaq:slo_error_budget)" in rule["expr"]
    records = {r["record"]: r["expr"] for r in _rules() if "record" in r}
    assert records["slaq:slo_error_budget"].strip() == "1 - max by (namespace, tenant, tier) (slaq_attainment_target)"
    assert 'slaq_slo_outcomes_total{outcome!="met"}[1h]' in records["slaq:slo_error_ratio:rate1h"]


def test_pool_alerts_cover_engine_down_shedding_and_quota_saturation() -> None:
    groups = _rule_groups({"alerts": {"enabled": True, "shedding": {"ratio": 0.2, "for": "5m"}, "quotaSaturation": {"severity": "warning"}}})
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    assert {"SlaqEngineDown", "SlaqSustainedShedding", "SlaqQuotaSaturation"} <= set(alerts)
    assert "slaq_sidecar_engine_up" in alerts["SlaqEngineDown"]["expr"]
    assert alerts["SlaqSustainedShedding"]["for"] == "5m" and "> 0.2" in alerts["SlaqSustainedShedding"]["expr"]
    assert alerts["SlaqQuotaSaturation"]["labels"]["severity"] == "warning"


def test_alert_values_are_checked_by_the_schema() -> None:
    assert "ratio" in render_failure({"alerts": {"enabled": True, "shedding": {"ratio": 5}}})
    assert "for" in render_failure({"alerts": {"enabled": True, "engineDown": {"for": "soon"}}})
