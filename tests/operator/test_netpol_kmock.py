"""Each pool's NetworkPolicy, applied by the real operator (kopf, in-process) in the pool's namespace."""

from __future__ import annotations

from typing import Any

from slaq.api.runtime import METRICS_PORT_NAME, SIDECAR_PORT_NAME
from slaq.testing.kube import KubeEmulator
from tests.operator.test_operator_kmock import merge_patch, operator, seed
from tests.support.polling import eventually

POLICIES = "networking.k8s.io/v1/networkpolicies"
POOL_PATH = "/apis/slaq.dev/v1alpha1/namespaces/inference/inferencepools/llama3-8b"


def in_namespace(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}


def peers(policy: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {rule["ports"][0]["port"]: rule["from"] for rule in policy["spec"]["ingress"]}


async def test_a_pool_outside_the_operators_namespace_gets_its_policy_in_its_own(kube: KubeEmulator) -> None:
    async with operator(kube, monitoring_namespaces=("prometheus",)):
        pool = await seed(kube)  # pool-gpu.yaml: namespace inference; the operator's is slaq-system
        policy = await eventually(lambda: kube.read(POLICIES, "inference", "llama3-8b"), what="the pool's NetworkPolicy")
        assert [(r["kind"], r["name"], r["uid"], r["controller"]) for r in policy["metadata"]["ownerReferences"]] == [
            ("InferencePool", "llama3-8b", pool["metadata"]["uid"], True)]  # garbage-collected with the pool
        assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "slaq", "slaq.dev/pool": "llama3-8b"}
        assert peers(policy) == {SIDECAR_PORT_NAME: [in_namespace("inference")],
                                 METRICS_PORT_NAME: [in_namespace("prometheus"), in_namespace("slaq-system")]}
        assert kube.live(POLICIES, "slaq-system") == []  # nothing of the pool's lands in the operator's namespace

        gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway-system"}}}
        await merge_patch(kube, POOL_PATH, {"spec": {"network": {"ingressFrom": [gateway]}}})
        await eventually(lambda: peers(kube.read(POLICIES, "inference", "llama3-8b"))[SIDECAR_PORT_NAME] == [gateway],
                         what="the tenant port admitting the gateway named in spec.network.ingressFrom")


async def test_with_policies_off_the_operator_renders_none(kube: KubeEmulator) -> None:
    async with operator(kube, network_policies=False):
        await seed(kube)
        await eventually(lambda: kube.read("apps/v1/deployments", "inference", "llama3-8b"), what="the pool's Deployment")
        assert kube.read(POLICIES, "inference", "llama3-8b") is None
