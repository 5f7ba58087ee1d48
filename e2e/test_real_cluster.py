"""The same whole-system path on a real cluster, when one is reachable (kubeconfig + kubectl).

Skipped with the reason when there is no kubeconfig, no kubectl, or the API server does not
answer. On a cluster it: applies the CRDs and the examples (CPU pool, three tenants, their keys),
runs slaq's operator in this process against the cluster, waits for the pool's Deployment to be
available (the example names no image: $SLAQ_CPU_ENGINE_IMAGE, built from engine/Dockerfile --target cpu,
is the operator's default, and the nodes must be able to pull it), sends a request
through `kubectl port-forward` to the pool's Service, applies a new TenantSLA and waits until
the running pod admits it, then deletes what it applied.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.polling import wait_for
from slaq.local.processes import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.engine]
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "crds" / "examples"
CPU_IMAGE_ENV = "SLAQ_CPU_ENGINE_IMAGE"  # the operator's default image for the example cpu pool
POOL_READY_TIMEOUT_S = 1200.0  # image pull and model load on a fresh node


def _kubeconfig() -> str | None:
    path = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    return path if all(Path(p).is_file() for p in path.split(os.pathsep)) else None


def _cluster_reason() -> str | None:
    if not os.environ.get(CPU_IMAGE_ENV):
        return (f"${CPU_IMAGE_ENV} is unset: build the cpu engine image (docker build -f engine/Dockerfile --target cpu "
                f"-t REGISTRY/slaq-engine:0.1.0-cpu .), push it where the nodes pull from, and name it there")
    if _kubeconfig() is None:
        return "no kubeconfig ($KUBECONFIG or ~/.kube/config): the real-cluster test needs a reachable cluster"
    if shutil.which("kubectl") is None:
        return "kubectl is not on PATH (scripts/setup.sh installs it)"
    probe = subprocess.run(["kubectl", "version", "--request-timeout=5s"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"the cluster in the kubeconfig does not answer: {probe.stderr.strip()[:200]}"
    return None


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result


@pytest.fixture(scope="module")
def cluster() -> None:
    reason = _cluster_reason()
    if reason:
        pytest.skip(reason)


def test_the_cpu_pool_serves_and_admits_a_new_tenant_on_a_real_cluster(cluster: None) -> None:
    from slaq.operator.client import load_connection
    from slaq.operator.images import PoolImages
    from slaq.operator.runner import OperatorOptions, OperatorThread

    applied = [EXAMPLES / "tenant-keys.yaml", EXAMPLES / "tenants.yaml", EXAMPLES / "pool-cpu.yaml"]
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        kubectl("apply", "--server-side", "-f", str(crd))
    for path in applied:
        kubectl("apply", "-f", str(path))
    new_tenant = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tenant-e2e-new-keys", "namespace": "slaq-system"},
         "type": "Opaque", "stringData": {"main": "sk-e2e-new-0123456789abcdef"}},
        {"apiVersion": "slaq.dev/v1alpha1", "kind": "TenantSLA", "metadata": {"name": "e2e-new"},
         "spec": {"tier": "standard", "objectives": {"ttftMs": 2000},
                  "apiKeySecretRef": {"name": "tenant-e2e-new-keys", "namespace": "slaq-system"}}},
    ]
    images = PoolImages(cpu=os.environ[CPU_IMAGE_ENV])
    operator = OperatorThread(load_connection(), OperatorOptions(namespace="slaq-system", observe_interval_s=5.0, images=images,
                                                                 open_namespaces=("default",)))  # the new tenant names no pools
    operator.start()
    forward = None
    try:
        kubectl("rollout", "status", "deployment/tiny-cpu", "-n", "default", f"--timeout={int(POOL_READY_TIMEOUT_S)}s")
        port = free_port()
        forward = subprocess.Popen(["kubectl", "port-forward", "-n", "default", "svc/tiny-cpu", f"{port}:http"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"

        def status(key: str) -> int:
            body = {"model": "slaq-tiny", "prompt": "hello", "max_tokens": 4}
            return httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60).status_code

        assert wait_for(lambda: status("sk-demo-vip-0123456789abcdef") == 200, 120, "a completion through the Service")
        assert status("sk-e2e-new-0123456789abcdef") == 401
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(new_tenant))
        # The kubelet refreshes the mounted Secret within its sync period (about a minute).
        wait_for(lambda: status("sk-e2e-new-0123456789abcdef") == 200, 180, "the new tenant admitted by the running pod")
    finally:
        if forward is not None:
            forward.terminate()
            forward.wait(10)
        kubectl("delete", "-f", "-", "--ignore-not-found", stdin=yaml.safe_dump_all(new_tenant), check=False)
        for path in reversed(applied):
            kubectl("delete", "-f", str(path), "--ignore-not-found", check=False)
        time.sleep(1)
        operator.stop()
