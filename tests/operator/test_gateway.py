"""The Gateway API Inference Extension InferencePool and the llm-d InferenceObjectives a slaq pool
renders (pure, each checked against its upstream CRD's schema), and the operator applying them,
reporting a cluster without those APIs, and deleting them when switched off (kmock)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from slaq.api.pool import InferencePool
from slaq.operator.children import render_deployment
from tests.support.images import TEST_IMAGES
from slaq.operator.gateway import render_gateway_inference_pool, render_inference_objectives
from tests.operator.test_operator_kmock import POOLS, create, docs, merge_patch, operator
from slaq.testing.kube import KubeEmulator
from tests.support.polling import eventually

ROOT = Path(__file__).resolve().parents[2]
GIE_CRD = Path(__file__).resolve().parent / "data" / "gie-inferencepool-v1-crd.yaml"
GIE = "inference.networking.k8s.io/v1/inferencepools"
OBJECTIVE_CRD = Path(__file__).resolve().parent / "data" / "llm-d-inferenceobjective-v1alpha2-crd.yaml"
OBJECTIVES = "llm-d.ai/v1alpha2/inferenceobjectives"
POOL_URL = "/apis/slaq.dev/v1alpha1/namespaces/inference/inferencepools/llama3-8b"


def example_pool(**gateway: Any) -> InferencePool:
    body = yaml.safe_load((ROOT / "crds" / "examples" / "pool-gpu.yaml").read_text())
    body["spec"]["gateway"] = gateway
    return TEST_IMAGES.resolve(InferencePool.model_validate(body))


def gie_schema() -> dict[str, Any]:
    return yaml.safe_load(GIE_CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def objective_schema() -> dict[str, Any]:
    (version,) = (v for v in yaml.safe_load(OBJECTIVE_CRD.read_text())["spec"]["versions"] if v["name"] == "v1alpha2")
    return version["schema"]["openAPIV3Schema"]


def test_renders_nothing_unless_asked() -> None:
    assert render_gateway_inference_pool(example_pool()) is None
    assert render_gateway_inference_pool(example_pool(inferencePool=False)) is None


def test_selects_the_deployments_pods_on_the_tenant_port_with_the_default_picker() -> None:
    pool = example_pool(inferencePool=True)
    rendered = render_gateway_inference_pool(pool)
    assert rendered is not None
    jsonschema.Draft4Validator(gie_schema()).validate(rendered)
    assert (rendered["apiVersion"], rendered["kind"]) == ("inference.networking.k8s.io/v1", "InferencePool")
    assert (rendered["metadata"]["name"], rendered["metadata"]["namespace"]) == ("llama3-8b", "inference")
    assert rendered["spec"]["selector"]["matchLabels"] == render_deployment(pool)["spec"]["selector"]["matchLabels"]
    assert rendered["spec"]["targetPorts"] == [{"number": pool.spec.sidecar.port}]
    assert pool.spec.sidecar.metrics_port not in [p["number"] for p in rendered["spec"]["targetPorts"]]
    assert rendered["spec"]["endpointPickerRef"] == {"kind": "Service", "name": "llama3-8b-epp", "port": {"number": 9002},
                                                     "failureMode": "FailClose"}


def test_one_objective_per_tier_over_the_gie_pool_with_the_tiers_order() -> None:
    assert render_inference_objectives(example_pool()) == []
    objectives = render_inference_objectives(example_pool(inferencePool=True))
    for objective in objectives:
        jsonschema.Draft4Validator(objective_schema()).validate(objective)
    assert {o["apiVersion"] for o in objectives} == {"llm-d.ai/v1alpha2"}
    assert [(o["metadata"]["name"], o["spec"]["priority"]) for o in objectives] == [
        ("llama3-8b-critical", 10), ("llama3-8b-standard", 0), ("llama3-8b-batch", -10)]  # higher first; 0 for none
    assert {(o["metadata"]["namespace"], o["spec"]["poolRef"]["group"], o["spec"]["poolRef"]["kind"], o["spec"]["poolRef"]["name"])
            for o in objectives} == {("inference", "inference.networking.k8s.io", "InferencePool", "llama3-8b")}


def test_the_objective_schema_check_can_fail() -> None:
    (objective, *_) = render_inference_objectives(example_pool(inferencePool=True))
    objective["spec"]["priority"] = "high"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(objective_schema()).validate(objective)
    del objective["spec"]["poolRef"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(objective_schema()).validate({**objective, "spec": {"priority": 1}})


def test_the_picker_can_be_named() -> None:
    pool = example_pool(inferencePool=True, endpointPicker={"name": "shared-epp", "port": 9102, "failureMode": "FailOpen"})
    ref = render_gateway_inference_pool(pool)["spec"]["endpointPickerRef"]  # type: ignore[index]
    assert ref == {"kind": "Service", "name": "shared-epp", "port": {"number": 9102}, "failureMode": "FailOpen"}


@pytest.mark.parametrize("picker", [{"port": 0}, {"failureMode": "Sometimes"}, {"name": "Not_A_Label"}])
def test_a_bad_picker_is_refused_naming_the_field(picker: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="endpointPicker|endpoint_picker"):
        example_pool(inferencePool=True, endpointPicker=picker)


def conditions(kube: KubeEmulator) -> dict[str, dict[str, Any]]:
    status = kube.read(POOLS, "inference", "llama3-8b").get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


async def create_gateway_pool(kube: KubeEmulator) -> dict[str, Any]:
    """The example tenants and the example GPU pool with `gateway.inferencePool` on; the pool as created."""
    for doc in docs("tenant-keys.yaml") + docs("tenants.yaml"):
        await create(kube, doc)
    pool = docs("pool-gpu.yaml")[0]
    pool["spec"]["gateway"] = {"inferencePool": True}
    return await create(kube, pool)


async def test_operator_reports_a_missing_gie_api_then_applies_and_deletes_the_object(kube: KubeEmulator) -> None:
    # A cluster without the Inference Extension answers 404 for its resource URLs.
    not_served = kube.fail("*", GIE, 404, times=10**6)
    async with operator(kube, interval=0.2):
        created = await create_gateway_pool(kube)
        gateway = await eventually(lambda: conditions(kube).get("GatewayInferencePool"), what="a GatewayInferencePool condition")
        assert (gateway["status"], gateway["reason"]) == ("False", "ApiNotServed")
        assert "install the Gateway API Inference Extension CRDs" in gateway["message"]
        assert (conditions(kube)["Degraded"]["status"], conditions(kube)["Degraded"]["reason"]) == ("True", "GatewayApiNotServed")
        # Everything else of the pool is served all the same.
        assert kube.read("apps/v1/deployments", "inference", "llama3-8b") is not None
        assert kube.read("v1/services", "inference", "llama3-8b") is not None

        # The CRDs are installed: the next usage tick applies the object, owned by the slaq pool.
        not_served.times = 0
        kube.install_crds([GIE_CRD])
        applied = await eventually(lambda: kube.read(GIE, "inference", "llama3-8b"), what="the GIE InferencePool")
        jsonschema.Draft4Validator(gie_schema()).validate(applied)
        assert [(r["kind"], r["uid"], r["controller"]) for r in applied["metadata"]["ownerReferences"]] == [
            ("InferencePool", created["metadata"]["uid"], True)]
        assert applied["spec"]["targetPorts"] == [{"number": 8000}]
        await eventually(lambda: conditions(kube).get("GatewayInferencePool", {}).get("status") == "True", what="Applied")
        assert conditions(kube)["Degraded"]["status"] == "False"
        assert "shared evenly over the pool's replicas" in conditions(kube)["GatewayInferencePool"]["message"]  # why 429s under uneven routing

        # Switched off: the object goes, and so does the condition.
        await merge_patch(kube, POOL_URL, {"spec": {"gateway": {"inferencePool": False}}})
        await eventually(lambda: kube.read(GIE, "inference", "llama3-8b") is None, what="the GIE InferencePool deleted")
        await eventually(lambda: "GatewayInferencePool" not in conditions(kube), what="the condition gone")


async def test_operator_leaves_a_gie_pool_it_does_not_own_alone(kube: KubeEmulator) -> None:
    kube.install_crds([GIE_CRD])
    theirs = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
              "metadata": {"name": "llama3-8b", "namespace": "inference"},
              "spec": {"selector": {"matchLabels": {"app": "theirs"}}, "targetPorts": [{"number": 8080}],
                       "endpointPickerRef": {"name": "their-epp", "port": {"number": 9002}}}}
    resp = await kube.post("/apis/inference.networking.k8s.io/v1/namespaces/inference/inferencepools", json=theirs)
    assert resp.status == 201
    pool = docs("pool-gpu.yaml")[0]
    pool["spec"]["gateway"] = {"inferencePool": True}
    async with operator(kube, interval=0.2):
        await create(kube, pool)
        gateway = await eventually(lambda: conditions(kube).get("GatewayInferencePool"), what="a GatewayInferencePool condition")
        assert (gateway["status"], gateway["reason"]) == ("False", "NameTaken")
        assert kube.read(GIE, "inference", "llama3-8b")["spec"]["selector"] == {"matchLabels": {"app": "theirs"}}


async def test_rbac_without_the_gie_kind_fails_no_pool_and_is_reported_when_used(kube: KubeEmulator) -> None:
    kube.install_crds([GIE_CRD])
    forbidden = kube.fail("*", GIE, 403, times=10**6)  # a hand-made role that leaves the kind out
    async with operator(kube, interval=0.2):
        await create(kube, docs("pool-gpu.yaml")[0])
        await eventually(lambda: "Ready" in conditions(kube), what="the pool's status written")
        assert "GatewayInferencePool" not in conditions(kube) and conditions(kube)["Degraded"]["status"] == "False"
        # the switched-off object's delete was tried and refused (by the pool's reconcile, which may
        # come after the first status an observation tick writes)
        await eventually(lambda: forbidden.times < 10**6, what="the switched-off object's delete tried")
        await merge_patch(kube, POOL_URL, {"spec": {"gateway": {"inferencePool": True}}})
        gateway = await eventually(lambda: conditions(kube).get("GatewayInferencePool"), what="a GatewayInferencePool condition")
        assert (gateway["status"], gateway["reason"]) == ("False", "Forbidden") and "get, create, patch and delete" in gateway["message"]
        assert kube.read("apps/v1/deployments", "inference", "llama3-8b") is not None


async def test_operator_applies_the_objectives_and_reports_a_cluster_without_them(kube: KubeEmulator) -> None:
    kube.install_crds([GIE_CRD])
    not_served = kube.fail("*", OBJECTIVES, 404, times=10**6)  # llm-d's CRDs not installed
    async with operator(kube, interval=0.2):
        created = await create_gateway_pool(kube)
        objectives = await eventually(lambda: conditions(kube).get("GatewayInferenceObjectives"), what="a GatewayInferenceObjectives condition")
        assert (objectives["status"], objectives["reason"]) == ("False", "ApiNotServed") and "llm-d router's CRDs" in objectives["message"]
        await eventually(lambda: conditions(kube).get("GatewayInferencePool", {}).get("status") == "True", what="the GIE pool applied")
        assert conditions(kube)["Degraded"]["status"] == "False"  # optional beside the InferencePool

        not_served.times = 0  # installed: the next usage tick applies them, owned by the slaq pool
        kube.install_crds([OBJECTIVE_CRD])
        for tier, priority in (("critical", 10), ("standard", 0), ("batch", -10)):
            applied = await eventually(lambda: kube.read(OBJECTIVES, "inference", f"llama3-8b-{tier}"), what=f"the {tier} objective")
            jsonschema.Draft4Validator(objective_schema()).validate(applied)
            assert applied["spec"]["priority"] == priority
            assert [r["uid"] for r in applied["metadata"]["ownerReferences"]] == [created["metadata"]["uid"]]
        await eventually(lambda: conditions(kube).get("GatewayInferenceObjectives", {}).get("status") == "True", what="Applied")
        assert "x-llm-d-inference-objective" in conditions(kube)["GatewayInferenceObjectives"]["message"]

        await merge_patch(kube, POOL_URL, {"spec": {"gateway": {"inferencePool": False}}})
        for tier in ("critical", "standard", "batch"):
            await eventually(lambda: kube.read(OBJECTIVES, "inference", f"llama3-8b-{tier}") is None, what=f"the {tier} objective deleted")
        await eventually(lambda: "GatewayInferenceObjectives" not in conditions(kube), what="the condition gone")
