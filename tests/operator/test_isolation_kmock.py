"""One bad object cannot break the control plane (operator against the API emulator).

Each test breaks one object the way a user or a tenant could, and checks that the problem is
named on that object's status while the other pools' tables keep changing: a positive control
(a quota change reaching another pool's table) runs beside every fault.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
from typing import Any

import pytest

from slaq.api.table import LEGACY_KEY_HASH_PREFIX, TenantEntry, TenantTable, derive_key_hash_key, hash_api_key
from slaq.api.runtime import TENANT_TABLE_KEY
from slaq.operator import reconciler, tables
from slaq.operator.names import SALT_SECRET_NAME
from tests.operator.test_operator_kmock import POOLS, TENANTS, create, docs, entries, merge_patch, table
from tests.operator.test_operator_kmock import operator as kmock_operator
from slaq.testing.kube import KubeEmulator
from tests.support.polling import eventually

GPU, CPU = ("inference", "llama3-8b"), ("default", "tiny-cpu")


def condition(kube: KubeEmulator, plural: str, namespace: str | None, name: str, type_: str) -> dict[str, Any]:
    body = kube.read(plural, namespace, name) or {}
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def operator(kube: KubeEmulator, **settings: Any) -> Any:
    """The operator with the examples' namespaces open to every tenant (unless a test says otherwise):
    these tests add tenants the example pools do not list (tables.binding)."""
    return kmock_operator(kube, **{"open_namespaces": ("inference", "default"), **settings})


def key_secret(name: str, tenant: str | None, namespace: str = "slaq-system", **keys: str) -> dict[str, Any]:
    labels = {"slaq.dev/tenant": tenant} if tenant else {}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "stringData": keys}


def tenant(name: str, secret: str, namespace: str = "slaq-system", model: str | None = None, **spec: Any) -> dict[str, Any]:
    """A standard tenant bound to the example pools (or to the pools of `model`)."""
    body = copy.deepcopy(docs("tenants.yaml")[1])
    body["metadata"] = {"name": name}
    body["spec"]["apiKeySecretRef"] = {"name": secret, "namespace": namespace}
    if model is not None:
        body["spec"]["poolSelector"] = {"matchLabels": {"slaq.dev/model": model}}
    body["spec"].update(spec)
    return body


async def seeded(kube: KubeEmulator) -> None:
    """The examples: three tenants on both example pools."""
    for doc in docs("tenant-keys.yaml") + docs("tenants.yaml") + docs("pool-gpu.yaml") + docs("pool-cpu.yaml"):
        await create(kube, doc)
    for where in (GPU, CPU):
        await eventually(lambda where=where: len(entries(kube, *where)) == 3, what=f"{where}'s table")


async def still_written(kube: KubeEmulator, where: tuple[str, str], rpm: int) -> None:
    """The positive control: a quota change of `vip` reaches `where`'s table while the fault stands."""
    await merge_patch(kube, "/apis/slaq.dev/v1alpha1/tenantslas/vip", {"spec": {"quotas": {"requestsPerMinute": rpm}}})
    await eventually(lambda: entries(kube, *where)["vip"].share.requests_per_minute == rpm // 2, timeout=15,
                     what=f"vip's new quota in {where}'s table despite the broken object")


async def test_a_key_namespace_the_operator_may_not_list_is_reported_and_blocks_nothing(kube: KubeEmulator) -> None:
    kube.objects["v1/namespaces", None, "locked"] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "locked"}}
    kube.fail("GET", "v1/secrets", 403, times=10**6, namespace="locked")  # the Role does not cover it
    async with operator(kube, key_secret_namespaces=("locked",)):
        await seeded(kube)
        await create(kube, tenant("stuck", "stuck-keys", namespace="locked"))
        # planned before the first listing failed, or after: either way the status comes to say why
        degraded = await eventually(lambda: condition(kube, TENANTS, None, "stuck", "Degraded").get("reason") == "KeysUnavailable"
                                    and "403" in condition(kube, TENANTS, None, "stuck", "Degraded").get("message", "")
                                    and condition(kube, TENANTS, None, "stuck", "Degraded"), what="stuck's KeysUnavailable naming the 403")
        assert "namespace locked" in degraded["message"] and "rbac.secretNamespaces" in degraded["message"]
        await still_written(kube, CPU, 500)
        assert entries(kube, *GPU)["stuck"].key_hashes == []  # served by no key until its Secrets can be read


async def test_a_table_too_large_for_one_pool_is_reported_there_and_the_others_are_written(
        kube: KubeEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tables, "MAX_TABLE_PARTS", 1)
    for module in (tables, reconciler):
        monkeypatch.setattr(module, "SECRET_DATA_LIMIT", 6000)  # three example tenants fit; 60 more keys do not
    keys = {f"k{i}": secrets.token_urlsafe(24) for i in range(60)}
    async with operator(kube):
        await seeded(kube)
        await create(kube, key_secret("heavy-keys", "heavy", **keys))
        await create(kube, tenant("heavy", "heavy-keys", model="llama3-8b"))  # binds the GPU pool only
        await eventually(lambda: condition(kube, POOLS, *GPU, "Degraded").get("reason") == "TableTooLarge", timeout=15,
                         what="the GPU pool's TableTooLarge")
        blocked = await eventually(lambda: condition(kube, TENANTS, None, "heavy", "Degraded").get("reason") == "TableTooLarge"
                                   and condition(kube, TENANTS, None, "heavy", "Degraded"), what="heavy's TableTooLarge")
        assert GPU[0] + "/" + GPU[1] in blocked["message"]
        # The table last written stays in force: heavy's 60 keys never reached it. (heavy may be in it
        # with no key: planned before the operator's watch delivered heavy-keys, it was served by none.)
        written = entries(kube, *GPU)
        assert "heavy" not in written or written["heavy"].key_hashes == [], written.get("heavy")
        await still_written(kube, CPU, 500)


async def test_a_pool_namespace_without_secret_writes_is_reported_there_and_the_others_are_written(kube: KubeEmulator) -> None:
    # The chart's default Roles grant Secret writes only in rbac.poolNamespaces: a pool elsewhere
    # says why it has no table, the other pools' tables keep changing, and granting heals it.
    forbidden = kube.fail("*", "v1/secrets", 403, times=10**6, namespace=GPU[0])
    async with operator(kube):
        for doc in docs("tenant-keys.yaml") + docs("tenants.yaml") + docs("pool-gpu.yaml") + docs("pool-cpu.yaml"):
            await create(kube, doc)
        degraded = await eventually(lambda: condition(kube, POOLS, *GPU, "Degraded").get("reason") == "SecretsForbidden"
                                    and condition(kube, POOLS, *GPU, "Degraded"), timeout=15, what="the GPU pool's SecretsForbidden")
        assert f"namespace {GPU[0]}" in degraded["message"] and "rbac.poolNamespaces" in degraded["message"]
        vip = await eventually(lambda: condition(kube, TENANTS, None, "vip", "Degraded").get("reason") == "SecretsForbidden"
                               and condition(kube, TENANTS, None, "vip", "Degraded"), what="vip's SecretsForbidden")
        assert "/".join(GPU) in vip["message"]
        assert kube.read("v1/secrets", GPU[0], "llama3-8b-tenants") is None
        await still_written(kube, CPU, 500)

        forbidden.times = 0  # the namespace added to rbac.poolNamespaces
        await eventually(lambda: len(entries(kube, *GPU)) == 3, timeout=15, what="the GPU pool's table once writes are granted")
        await eventually(lambda: condition(kube, POOLS, *GPU, "Degraded").get("status") == "False", timeout=15,
                         what="the GPU pool no longer degraded")


async def test_more_keys_than_max_keys_are_refused_and_the_keys_accepted_before_stay(kube: KubeEmulator) -> None:
    first = secrets.token_urlsafe(24)
    async with operator(kube):
        await seeded(kube)
        await create(kube, key_secret("many-keys", "many", a=first))
        await create(kube, tenant("many", "many-keys", maxKeys=2))
        hash_key = table(kube, *CPU).hash_key()
        await eventually(lambda: entries(kube, *CPU).get("many") and entries(kube, *CPU)["many"].key_hashes == [hash_api_key(first, hash_key)])
        more = {f"k{i}": base64.b64encode(secrets.token_urlsafe(24).encode()).decode() for i in range(3)}
        await merge_patch(kube, "/api/v1/namespaces/slaq-system/secrets/many-keys", {"data": more})
        refused = await eventually(lambda: condition(kube, TENANTS, None, "many", "Degraded").get("reason") == "TooManyKeys"
                                   and condition(kube, TENANTS, None, "many", "Degraded"), what="TooManyKeys")
        assert "4 keys, more than spec.maxKeys (2)" in refused["message"]
        assert entries(kube, *CPU)["many"].key_hashes == [hash_api_key(first, hash_key)]


async def test_a_secret_of_another_tenant_gives_its_keys_to_nobody_else(kube: KubeEmulator) -> None:
    async with operator(kube):
        await seeded(kube)
        await create(kube, tenant("thief", "tenant-vip-keys"))  # points at vip's Secret
        refused = await eventually(lambda: condition(kube, TENANTS, None, "thief", "Degraded").get("reason") == "KeySecretNotLabelled"
                                   and condition(kube, TENANTS, None, "thief", "Degraded"), what="thief refused")
        assert "slaq.dev/tenant=vip, not thief" in refused["message"]
        hash_key = table(kube, *CPU).hash_key()
        await eventually(lambda: "thief" in entries(kube, *CPU))
        assert entries(kube, *CPU)["thief"].key_hashes == []
        assert entries(kube, *CPU)["vip"].key_hashes == [hash_api_key("sk-demo-vip-0123456789abcdef", hash_key)]


async def test_a_key_in_two_tenants_secrets_is_refused_on_both(kube: KubeEmulator) -> None:
    shared, own = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    async with operator(kube):
        await seeded(kube)
        await create(kube, key_secret("one-keys", "one", a=shared, b=own))
        await create(kube, tenant("one", "one-keys"))
        await eventually(lambda: "one" in entries(kube, *CPU) and len(entries(kube, *CPU)["one"].key_hashes) == 2)
        await create(kube, key_secret("two-keys", "two", a=shared))
        await create(kube, tenant("two", "two-keys"))
        for name, other in (("one", "two"), ("two", "one")):
            refused = await eventually(lambda name=name: condition(kube, TENANTS, None, name, "Degraded").get("reason") == "DuplicateKey"
                                       and condition(kube, TENANTS, None, name, "Degraded"), what=f"{name}'s DuplicateKey")
            assert f"also keys of tenant(s) {other}" in refused["message"]
        hash_key = table(kube, *CPU).hash_key()
        await eventually(lambda: entries(kube, *CPU)["one"].key_hashes == [hash_api_key(own, hash_key)]
                         and entries(kube, *CPU)["two"].key_hashes == [], what="the shared key in neither entry")


async def test_a_weak_key_is_refused_by_the_name_of_its_entry_never_its_value(kube: KubeEmulator) -> None:
    strong = secrets.token_urlsafe(24)
    async with operator(kube):
        await seeded(kube)
        await create(kube, key_secret("weak-keys", "weak", good=strong, short="hunter2", same="a" * 40))
        await create(kube, tenant("weak", "weak-keys"))
        refused = await eventually(lambda: condition(kube, TENANTS, None, "weak", "Degraded").get("reason") == "WeakKey"
                                   and condition(kube, TENANTS, None, "weak", "Degraded"), what="WeakKey")
        assert "data.short is shorter than 24 characters" in refused["message"] and "data.same" in refused["message"]
        assert "hunter2" not in json.dumps(kube.read(TENANTS, None, "weak"))
        hash_key = table(kube, *CPU).hash_key()
        assert entries(kube, *CPU)["weak"].key_hashes == [hash_api_key(strong, hash_key)]


async def test_an_empty_pool_selector_binds_only_open_namespaces(kube: KubeEmulator) -> None:
    async with operator(kube, open_namespaces=("default",)):
        await seeded(kube)
        await create(kube, key_secret("open-keys", "open", a=secrets.token_urlsafe(24)))
        await create(kube, tenant("open", "open-keys", poolSelector={}))
        await eventually(lambda: "open" in entries(kube, *CPU), what="bound to the pool of the open namespace")
        assert "open" not in entries(kube, *GPU)  # namespace inference is not open: an InferencePool there does not get it


async def test_a_foreign_object_of_a_childs_name_is_reported_not_taken_over(kube: KubeEmulator) -> None:
    foreign = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "tiny-cpu", "namespace": "default", "labels": {"team": "web"}},
               "spec": {"ports": [{"port": 80}]}}
    kube.preload("v1/services", foreign)
    async with operator(kube):
        await seeded(kube)
        taken = await eventually(lambda: condition(kube, POOLS, *CPU, "Degraded").get("reason") == "NameTaken"
                                 and condition(kube, POOLS, *CPU, "Degraded"), what="NameTaken")
        assert "Service default/tiny-cpu" in taken["message"]
        service = kube.read("v1/services", "default", "tiny-cpu")
        assert "ownerReferences" not in service["metadata"] and service["spec"]["ports"] == [{"port": 80}]
        assert kube.read("apps/v1/deployments", "default", "tiny-cpu") is not None  # the rest of the pool is applied
        # The CPU pool has no autoscaling: an HPA of its name that it does not own is not deleted either.
        hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "tiny-cpu", "namespace": "default"},
               "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "maxReplicas": 3}}
        kube.preload("autoscaling/v2/horizontalpodautoscalers", hpa)
        await merge_patch(kube, "/apis/slaq.dev/v1alpha1/namespaces/default/inferencepools/tiny-cpu", {"spec": {"replicas": {"max": 2}}})
        await eventually(lambda: kube.read("apps/v1/deployments", "default", "tiny-cpu")["metadata"]["generation"] > 1
                         or kube.read(POOLS, *CPU)["status"].get("observedGeneration") == 2, what="the pool reconciled again")
        assert kube.read("autoscaling/v2/horizontalpodautoscalers", "default", "tiny-cpu") is not None


async def test_a_table_of_an_earlier_operator_is_rewritten_with_keyed_hashes(kube: KubeEmulator) -> None:
    pool = await create(kube, docs("pool-cpu.yaml")[0])
    for doc in docs("tenant-keys.yaml") + docs("tenants.yaml"):
        await create(kube, doc)
    legacy = TenantTable(pool="default/tiny-cpu", revision="old", tenants=[TenantEntry(
        name="vip", tier="critical", ttft_ms=50.0, key_hashes=[hash_api_key("sk-demo-vip-0123456789abcdef")], cache_salt="s" * 64)])
    owner = {"apiVersion": pool["apiVersion"], "kind": "InferencePool", "name": "tiny-cpu", "uid": pool["metadata"]["uid"],
             "controller": True, "blockOwnerDeletion": True}
    kube.preload("v1/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {
        "name": "tiny-cpu-tenants", "namespace": "default", "ownerReferences": [owner]},
        "data": {TENANT_TABLE_KEY: base64.b64encode(legacy.model_dump_json(by_alias=True).encode()).decode()}})
    async with operator(kube):
        await eventually(lambda: len(entries(kube, *CPU)) == 3, what="the table rewritten")
        pepper = base64.b64decode(kube.read("v1/secrets", "slaq-system", SALT_SECRET_NAME)["data"]["key"])
        rewritten = table(kube, *CPU)
        assert rewritten.hash_key() == derive_key_hash_key(pepper)
        assert not any(h.startswith(LEGACY_KEY_HASH_PREFIX) for e in rewritten.tenants for h in e.key_hashes)
        assert rewritten.tenants[2].key_hashes == [hash_api_key("sk-demo-vip-0123456789abcdef", rewritten.hash_key())]
