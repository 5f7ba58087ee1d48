"""The default pool images the tests start the operator with (the chart's pools.images): the example
pools name none, as a pool that follows the chart's default does (docs/decisions/0022-an-image-per-process.md)."""

from __future__ import annotations

from slaq.operator.images import PoolImages

GPU_IMAGE = "registry.test/slaq-engine:0.1.0"
CPU_IMAGE = "registry.test/slaq-engine:0.1.0-cpu"
TEST_IMAGES = PoolImages(gpu=GPU_IMAGE, cpu=CPU_IMAGE)
# `slaq operator` and `slaq render` given the same defaults.
IMAGE_FLAGS = ("--default-gpu-image", GPU_IMAGE, "--default-cpu-image", CPU_IMAGE)
