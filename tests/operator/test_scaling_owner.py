"""One autoscaler per pool: when another HPA (KEDA's, from the chart's autoscaling.keda.pools) scales a
pool whose spec.autoscaling is on, the operator leaves its own HPA out and says so on the pool's
status; once the other one is gone, its HPA comes back (kmock)."""

from __future__ import annotations

from typing import Any

from tests.operator.test_gateway import conditions
from tests.operator.test_operator_kmock import create, docs, operator
from slaq.testing.kube import KubeEmulator
from tests.support.polling import eventually

HPAS = "autoscaling/v2/horizontalpodautoscalers"
HPA_URL = "/apis/autoscaling/v2/namespaces/inference/horizontalpodautoscalers"


def keda_hpa(target: str) -> dict[str, Any]:
    """The HPA KEDA makes for a ScaledObject `<target>-sla-risk`, as the chart renders it."""
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": f"keda-hpa-{target}-sla-risk", "namespace": "inference",
                     "ownerReferences": [{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": f"{target}-sla-risk",
                                          "uid": "keda-uid", "controller": True}]},
        "spec": {"scaleTargetRef": {"apiVersion": "slaq.dev/v1alpha1", "kind": "InferencePool", "name": target},
                 "minReplicas": 1, "maxReplicas": 4, "metrics": []},
    }


async def test_the_operator_yields_the_pool_to_another_autoscaler_and_says_so(kube: KubeEmulator) -> None:
    async with operator(kube, interval=0.2):
        for doc in docs("tenant-keys.yaml") + docs("tenants.yaml"):
            await create(kube, doc)
        await create(kube, docs("pool-gpu.yaml")[0])  # spec.autoscaling.enabled: true
        await eventually(lambda: kube.read(HPAS, "inference", "llama3-8b"), what="the operator's HPA")
        # An HPA on another pool's scale subresource is no rival.
        assert (await kube.post(HPA_URL, json=keda_hpa("other-pool"))).status == 201

        assert (await kube.post(HPA_URL, json=keda_hpa("llama3-8b"))).status == 201
        await eventually(lambda: kube.read(HPAS, "inference", "llama3-8b") is None, what="the operator's HPA removed")
        degraded = await eventually(lambda: (c := conditions(kube).get("Degraded")) and c["reason"] == "ScaledByAnother" and c,
                                    what="Degraded: ScaledByAnother")
        assert degraded["status"] == "True"
        assert "keda-hpa-llama3-8b-sla-risk (made by ScaledObject llama3-8b-sla-risk)" in degraded["message"]
        assert "spec.autoscaling.enabled false" in degraded["message"]
        assert kube.read(HPAS, "inference", "keda-hpa-llama3-8b-sla-risk") is not None  # the other one is left alone

        assert (await kube.delete(f"{HPA_URL}/keda-hpa-llama3-8b-sla-risk")).status in (200, 202)
        await eventually(lambda: kube.read(HPAS, "inference", "llama3-8b"), what="the operator's HPA back")
        await eventually(lambda: conditions(kube)["Degraded"]["status"] == "False", what="not Degraded any more")


async def test_a_role_that_may_not_list_hpas_keeps_the_pools_own(kube: KubeEmulator) -> None:
    forbidden = kube.fail("GET", HPAS, 403, times=10**6)  # a hand-made role without `list`
    async with operator(kube, interval=0.2):
        for doc in docs("tenant-keys.yaml") + docs("tenants.yaml"):
            await create(kube, doc)
        await create(kube, docs("pool-gpu.yaml")[0])
        await eventually(lambda: kube.read(HPAS, "inference", "llama3-8b"), what="the operator's HPA")
        await eventually(lambda: "Ready" in conditions(kube), what="the pool's status written")
        assert forbidden.times < 10**6 and conditions(kube)["Degraded"]["status"] == "False"
