"""The chart's RBAC allows every API call the real operator makes, and little more.

The operator (slaq.operator.runner.run_operator, as `slaq operator` runs it, with the real
HttpUsageSource) runs against the Kubernetes API emulator (tools/src/slaq/testing/kube.py) through a whole
life cycle of the example pool and tenants: create, a pod whose sidecar (a local stand-in on
the metrics port) reports a tenant missing its SLO (an AtRisk Event), quota change, autoscaling
switched off, the Inference Extension InferencePool switched on and off, tenant deleted, pool
deleted. Every request it sends is recorded as the (verb, group, resource,
namespace) the API server would authorize, and checked against the rules the rendered chart
grants its ServiceAccount. A rule nobody used fails too, unless it is listed below with why.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp.web
import pytest
import yaml

from tests.helm.chart import NAMESPACE, RELEASE, render
from tests.helm.rbac import ApiCall, Grants, Rule, grants_for, verbs_of
from tests.support import polling

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"
GIE_CRD = Path(__file__).resolve().parents[1] / "operator" / "data" / "gie-inferencepool-v1-crd.yaml"
GIE = "inference.networking.k8s.io/v1/inferencepools"
OBJECTIVE_CRD = GIE_CRD.with_name("llm-d-inferenceobjective-v1alpha2-crd.yaml")
OBJECTIVES = "llm-d.ai/v1alpha2/inferenceobjectives"
SERVICE_ACCOUNT = f"{RELEASE}-operator"
POOL = "llama3-8b"
POOL_NAMESPACE = "inference"
# The test's own requests to the emulator carry this header, so they are not counted as the operator's.
TEST_CLIENT_HEADER = "X-Slaq-Test-Client"
# The documented install (README.md, On a cluster): the chart in slaq-system told that pools live in `inference`.
DOCUMENTED = {"rbac": {"poolNamespaces": [POOL_NAMESPACE]}}
SECRET_WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}

# Granted although the life cycle below never makes the call, each with the reason.
# (Empty: every granted verb is exercised.)
GRANTED_UNUSED: dict[tuple[str, str, str], str] = {
    ("", "secrets", "delete"): "the parts of a tenant table split over several Secrets that a shrunk table no longer needs",
    ("slaq.dev", "tenantslas", "patch"): "releasing the slaq.dev/finalizer earlier versions put on TenantSLAs, when one is deleted",
}

eventually = functools.partial(polling.eventually, timeout=20.0)


def call_of(request: Any) -> set[ApiCall]:
    """The authorization checks one recorded request needs; empty for discovery (non-resource) URLs."""
    if request.resource is None or request.resource.plural is None or TEST_CLIENT_HEADER in request.headers:
        return set()
    resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
    watch = str(request.params.get("watch", "")).lower() in ("true", "1")
    content_type = request.headers.get("Content-Type", "")
    return {ApiCall(verb, request.resource.group or "", resource, request.namespace)
            for verb in verbs_of(request.method.value, request.name, watch, content_type)}


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text(encoding="utf-8")) if d]


async def _send(kube: Any, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
    response = await kube.request(method, path, json=body, headers={"Content-Type": content_type, TEST_CLIENT_HEADER: "1"})
    assert response.status < 300, f"{method} {path}: {response.status} {await response.text()}"
    return await response.json()


async def _create(kube: Any, body: dict[str, Any]) -> None:
    body = json.loads(json.dumps(body))
    kind, meta = body["kind"], body["metadata"]
    if kind == "Namespace":
        kube.objects["v1/namespaces", None, meta["name"]] = body
        return
    if kind == "Secret" and "stringData" in body:
        body["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in body.pop("stringData").items()}
    plural = {"Secret": "secrets", "InferencePool": "inferencepools", "TenantSLA": "tenantslas"}[kind]
    base = "/api/v1" if body["apiVersion"] == "v1" else f"/apis/{body['apiVersion']}"
    await _send(kube, "POST", f"{base}/namespaces/{meta['namespace']}/{plural}" if meta.get("namespace") else f"{base}/{plural}", body)


@asynccontextmanager
async def running_operator(kube: Any) -> AsyncIterator[None]:
    from slaq.operator.client import Connection
    from slaq.operator.runner import OperatorOptions, run_operator

    stop, ready = asyncio.Event(), asyncio.Event()
    from tests.support.images import TEST_IMAGES

    options = OperatorOptions(namespace=NAMESPACE, observe_interval_s=0.3, retry_delay_s=0.2, images=TEST_IMAGES,
                              # kopf polls an exiting timer every 60 s by default, which would hold the
                              # pool's finalizer for a minute after deletion; the calls are the same.
                              tune={"queueing.idle_timeout": 0.5, "queueing.exit_timeout": 0.5,
                                    "background.cancellation_polling": 0.2})
    task = asyncio.create_task(run_operator(Connection(server=str(kube.url).rstrip("/")), options, stop_flag=stop, ready_flag=ready))
    await eventually(lambda: ready.is_set() or task.done(), what="operator ready")
    if task.done():
        task.result()
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=20)


@asynccontextmanager
async def missing_sidecar() -> AsyncIterator[int]:
    """A stand-in sidecar metrics port whose tenant `vip` misses its TTFT objective 30 more times
    per scrape; yields its port."""
    from slaq.api.runtime import METRICS_PATH, USAGE_PATH, UsageReport

    misses = [0]

    async def metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        misses[0] += 30
        labels = 'outcome="ttft_missed",tenant="vip",tier="critical"'
        return aiohttp.web.Response(text=f"# TYPE slaq_slo_outcomes counter\nslaq_slo_outcomes_total{{{labels}}} {misses[0]}\n")

    async def usage(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response(UsageReport(pool=f"{POOL_NAMESPACE}/{POOL}").to_wire())

    app = aiohttp.web.Application()
    app.router.add_get(METRICS_PATH, metrics)
    app.router.add_get(USAGE_PATH, usage)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def _vip_events(kube: Any) -> list[dict[str, Any]]:
    return [e for e in kube.live("v1/events", "default") if e["involvedObject"]["name"] == "vip"]


def _table_tenants(kube: Any) -> set[str]:
    secret = kube.read("v1/secrets", POOL_NAMESPACE, f"{POOL}-tenants")
    assert secret is not None
    return {t["name"] for t in json.loads(base64.b64decode(next(iter(secret["data"].values()))))["tenants"]}


_RECORDED: dict[str, set[ApiCall]] = {}  # one life cycle serves every test of the module


@pytest.fixture
async def recorded_calls(kube: Any, caplog: pytest.LogCaptureFixture) -> set[ApiCall]:
    """Every API call of one operator life cycle over the example pool and tenants."""
    # `slaq operator` logs at INFO; so must the run, or kopf would skip what it does with those records.
    caplog.set_level(logging.INFO)
    if "calls" not in _RECORDED:
        _RECORDED["calls"] = await _record_life_cycle(kube)
    return _RECORDED["calls"]


async def _record_life_cycle(kube: Any) -> set[ApiCall]:
    pools = f"/apis/slaq.dev/v1alpha1/namespaces/{POOL_NAMESPACE}/inferencepools/{POOL}"
    kube.install_crds([GIE_CRD, OBJECTIVE_CRD])
    async with running_operator(kube), missing_sidecar() as metrics_port:
        for doc in docs("tenant-keys.yaml") + docs("tenants.yaml") + docs("pool-gpu.yaml"):
            await _create(kube, doc)
        await eventually(lambda: kube.read("autoscaling/v2/horizontalpodautoscalers", POOL_NAMESPACE, POOL), what="the pool's HPA")
        await eventually(lambda: _table_tenants(kube) == {"vip", "standard", "free"}, what="three tenants in the table")
        await eventually(lambda: any(c.resource == "pods" for r in list(kube) for c in call_of(r)), what="a usage read of the pool's pods")

        await _send(kube, "PATCH", pools, {"spec": {"sidecar": {"metricsPort": metrics_port}}}, "application/merge-patch+json")
        pod = {"metadata": {"name": f"{POOL}-0", "labels": {"app.kubernetes.io/name": "slaq", "slaq.dev/pool": POOL}},
               "status": {"phase": "Running", "podIP": "127.0.0.1"}}
        await _send(kube, "POST", f"/api/v1/namespaces/{POOL_NAMESPACE}/pods", pod)
        await eventually(lambda: _vip_events(kube), what="an AtRisk event for tenant vip")

        await _send(kube, "PATCH", pools, {"spec": {"gateway": {"inferencePool": True}}}, "application/merge-patch+json")
        await eventually(lambda: kube.read(GIE, POOL_NAMESPACE, POOL), what="the Inference Extension InferencePool")
        await eventually(lambda: kube.read(OBJECTIVES, POOL_NAMESPACE, f"{POOL}-batch"), what="the llm-d InferenceObjectives")
        await _send(kube, "PATCH", pools, {"spec": {"gateway": {"inferencePool": False}}}, "application/merge-patch+json")
        await eventually(lambda: kube.read(GIE, POOL_NAMESPACE, POOL) is None, what="the Inference Extension InferencePool deleted")
        await eventually(lambda: kube.read(OBJECTIVES, POOL_NAMESPACE, f"{POOL}-batch") is None, what="the InferenceObjectives deleted")

        await _send(kube, "PATCH", "/apis/slaq.dev/v1alpha1/tenantslas/standard",
                    {"spec": {"quotas": {"requestsPerMinute": 60}}}, "application/merge-patch+json")
        await _send(kube, "PATCH", pools, {"spec": {"autoscaling": {"enabled": False}}}, "application/merge-patch+json")
        await eventually(lambda: kube.read("autoscaling/v2/horizontalpodautoscalers", POOL_NAMESPACE, POOL) is None, what="HPA removed")

        await _send(kube, "DELETE", "/apis/slaq.dev/v1alpha1/tenantslas/free")
        await eventually(lambda: _table_tenants(kube) == {"vip", "standard"}, what="tenant free removed from the table")
        await eventually(lambda: kube.read("slaq.dev/v1alpha1/tenantslas", None, "free") is None, what="tenant free finalized")

        await _send(kube, "DELETE", pools)
        await eventually(lambda: kube.read("slaq.dev/v1alpha1/inferencepools", POOL_NAMESPACE, POOL) is None, what="pool finalized")
    return {call for request in list(kube) for call in call_of(request)}


def _denied(grants: Grants, calls: set[ApiCall]) -> list[str]:
    return [str(call) for call in sorted(calls) if not grants.allows(call)]


async def test_documented_rbac_allows_every_call_the_operator_makes(recorded_calls: set[ApiCall]) -> None:
    grants = grants_for(render(DOCUMENTED), SERVICE_ACCOUNT, NAMESPACE)
    assert recorded_calls, "the operator made no API calls: the recording is broken"
    denied = _denied(grants, recorded_calls)
    assert not denied, "the chart's RBAC would refuse:\n" + "\n".join(denied)


async def test_documented_rbac_grants_nothing_the_operator_does_not_use(recorded_calls: set[ApiCall]) -> None:
    used = {(c.group, c.resource, c.verb) for c in recorded_calls}
    granted = {t for rule in grants_for(render(DOCUMENTED), SERVICE_ACCOUNT, NAMESPACE).rules() for t in rule.triples()}
    unused = sorted(t for t in granted - used if t not in GRANTED_UNUSED)
    assert not unused, "granted but never used by the operator (remove, or list in GRANTED_UNUSED with why): " + repr(unused)


async def test_secret_reads_can_be_confined_to_named_namespaces(recorded_calls: set[ApiCall]) -> None:
    # The example tenants keep their keys in slaq-system, the release namespace, where the
    # operator also keeps its cache-salt key: confining reads there must refuse nothing.
    grants = grants_for(render({"rbac": {"secretNamespaces": [NAMESPACE], "poolNamespaces": [POOL_NAMESPACE]}}), SERVICE_ACCOUNT, NAMESPACE)
    assert not _denied(grants, recorded_calls)
    assert not grants.allows(ApiCall("get", "", "secrets", "kube-system"))
    assert grants.allows(ApiCall("get", "", "secrets", NAMESPACE))


def _cluster_wide_secret_writes(objects: list[dict[str, Any]]) -> list[str]:
    """The write verbs on Secrets any rendered ClusterRole grants, as `role: verb`."""
    return [f"{o['metadata']['name']}: {verb}" for o in objects if o["kind"] == "ClusterRole" for rule in o.get("rules") or []
            if "" in rule.get("apiGroups", []) and {"secrets", "*"} & set(rule.get("resources", []))
            for verb in sorted(SECRET_WRITE_VERBS & set(rule.get("verbs", [])))]


@pytest.mark.parametrize("values", [None, DOCUMENTED], ids=["default", "documented-install"])
def test_no_cluster_wide_secret_writes_unless_asked(values: dict[str, Any] | None) -> None:
    objects = render(values)
    assert not _cluster_wide_secret_writes(objects)
    grants = grants_for(objects, SERVICE_ACCOUNT, NAMESPACE)
    for verb in ("create", "patch", "delete"):
        assert not grants.allows(ApiCall(verb, "", "secrets", "kube-system"))
        assert grants.allows(ApiCall(verb, "", "secrets", NAMESPACE))  # the cache-salt key; pools in the release namespace
        assert grants.allows(ApiCall(verb, "", "secrets", POOL_NAMESPACE)) == (values is not None)


def test_cluster_wide_secret_writes_are_an_explicit_choice() -> None:
    objects = render({"rbac": {"clusterWideSecretWrites": True}})
    assert _cluster_wide_secret_writes(objects) == ["slaq-operator: create", "slaq-operator: delete", "slaq-operator: patch"]
    assert not [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-tables")]
    assert grants_for(objects, SERVICE_ACCOUNT, NAMESPACE).allows(ApiCall("patch", "", "secrets", "anywhere"))


async def test_default_rbac_refuses_only_the_table_writes_in_an_unnamed_pool_namespace(recorded_calls: set[ApiCall]) -> None:
    # Without rbac.poolNamespaces the example pool's namespace gets no Role: what the operator
    # cannot do there is write the pool's tenant table, and nothing else (the negative control
    # of the documented install's value).
    denied = {call for call in recorded_calls if not grants_for(render(), SERVICE_ACCOUNT, NAMESPACE).allows(call)}
    assert denied and {(c.verb, c.resource, c.namespace) for c in denied} <= {(v, "secrets", POOL_NAMESPACE) for v in ("create", "patch", "delete")}


def test_rules_have_no_wildcards() -> None:
    for obj in render({"rbac": {"secretNamespaces": ["team-a"]}}):
        for rule in obj.get("rules") or []:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []) and not any("*" in v for v in rule.get(key, [])), (obj["metadata"]["name"], rule)


def test_checker_semantics() -> None:
    rule = Rule.parse({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "patch"]})
    assert rule.allows(ApiCall("get", "apps", "deployments", "x"))
    assert not rule.allows(ApiCall("delete", "apps", "deployments", "x"))
    assert not rule.allows(ApiCall("get", "", "deployments", "x"))
    assert not rule.allows(ApiCall("patch", "apps", "deployments/status", "x"))
    assert verbs_of("PATCH", "n", False, "application/apply-patch+yaml") == {"patch", "create"}
    assert verbs_of("GET", None, True, "") == {"watch"} and verbs_of("GET", None, False, "") == {"list"}
    namespaced = Grants(by_namespace={"a": [rule]})
    assert namespaced.allows(ApiCall("get", "apps", "deployments", "a"))
    assert not namespaced.allows(ApiCall("get", "apps", "deployments", "b"))
    assert not namespaced.allows(ApiCall("get", "apps", "deployments", None))


async def test_every_rule_is_needed_by_some_recorded_call(recorded_calls: set[ApiCall]) -> None:
    objects = render(DOCUMENTED)
    for role in [o for o in objects if o["kind"] in ("ClusterRole", "Role")]:
        for index, rule in enumerate(role["rules"]):
            if all((g, r, v) in GRANTED_UNUSED for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]):
                continue
            trimmed = [o if o is not role else {**role, "rules": role["rules"][:index] + role["rules"][index + 1:]} for o in objects]
            where = f"{role['kind']} {role['metadata'].get('namespace') or ''}/{role['metadata']['name']}"
            assert _denied(grants_for(trimmed, SERVICE_ACCOUNT, NAMESPACE), recorded_calls), f"no recorded call needs {rule} of {where}"
