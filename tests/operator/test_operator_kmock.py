"""The kopf operator, run in-process against the Kubernetes API emulator (tools/src/slaq/testing/kube.py)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from slaq.api.runtime import TENANT_TABLE_KEY, TenantUsage, UsageReport
from slaq.bench.scale_objects import KEY_NAMESPACE
from slaq.api.table import TenantTable, derive_key_hash_key, hash_api_key
from slaq.operator.client import Connection
from slaq.operator.names import SALT_SECRET_NAME
from slaq.operator.runner import OperatorOptions, OperatorThread
from slaq.operator.usage import PodObservation, StaticUsageSource
from slaq.testing.kube import KubeEmulator
from tests.support.images import TEST_IMAGES
from tests.support.polling import eventually

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"
POOLS = "slaq.dev/v1alpha1/inferencepools"
TENANTS = "slaq.dev/v1alpha1/tenantslas"


@asynccontextmanager
async def operator(kube: KubeEmulator, usage: StaticUsageSource | None = None, interval: float = 0.3,
                   **settings: Any) -> AsyncIterator[None]:
    """The operator on a loop of its own (OperatorThread); the test's loop, serving the emulator,
    is never blocked: it only polls and awaits. Key Secrets may live in its namespace and in the
    scale objects' KEY_NAMESPACE; pools naming no image run TEST_IMAGES; `settings`: further OperatorOptions."""
    options = OperatorOptions(namespace="slaq-system", observe_interval_s=interval, retry_delay_s=0.2,
                              **{"key_secret_namespaces": (KEY_NAMESPACE,), "images": TEST_IMAGES, **settings},
                              tune={"queueing.idle_timeout": 0.5, "queueing.exit_timeout": 0.5,
                                    # One discovery at start: fewer watch restarts in a short test.
                                    "scanning.disabled": True})
    op = OperatorThread(Connection(server=str(kube.url).rstrip("/")), options, usage_source=usage or StaticUsageSource())
    op.start()
    await eventually(lambda: op.ready_flag.is_set() or not op.alive, what="operator ready")
    try:
        assert op.alive, op.failure
        yield
    finally:
        await asyncio.to_thread(op.stop)


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


async def create(kube: KubeEmulator, body: dict[str, Any]) -> dict[str, Any]:
    group_version = body["apiVersion"]
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    plural = {"Secret": "secrets", "Namespace": "namespaces", "InferencePool": "inferencepools", "TenantSLA": "tenantslas"}[body["kind"]]
    if body["kind"] == "Namespace":
        kube.objects["v1/namespaces", None, body["metadata"]["name"]] = body
        return body
    body = json.loads(json.dumps(body))
    if body["kind"] == "Secret" and "stringData" in body:
        body["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in body.pop("stringData").items()}
    ns = body["metadata"].get("namespace")
    resp = await kube.post(f"{base}/namespaces/{ns}/{plural}" if ns else f"{base}/{plural}", json=body)
    assert resp.status == 201, await resp.text()
    return await resp.json()


async def merge_patch(kube: KubeEmulator, path: str, patch: dict[str, Any]) -> None:
    resp = await kube.patch(path, json=patch, headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status == 200, await resp.text()


def table(kube: KubeEmulator, namespace: str, pool: str) -> TenantTable:
    secret = kube.read("v1/secrets", namespace, f"{pool}-tenants")
    assert secret is not None, "no table Secret yet"
    return TenantTable.model_validate_json(base64.b64decode(secret["data"][TENANT_TABLE_KEY]))


def entries(kube: KubeEmulator, namespace: str, pool: str) -> dict[str, Any]:
    return {t.name: t for t in table(kube, namespace, pool).tenants}


async def seed(kube: KubeEmulator, pool_file: str = "pool-gpu.yaml") -> dict[str, Any]:
    for doc in docs("tenant-keys.yaml") + docs("tenants.yaml"):
        await create(kube, doc)
    return await create(kube, docs(pool_file)[0])


CHILDREN = [("apps/v1/deployments", "llama3-8b"), ("v1/services", "llama3-8b"), ("policy/v1/poddisruptionbudgets", "llama3-8b"),
            ("autoscaling/v2/horizontalpodautoscalers", "llama3-8b"), ("v1/secrets", "llama3-8b-tenants")]


async def test_pool_and_three_tenants_give_owned_children_and_tables(kube: KubeEmulator) -> None:
    async with operator(kube):
        pool = await seed(kube)
        uid = pool["metadata"]["uid"]
        for resource, name in CHILDREN:
            child = await eventually(lambda: kube.read(resource, "inference", name), what=f"{resource}/{name}")
            refs = child["metadata"]["ownerReferences"]
            assert [(r["kind"], r["name"], r["uid"], r["controller"]) for r in refs] == [("InferencePool", "llama3-8b", uid, True)]
        got = await eventually(lambda: len(entries(kube, "inference", "llama3-8b")) == 3 and entries(kube, "inference", "llama3-8b"),
                               what="three tenants in the table")
        # Keyed hashes: HMAC-SHA256 under a key derived from the operator's secret, which the table carries.
        pepper = base64.b64decode(kube.read("v1/secrets", "slaq-system", SALT_SECRET_NAME)["data"]["key"])
        hash_key = table(kube, "inference", "llama3-8b").hash_key()
        assert hash_key == derive_key_hash_key(pepper)
        assert got["vip"].key_hashes == [hash_api_key("sk-demo-vip-0123456789abcdef", hash_key)]
        assert got["free"].key_hashes == [hash_api_key("sk-demo-free-0123456789abcdef", hash_key)]
        # One replica: it holds the whole cluster-wide quota.
        assert got["vip"].share.requests_per_minute == 600 and got["vip"].share.max_concurrency == 32
        assert got["standard"].share.tokens_per_minute == 1_200_000
        assert len({e.cache_salt for e in got.values()}) == 3
        assert "sk-demo" not in json.dumps([kube.read("v1/secrets", "inference", "llama3-8b-tenants")])
        # Status tells a person what is happening.
        status = await eventually(lambda: (s := kube.read(POOLS, "inference", "llama3-8b").get("status")) and s.get("conditions") and s)
        assert status["selector"] == "app.kubernetes.io/name=slaq,slaq.dev/pool=llama3-8b"
        assert status["tenants"] == ["free", "standard", "vip"] and status["observedGeneration"] == 1
        vip = await eventually(lambda: kube.read(TENANTS, None, "vip")["status"]["pools"] and kube.read(TENANTS, None, "vip")["status"])
        assert vip["keyCount"] == 1 and vip["pools"][0]["pool"] == "inference/llama3-8b"
        # No SLO outcomes reported yet: too few requests to judge attainment.
        assert {c["type"]: c["status"] for c in vip["conditions"]} == {"Ready": "True", "Degraded": "False", "AtRisk": "Unknown",
                                                                  "QuotaSplit": "True"}


async def test_quota_update_and_tenant_delete_follow_into_tables(kube: KubeEmulator) -> None:
    async with operator(kube):
        await seed(kube)
        await eventually(lambda: len(entries(kube, "inference", "llama3-8b")) == 3)
        await merge_patch(kube, "/apis/slaq.dev/v1alpha1/tenantslas/vip", {"spec": {"quotas": {"requestsPerMinute": 300, "maxConcurrency": 4}}})
        await eventually(lambda: entries(kube, "inference", "llama3-8b")["vip"].share.requests_per_minute == 300, what="new quota")
        assert entries(kube, "inference", "llama3-8b")["vip"].share.max_concurrency == 4
        assert (await kube.delete("/apis/slaq.dev/v1alpha1/tenantslas/free")).status in (200, 202)
        await eventually(lambda: set(entries(kube, "inference", "llama3-8b")) == {"vip", "standard"}, what="free removed")
        await eventually(lambda: kube.read(TENANTS, None, "free") is None, what="finalizer released")


async def test_pool_delete_leaves_children_garbage_collectable(kube: KubeEmulator) -> None:
    async with operator(kube):
        await seed(kube)
        for resource, name in CHILDREN:
            await eventually(lambda: kube.read(resource, "inference", name))
        # 202: the pool carries kopf's finalizer while its usage timer runs.
        assert (await kube.delete("/apis/slaq.dev/v1alpha1/namespaces/inference/inferencepools/llama3-8b")).status in (200, 202)
        # kopf stops the pool's timer, runs the delete handler and releases its finalizer; on a
        # loaded machine its consistency waits (5 s each) can add up.
        await eventually(lambda: kube.read(POOLS, "inference", "llama3-8b") is None, timeout=45, what="the pool gone")
        collected = {(str(key[0].plural), key[2]) for key in kube.collect_garbage()}
        assert {(r.rsplit("/", 1)[1], n) for r, n in CHILDREN} <= collected
        assert kube.read("v1/secrets", "slaq-system", SALT_SECRET_NAME) is not None  # not owned by a pool


async def test_restart_mid_way_converges_without_duplicates(kube: KubeEmulator) -> None:
    async with operator(kube):
        await create(kube, docs("pool-gpu.yaml")[0])
        await eventually(lambda: kube.read("apps/v1/deployments", "inference", "llama3-8b"))
        salt_key = kube.read("v1/secrets", "slaq-system", SALT_SECRET_NAME)["data"]
    # While the operator is down: tenants arrive and the pool is scaled.
    for doc in docs("tenant-keys.yaml") + docs("tenants.yaml"):
        await create(kube, doc)
    await merge_patch(kube, "/apis/slaq.dev/v1alpha1/namespaces/inference/inferencepools/llama3-8b", {"spec": {"replicas": {"desired": 3}}})
    async with operator(kube):
        await eventually(lambda: len(entries(kube, "inference", "llama3-8b")) == 3, what="tenants after restart")
        await eventually(lambda: kube.read("apps/v1/deployments", "inference", "llama3-8b")["spec"]["replicas"] == 3)
        salts = {n: e.cache_salt for n, e in entries(kube, "inference", "llama3-8b").items()}
    async with operator(kube):
        await eventually(lambda: kube.read(POOLS, "inference", "llama3-8b")["status"]["replicas"] is not None)
        assert {n: e.cache_salt for n, e in entries(kube, "inference", "llama3-8b").items()} == salts
    assert kube.read("v1/secrets", "slaq-system", SALT_SECRET_NAME)["data"] == salt_key
    for resource, name in [*CHILDREN, ("v1/secrets", SALT_SECRET_NAME)]:
        assert sum(1 for o in kube.live(resource) if o["metadata"]["name"] == name) == 1, resource
    assert len(kube.live("apps/v1/deployments")) == 1 and len(kube.live("v1/services")) == 1
    # Three replicas now: each holds a third of the quota.
    assert entries(kube, "inference", "llama3-8b")["vip"].share.requests_per_minute == 200


async def test_api_conflicts_and_server_errors_are_retried(kube: KubeEmulator) -> None:
    # A child is first created (POST), then server-side applied (PATCH) once it is known to be the pool's.
    faults = [
        kube.fail("POST", "apps/v1/deployments", 500, times=2),
        kube.fail("POST", "v1/services", 409),  # "exists", then not found by the ownership test: tried again
        kube.fail("PATCH", "v1/services", 409),
    ]
    async with operator(kube):
        await seed(kube)
        for resource, name in CHILDREN:
            await eventually(lambda: kube.read(resource, "inference", name), what=f"{resource}/{name} despite errors")
        await eventually(lambda: len(entries(kube, "inference", "llama3-8b")) == 3)
    assert [f.times for f in faults] == [0, 0, 0]


async def test_bad_tenant_is_refused_permanently_with_the_field_named(kube: KubeEmulator, caplog: pytest.LogCaptureFixture) -> None:
    async with operator(kube):
        await seed(kube)
        bad = docs("tenants.yaml")[2]
        bad["metadata"]["name"] = "broken"
        bad["spec"]["quotas"]["requestsPerMinute"] = -5
        await create(kube, bad)

        def refusal() -> dict[str, Any]:
            conditions = kube.read(TENANTS, None, "broken")["status"]["conditions"]
            return {c["type"]: c for c in conditions}

        conditions = await eventually(refusal, what="an InvalidSpec condition")
        assert conditions["Ready"]["status"] == "False" and conditions["Ready"]["reason"] == "InvalidSpec"
        assert "spec.quotas.requestsPerMinute" in conditions["Ready"]["message"]
        assert "greater than or equal to 0" in conditions["Ready"]["message"]
        # Logged once with the field named; nothing retries it until the spec changes.
        await eventually(lambda: "refused: TenantSLA broken: spec.quotas.requestsPerMinute" in caplog.text)
        await eventually(lambda: len(entries(kube, "inference", "llama3-8b")) == 3)
        assert "broken" not in entries(kube, "inference", "llama3-8b")


def report(pool: str, **rpm: float) -> list[PodObservation]:
    return [PodObservation("pod-0", UsageReport(pool=pool, tenants={t: TenantUsage(requests_per_minute=v) for t, v in rpm.items()}), sla_risk=0.42)]


async def test_shares_follow_observed_demand_across_pools(kube: KubeEmulator) -> None:
    usage = StaticUsageSource({"inference/llama3-8b": report("inference/llama3-8b", vip=300.0)})
    async with operator(kube, usage, interval=0.2):
        await seed(kube)
        await create(kube, docs("pool-cpu.yaml")[0])
        await eventually(lambda: "vip" in entries(kube, "default", "tiny-cpu") and "vip" in entries(kube, "inference", "llama3-8b"))

        def shifted() -> bool:
            busy = entries(kube, "inference", "llama3-8b")["vip"].share.requests_per_minute
            idle = entries(kube, "default", "tiny-cpu")["vip"].share.requests_per_minute
            return busy > 500 and idle >= 30 and busy + idle <= 600

        await eventually(shifted, what="shares moving toward demand")
        status = await eventually(lambda: kube.read(POOLS, "inference", "llama3-8b")["status"].get("slaRisk") is not None
                                  and kube.read(POOLS, "inference", "llama3-8b")["status"])
        assert status["slaRisk"] == 0.42
        vip = await eventually(lambda: (p := kube.read(TENANTS, None, "vip")["status"]["pools"]) and len(p) == 2 and p)
        assert {p["pool"]: p["observedRequestsPerMinute"] for p in vip} == {"inference/llama3-8b": 300.0, "default/tiny-cpu": 0.0}


async def test_scale_subresource_drives_the_deployment_within_bounds(kube: KubeEmulator) -> None:
    async with operator(kube):
        await seed(kube)
        await eventually(lambda: kube.read("apps/v1/deployments", "inference", "llama3-8b"))
        scale_url = "/apis/slaq.dev/v1alpha1/namespaces/inference/inferencepools/llama3-8b/scale"
        await merge_patch(kube, scale_url, {"spec": {"replicas": 3}})
        await eventually(lambda: kube.read("apps/v1/deployments", "inference", "llama3-8b")["spec"]["replicas"] == 3)
        await merge_patch(kube, scale_url, {"spec": {"replicas": 10}})
        await eventually(lambda: kube.read("apps/v1/deployments", "inference", "llama3-8b")["spec"]["replicas"] == 4, what="clamped to max")
        scale = await (await kube.get(scale_url)).json()
        assert scale["spec"]["replicas"] == 10
        assert scale["status"]["selector"] == "app.kubernetes.io/name=slaq,slaq.dev/pool=llama3-8b"
