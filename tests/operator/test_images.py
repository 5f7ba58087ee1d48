"""A pool's two images: the ones it names, else the operator's defaults (operator/src/slaq/operator/images.py).

A pool that names no sidecar image renders as before pools could name one; one that names it runs
its sidecar from it and changes nothing else; one that names no image at all takes the defaults or
is refused with the field named."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from slaq.api.pool import InferencePool
from slaq.operator.errors import SpecError
from slaq.operator.images import PoolImages
from slaq.operator.pod import render_pod_template
from slaq.testing.kube import KubeEmulator
from tests.operator.test_operator_kmock import POOLS, create, docs, operator
from tests.support.images import CPU_IMAGE, GPU_IMAGE, TEST_IMAGES
from tests.support.polling import eventually

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"
# What the CRD's former default wrote into every pool stored before pools named their own images.
STORED_IMAGE = "ghcr.io/slaq-dev/slaq:0.1.0"
SLIM_SIDECAR = "registry.test/slaq-sidecar:0.1.0"
DEFAULTS = PoolImages(gpu=GPU_IMAGE, cpu=CPU_IMAGE, sidecar="registry.test/slaq-sidecar:default")


def body(name: str = "pool-gpu.yaml", **engine: Any) -> dict[str, Any]:
    raw = yaml.safe_load((EXAMPLES / name).read_text())
    raw["spec"]["engine"].update(engine)
    return raw


def images(pod: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["image"] for c in pod["spec"]["containers"]}


def without_images(pod: dict[str, Any]) -> dict[str, Any]:
    bare = copy.deepcopy(pod)
    for container in bare["spec"]["containers"]:
        del container["image"]
    return bare


def test_a_stored_pool_naming_its_image_runs_both_containers_from_it_whatever_the_defaults() -> None:
    pool = InferencePool.model_validate(body(image=STORED_IMAGE))
    resolved = DEFAULTS.resolve(pool)
    assert (resolved.spec.engine.image, resolved.spec.sidecar.image) == (STORED_IMAGE, STORED_IMAGE)
    assert images(render_pod_template(resolved)) == {"sidecar": STORED_IMAGE, "engine": STORED_IMAGE}
    assert render_pod_template(resolved) == render_pod_template(pool)
    # The field left out and the field set to the engine's image render the same pod.
    named = InferencePool.model_validate({**body(image=STORED_IMAGE), "spec": {**body(image=STORED_IMAGE)["spec"],
                                                                              "sidecar": {"image": STORED_IMAGE}}})
    assert render_pod_template(named) == render_pod_template(pool)


def test_a_named_sidecar_image_changes_the_sidecar_containers_image_and_nothing_else() -> None:
    plain = InferencePool.model_validate(body(image=STORED_IMAGE))
    raw = body(image=STORED_IMAGE)
    raw["spec"]["sidecar"] = {"image": SLIM_SIDECAR}
    slim = DEFAULTS.resolve(InferencePool.model_validate(raw))
    assert images(render_pod_template(slim)) == {"sidecar": SLIM_SIDECAR, "engine": STORED_IMAGE}
    assert without_images(render_pod_template(slim)) == without_images(render_pod_template(plain))


@pytest.mark.parametrize(("name", "engine_image"), [("pool-gpu.yaml", GPU_IMAGE), ("pool-cpu.yaml", CPU_IMAGE)])
def test_a_pool_naming_no_image_takes_its_devices_default_and_the_default_sidecar(name: str, engine_image: str) -> None:
    pool = DEFAULTS.resolve(InferencePool.model_validate(body(name)))
    assert images(render_pod_template(pool)) == {"sidecar": "registry.test/slaq-sidecar:default", "engine": engine_image}
    # No default sidecar image: the engine's (it carries the sidecar).
    pool = TEST_IMAGES.resolve(InferencePool.model_validate(body(name)))
    assert images(render_pod_template(pool)) == {"sidecar": engine_image, "engine": engine_image}


def test_a_pool_naming_no_image_without_a_default_for_its_device_is_refused_naming_the_field() -> None:
    pool = InferencePool.model_validate(body("pool-cpu.yaml"))
    with pytest.raises(SpecError) as refused:
        PoolImages(gpu=GPU_IMAGE).resolve(pool)
    assert refused.value.field == "spec.engine.image"
    assert "no default cpu engine image" in refused.value.message and "pools.images.cpu" in refused.value.message
    # The renderer never guesses one.
    with pytest.raises(ValueError, match="spec.engine.image is unset"):
        render_pod_template(pool)


async def test_the_operator_refuses_a_pool_naming_no_image_on_its_status_when_it_has_no_default(kube: KubeEmulator) -> None:
    async with operator(kube, images=PoolImages()):
        for doc in docs("tenant-keys.yaml") + docs("tenants.yaml"):
            await create(kube, doc)
        await create(kube, docs("pool-cpu.yaml")[0])

        def refusal() -> dict[str, Any]:
            conditions = (kube.read(POOLS, "default", "tiny-cpu").get("status") or {}).get("conditions") or []
            return {c["type"]: c for c in conditions}

        conditions = await eventually(refusal, what="an InvalidSpec condition on the pool")
        assert conditions["Ready"]["status"] == "False" and conditions["Ready"]["reason"] == "InvalidSpec"
        assert "spec.engine.image" in conditions["Ready"]["message"] and "pools.images.cpu" in conditions["Ready"]["message"]
        assert kube.read("apps/v1/deployments", "default", "tiny-cpu") is None
