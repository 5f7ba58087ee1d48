"""`kubectl scale inferencepool` works through the CRD's scale subresource (kubectl against the emulator)."""

from __future__ import annotations

import asyncio
import os
import shutil

import pytest

from tests.operator.test_operator_kmock import create, docs, eventually, operator
from slaq.testing.kube import KubeEmulator

KUBECTL = shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (scripts/setup.sh installs it)")
async def test_kubectl_scale_moves_the_deployment(kube: KubeEmulator) -> None:
    async with operator(kube):
        await create(kube, docs("pool-gpu.yaml")[0])
        await eventually(lambda: kube.read("apps/v1/deployments", "inference", "llama3-8b"))
        process = await asyncio.create_subprocess_exec(
            KUBECTL, "--kubeconfig", str(kube.kubeconfig), "-n", "inference", "scale", "inferencepool/llama3-8b", "--replicas=3",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "HOME": str(kube.kubeconfig.parent)})
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0, err.decode()
        assert "scaled" in out.decode()
        await eventually(lambda: kube.read("apps/v1/deployments", "inference", "llama3-8b")["spec"]["replicas"] == 3)
