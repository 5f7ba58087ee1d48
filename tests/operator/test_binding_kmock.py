"""A pool created with the tenants' labels in a namespace nobody opened gets no tenant, and says why
(the real operator, kopf in-process, against the API emulator)."""

from __future__ import annotations

import copy
import json
from typing import Any

from slaq.testing.kube import KubeEmulator
from tests.operator.test_operator_kmock import POOLS, TENANTS, create, docs, entries, operator, seed, table
from tests.support.polling import eventually


def refused_condition(kube: KubeEmulator, namespace: str, name: str) -> dict[str, Any] | None:
    body = kube.read(POOLS, namespace, name) or {}
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == "TenantsRefused"), None)


async def test_a_labelled_pool_in_a_foreign_namespace_gets_no_tenant_and_says_why(kube: KubeEmulator) -> None:
    copycat = copy.deepcopy(docs("pool-cpu.yaml")[0])  # the examples' labels (slaq.dev/tenancy: shared) and tenant list
    copycat["metadata"].update(name="copycat", namespace="team-x")
    async with operator(kube):
        await seed(kube)  # the example tenants name inference and default; pool-gpu.yaml (inference) lists them
        await create(kube, copycat)
        # Positive control: the pool both sides agree on holds the three tenants.
        await eventually(lambda: set(entries(kube, "inference", "llama3-8b")) == {"vip", "standard", "free"}, what="the agreed pool's table")
        condition = await eventually(lambda: refused_condition(kube, "team-x", "copycat"), what="TenantsRefused on the copycat")
        assert condition["status"] == "True" and condition["reason"] == "NotNamedByTenant"
        for name in ("vip", "standard", "free"):
            assert f"{name}: NotNamedByTenant: TenantSLA {name} names its pools in spec.pools (inference/*, default/*)" in condition["message"]
        assert table(kube, "team-x", "copycat").tenants == []
        assert kube.read(POOLS, "team-x", "copycat")["status"]["tenants"] == []
        # Nothing of the tenants' key hashes, key-hash key or salts reached team-x: its only Secret is an empty table.
        key_hash_key = table(kube, "inference", "llama3-8b").key_hash_key
        assert key_hash_key and key_hash_key not in json.dumps(kube.live("v1/secrets", "team-x"))
        vip_hash = entries(kube, "inference", "llama3-8b")["vip"].key_hashes[0]
        salt = entries(kube, "inference", "llama3-8b")["vip"].cache_salt
        foreign = json.dumps(kube.live("v1/secrets", "team-x"))
        assert vip_hash.split(":")[1] not in foreign and salt not in foreign
        assert table(kube, "team-x", "copycat").key_hash_key is None and len(kube.live("v1/secrets", "team-x")) == 1


async def test_a_pool_in_an_open_namespace_receives_the_tenants_that_name_it_without_a_list(kube: KubeEmulator) -> None:
    unlisted = copy.deepcopy(docs("pool-cpu.yaml")[0])
    del unlisted["spec"]["tenants"]  # default is open: the admin speaks for its pools
    refused = copy.deepcopy(docs("pool-gpu.yaml")[0])
    del refused["spec"]["tenants"]  # inference is not open and the pool lists nobody: the tenants are not accepted
    async with operator(kube, open_namespaces=("default",)):
        for doc in docs("tenant-keys.yaml") + docs("tenants.yaml") + [unlisted, refused]:
            await create(kube, doc)
        await eventually(lambda: set(entries(kube, "default", "tiny-cpu")) == {"vip", "standard", "free"}, what="the open namespace's pool")
        condition = await eventually(lambda: refused_condition(kube, "inference", "llama3-8b"), what="TenantsRefused on the unlisted pool")
        assert condition["reason"] == "NotAccepted" and "spec.tenants does not list vip" in condition["message"]
        vip = await eventually(lambda: (kube.read(TENANTS, None, "vip").get("status") or {}).get("pools"), what="vip's shares")
        assert [share["pool"] for share in vip] == ["default/tiny-cpu"]  # its whole quota on the one pool that agreed
