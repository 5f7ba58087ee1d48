"""`slaq operator` as a process, talking to the API emulator through a kubeconfig."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from tests.operator.test_operator_kmock import create, docs, eventually
from tests.support.images import CPU_IMAGE, IMAGE_FLAGS
from slaq.testing.kube import KubeEmulator


async def test_slaq_operator_command_reconciles_through_the_kubeconfig(kube: KubeEmulator) -> None:
    assert kube.kubeconfig is not None
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "slaq", "operator", "--namespace", "slaq-system", "--observe-interval", "1", *IMAGE_FLAGS,
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        await eventually(lambda: kube.read("v1/secrets", "slaq-system", "slaq-cache-salt-key") or process.returncode is not None,
                         timeout=60, what="the operator's first start")
        assert process.returncode is None, (await process.stderr.read()).decode()[-2000:]
        await create(kube, docs("pool-cpu.yaml")[0])
        deployment = await eventually(lambda: kube.read("apps/v1/deployments", "default", "tiny-cpu"), timeout=30, what="the pool's Deployment")
        # The example names no image: both containers run the cpu default the command was given.
        assert {c["name"]: c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]} == \
            {"sidecar": CPU_IMAGE, "engine": CPU_IMAGE}
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=30)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
    assert process.returncode == 0, (await process.stderr.read()).decode()[-2000:]


def test_attainment_flags_are_checked_before_anything_starts() -> None:
    import subprocess

    def refusal(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "slaq", "operator", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        return done.stderr

    assert "--attainment-window must be longer than --observe-interval" in refusal("--attainment-window", "10", "--observe-interval", "15")
    assert "--attainment-min-requests must be >= 1" in refusal("--attainment-min-requests", "0")
