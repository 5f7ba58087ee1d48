"""The images a pool's two containers run: the ones the pool names, else the operator's defaults.

A pool that names `spec.engine.image` runs its sidecar from that image too unless it names
`spec.sidecar.image` (the engine image carries the sidecar): such a pool renders as it did before
pools could name a second image. A pool that names no engine image takes the operator's default
for its device and the operator's default sidecar image (falling back to that engine image).
The operator's defaults are the chart's `pools.images` (docs/decisions/0022-an-image-per-process.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from slaq.api.pool import Device, InferencePool
from slaq.operator.errors import SpecError


@dataclass(frozen=True)
class PoolImages:
    """The operator's default images (`slaq operator --default-gpu-image ...`); None: no default."""

    gpu: str | None = None  # engine/Dockerfile, target gpu
    cpu: str | None = None  # engine/Dockerfile, target cpu
    sidecar: str | None = None  # sidecar/Dockerfile

    def engine_for(self, device: Device) -> str | None:
        return self.gpu if device is Device.GPU else self.cpu

    def resolve(self, pool: InferencePool) -> InferencePool:
        """The pool with both images named; SpecError (spec.engine.image) when it names no engine
        image and the operator has no default for its device."""
        engine, sidecar = pool.spec.engine, pool.spec.sidecar
        engine_image = engine.image or self.engine_for(engine.device)
        if engine_image is None:
            raise SpecError("InferencePool", pool.metadata.name, "spec.engine.image",
                            f"unset, and the operator has no default {engine.device.value} engine image: name an image built "
                            f"from engine/Dockerfile (target {engine.device.value}) here, or install the chart with "
                            f"pools.images.{engine.device.value} set")
        sidecar_image = sidecar.image or (engine.image if engine.image else self.sidecar) or engine_image
        if (engine_image, sidecar_image) == (engine.image, sidecar.image):
            return pool
        spec = pool.spec.model_copy(update={"engine": engine.model_copy(update={"image": engine_image}),
                                            "sidecar": sidecar.model_copy(update={"image": sidecar_image})})
        return pool.model_copy(update={"spec": spec})
