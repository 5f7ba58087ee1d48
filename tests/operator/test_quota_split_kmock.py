"""A concurrency quota below the replica count, end to end in the operator (against the API emulator):
the units go to the pods with most demand, and the TenantSLA and pool status say so with the numbers."""

from __future__ import annotations

from typing import Any

from slaq.api.runtime import TenantUsage, UsageReport
from slaq.operator.usage import PodObservation, StaticUsageSource
from slaq.testing.kube import KubeEmulator
from tests.operator.test_operator_kmock import POOLS, TENANTS, create, docs, entries, merge_patch, operator
from tests.support.polling import eventually

POOL = "inference/llama3-8b"
PODS = [f"llama3-8b-7f9c-{i}" for i in range(8)]


def observations() -> list[PodObservation]:
    """Eight pods; vip sends to six of them, pod i at 10 * (i + 1) requests per minute."""
    return [PodObservation(pod, UsageReport(pool=POOL, tenants={"vip": TenantUsage(requests_per_minute=10.0 * (i + 1))} if i < 6 else {}))
            for i, pod in enumerate(PODS)]


def quota_condition(body: dict[str, Any] | None) -> dict[str, Any] | None:
    return next((c for c in ((body or {}).get("status") or {}).get("conditions") or [] if c["type"] == "QuotaSplit"), None)


async def test_a_concurrency_quota_below_the_replicas_is_placed_on_demand_and_reported(kube: KubeEmulator) -> None:
    async with operator(kube, StaticUsageSource({POOL: observations()}), interval=0.2):
        tenants = docs("tenants.yaml")
        vip = next(t for t in tenants if t["metadata"]["name"] == "vip")
        vip["spec"]["quotas"]["maxConcurrency"] = 4
        pool = docs("pool-gpu.yaml")[0]
        pool["spec"]["replicas"] = {"min": 8, "max": 8, "desired": 8}
        for doc in docs("tenant-keys.yaml") + tenants + [pool]:
            await create(kube, doc)

        expected = "maxConcurrency 4 over 8 replica(s): 4 of the 8 hold a share (4 of the 6 with demand)"
        tenant_cond = await eventually(lambda: (c := quota_condition(kube.read(TENANTS, None, "vip"))) and expected in c["message"] and c,
                                       what="the tenant's QuotaSplit condition with the numbers")
        assert tenant_cond["status"] == "False" and tenant_cond["reason"] == "QuotaBelowReplicas"
        # Waited for with its numbers: before the first usage tick the pool's condition already names
        # vip, with no replica holding a share yet ("none has demand yet").
        pool_expected = "tenant vip: maxConcurrency 4 over 8 replica(s): 4 of this pool's 8 hold a share (4 of the 6 with demand)"
        pool_cond = await eventually(
            lambda: (c := quota_condition(kube.read(POOLS, "inference", "llama3-8b"))) and pool_expected in c["message"] and c,
            what="the pool's QuotaSplit condition with the numbers")
        assert pool_cond["status"] == "False" and pool_cond["reason"] == "QuotaBelowReplicas"
        assert "tenant free" not in pool_cond["message"]  # maxConcurrency 8 over 8: one each

        # The table: the four pods with most demand hold one concurrent request each; the rest none.
        entry = entries(kube, "inference", "llama3-8b")["vip"]
        assert entry.share.max_concurrency == 0
        assert [entry.share_for(pod).max_concurrency for pod in PODS] == [0, 0, 1, 1, 1, 1, 0, 0]
        assert entries(kube, "inference", "llama3-8b")["free"].share.max_concurrency == 1 and not entries(kube, "inference", "llama3-8b")["free"].pod_shares
        # Every pod with demand sends requests per minute in proportion; the rpm shares sum within 600.
        rpm = [entry.share_for(pod).requests_per_minute for pod in PODS]
        assert sum(rpm) <= 600 and rpm[5] > rpm[0] > rpm[7] > 0

        # Enough units for every replica: the condition clears (the negative control).
        await merge_patch(kube, "/apis/slaq.dev/v1alpha1/tenantslas/vip", {"spec": {"quotas": {"maxConcurrency": 8}}})
        cleared = await eventually(lambda: (c := quota_condition(kube.read(TENANTS, None, "vip"))) and c["status"] == "True" and c,
                                   what="QuotaSplit True once the quota covers the replicas")
        assert cleared["reason"] == "EveryReplica"
        await eventually(lambda: (c := quota_condition(kube.read(POOLS, "inference", "llama3-8b"))) and c["status"] == "True",
                         what="the pool's condition clears too")
        assert min(entries(kube, "inference", "llama3-8b")["vip"].share_for(pod).max_concurrency for pod in PODS) >= 1
