"""Indexed reconciliation: one TenantSLA or key Secret change costs API calls for its own pools
only (the operator's view comes from its informer's watches and Secret watches, never a list per event).

Each test counts the requests the API emulator served for one change; a full resync (listing
pools, tenants or Secrets, or rewriting every pool's table) fails it.
"""

from __future__ import annotations

import asyncio
import base64

from slaq.api.table import hash_api_key
from slaq.bench.scale_objects import KEY_NAMESPACE, OPEN_NAMESPACES, POOL_NAMESPACE, key_secret, pool_body, pool_name, tenant_body, tenant_name
from tests.operator.test_operator_kmock import create, entries, merge_patch, operator, table
from slaq.testing.kube import Call, KubeEmulator
from tests.support.polling import eventually

POOLS, MODELS, TENANTS = 3, 3, 9  # tenant j is served by pool j % 3 only


async def quiet(kube: KubeEmulator, settle_s: float = 1.0) -> int:
    """Wait until the emulator has served no request for `settle_s`; the count of requests so far."""
    while True:
        before = len(kube.calls)
        await asyncio.sleep(settle_s)
        if len(kube.calls) == before:
            return before


async def seeded(kube: KubeEmulator) -> None:
    kube.objects["v1/namespaces", None, KEY_NAMESPACE] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEY_NAMESPACE}}
    for j in range(TENANTS):
        await create(kube, key_secret(j))
        await create(kube, tenant_body(j, MODELS))
    for p in range(POOLS):
        await create(kube, pool_body(p, MODELS))
    for p in range(POOLS):
        await eventually(lambda p=p: len(entries(kube, POOL_NAMESPACE, pool_name(p))) == TENANTS // POOLS, what=f"{pool_name(p)}'s table")


def operator_calls(calls: list[Call]) -> list[Call]:
    """What the operator asked (the test's own change is the first call; open watch streams are not requests)."""
    return [c for c in calls[1:] if c.verb != "WATCH"]


async def test_a_quota_change_writes_only_the_table_of_the_pool_it_selects(kube: KubeEmulator) -> None:
    async with operator(kube, interval=3600.0, open_namespaces=OPEN_NAMESPACES):  # no usage ticks during the count
        await seeded(kube)
        await eventually(lambda: kube.read("slaq.dev/v1alpha1/tenantslas", None, tenant_name(0)).get("status", {}).get("pools"))
        mark = await quiet(kube)
        await merge_patch(kube, f"/apis/slaq.dev/v1alpha1/tenantslas/{tenant_name(0)}", {"spec": {"quotas": {"requestsPerMinute": 300}}})
        await eventually(lambda: entries(kube, POOL_NAMESPACE, pool_name(0))[tenant_name(0)].share.requests_per_minute == 300,
                         what="the new quota in the table")
        await eventually(lambda: kube.read("slaq.dev/v1alpha1/tenantslas", None, tenant_name(0))["status"]["observedGeneration"] == 2,
                         what="the tenant's status")
        await quiet(kube)
        calls = operator_calls(kube.calls[mark:])
    assert not [c for c in calls if c.verb in ("LIST", "GET")], calls  # the view answers every read
    assert [(c.verb, c.name) for c in calls if c.resource == "secrets"] == [("PATCH", f"{pool_name(0)}-tenants")]
    affected = 1
    assert len(calls) <= 2 * affected + 2, calls


async def test_a_rotated_key_rewrites_only_its_tenants_pools(kube: KubeEmulator) -> None:
    async with operator(kube, interval=3600.0, open_namespaces=OPEN_NAMESPACES):
        await seeded(kube)
        await eventually(lambda: kube.read("slaq.dev/v1alpha1/tenantslas", None, tenant_name(4)).get("status", {}).get("pools"))
        mark = await quiet(kube)
        new_key = "sk-rotated-0123456789abcdef"
        hash_key = table(kube, POOL_NAMESPACE, pool_name(4 % POOLS)).hash_key()
        await merge_patch(kube, f"/api/v1/namespaces/{KEY_NAMESPACE}/secrets/{tenant_name(4)}-keys",
                          {"data": {"key": base64.b64encode(new_key.encode()).decode()}})
        pool = pool_name(4 % POOLS)
        await eventually(lambda: entries(kube, POOL_NAMESPACE, pool)[tenant_name(4)].key_hashes == [hash_api_key(new_key, hash_key)],
                         what="the rotated key's hash in the table")
        await quiet(kube)
        calls = operator_calls(kube.calls[mark:])
    assert not [c for c in calls if c.verb in ("LIST", "GET")], calls
    assert [(c.verb, c.name) for c in calls if c.resource == "secrets"] == [("PATCH", f"{pool}-tenants")]
    assert len(calls) <= 2 * 1 + 2, calls


async def test_a_tenant_holding_the_finalizer_of_earlier_versions_is_released_on_deletion(kube: KubeEmulator) -> None:
    async with operator(kube, interval=3600.0, open_namespaces=OPEN_NAMESPACES):
        await seeded(kube)
        body = tenant_body(TENANTS, MODELS)
        body["metadata"]["finalizers"] = ["slaq.dev/finalizer"]
        await create(kube, body)
        await eventually(lambda: tenant_name(TENANTS) in entries(kube, POOL_NAMESPACE, pool_name(TENANTS % POOLS)), what="the tenant served")
        assert (await kube.delete(f"/apis/slaq.dev/v1alpha1/tenantslas/{tenant_name(TENANTS)}")).status == 202
        await eventually(lambda: kube.read("slaq.dev/v1alpha1/tenantslas", None, tenant_name(TENANTS)) is None, what="the tenant gone")
        await eventually(lambda: tenant_name(TENANTS) not in entries(kube, POOL_NAMESPACE, pool_name(TENANTS % POOLS)), what="out of its table")
