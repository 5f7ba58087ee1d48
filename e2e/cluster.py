"""The control plane of the e2e tests without a cluster: the Kubernetes API emulator (tools/src/slaq/testing/kube.py)
served from a thread of its own, and slaq's operator (OperatorThread) reconciling against it.

Tests talk to the emulator over HTTP like to an API server (`ControlPlane.create/get`), so a
module-scoped fixture can keep one control plane for several tests while engines keep running.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from slaq.api.runtime import TENANT_TABLE_KEY
from slaq.api.table import TenantTable
from tests.support.polling import wait_for

if TYPE_CHECKING:
    from slaq.operator.pod import QuotaStoreRef

REPO_ROOT = Path(__file__).resolve().parents[1]
PLURALS = {"Secret": "secrets", "Namespace": "namespaces", "InferencePool": "inferencepools", "TenantSLA": "tenantslas"}


def resource_url(api_version: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    return f"{path}/{name}" if name else path


class ControlPlane:
    """Emulator on a background loop + the operator; `close()` stops both."""

    def __init__(self, quota_store: QuotaStoreRef | None = None) -> None:
        self.quota_store = quota_store  # the install's shared quota store, rendered into every sidecar (None: local shares)
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="kube-emulator", daemon=True)
        self.operator: Any = None
        self.http: httpx.Client | None = None

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:
            self._failure = exc
            self._ready.set()

    async def _main(self) -> None:
        import kmock

        from slaq.testing.kube import KubeEmulator

        self._stop = asyncio.Event()
        async with KubeEmulator() as emulator, kmock.Server(emulator):
            emulator.resources.load_bundled()
            emulator.install_crds(sorted((REPO_ROOT / "crds").glob("*.yaml")))
            self.url = str(emulator.url).rstrip("/")
            self._emulator = emulator
            self._ready.set()
            await self._stop.wait()

    def start(self) -> "ControlPlane":
        from slaq.operator.client import Connection
        from slaq.operator.runner import OperatorOptions, OperatorThread

        self._thread.start()
        self._ready.wait(30)
        if self._failure is not None or not self.url:
            raise RuntimeError(f"the Kubernetes API emulator did not start: {self._failure!r}")
        self.http = httpx.Client(base_url=self.url, timeout=10.0)
        # The real usage source (HttpUsageSource): it reads the pods the emulator lists, none until a
        # test registers the local pod (`register_pod`); until then quotas split on an empty demand signal.
        from tests.support.images import TEST_IMAGES  # the local pod runs this machine's programs, whatever the image

        # `default` (the CPU pool's) is open to every tenant: the tests' tenants name no pools (tables.binding).
        options = OperatorOptions(namespace="slaq-system", observe_interval_s=1.0, retry_delay_s=0.5, images=TEST_IMAGES,
                                  open_namespaces=("default",),
                                  tune={"queueing.idle_timeout": 0.5, "queueing.exit_timeout": 0.5, "scanning.disabled": True},
                                  quota_store=self.quota_store)
        self.operator = OperatorThread(Connection(server=self.url), options)
        self.operator.start()
        wait_for(lambda: self.operator.ready_flag.is_set() or not self.operator.alive, 60, "the operator to start")
        if not self.operator.alive:
            raise RuntimeError(f"the operator stopped: {self.operator.failure!r}")
        return self

    def close(self) -> None:
        try:
            if self.operator is not None:
                self.operator.stop()
        finally:
            if self.http is not None:
                self.http.close()
            if self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)

    # -- the API, as a client sees it

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self.http is not None
        body = json.loads(json.dumps(body))
        kind = body["kind"]
        if kind == "Namespace":  # kmock 0.8 cannot parse a POST to /api/v1/namespaces; store it as the tests do
            async def store() -> None:
                self._emulator.objects["v1/namespaces", None, body["metadata"]["name"]] = body

            asyncio.run_coroutine_threadsafe(store(), self._loop).result(10)
            return body
        if kind == "Secret" and "stringData" in body:  # the API server's job, which the emulator skips
            body["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in body.pop("stringData").items()}
        response = self.http.post(resource_url(body["apiVersion"], PLURALS[kind], body["metadata"].get("namespace")), json=body)
        assert response.status_code in (200, 201), f"create {kind}/{body['metadata']['name']}: {response.status_code} {response.text}"
        return response.json()

    def merge_patch(self, api_version: str, plural: str, namespace: str | None, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        assert self.http is not None
        response = self.http.patch(resource_url(api_version, plural, namespace, name), json=patch,
                                   headers={"Content-Type": "application/merge-patch+json"})
        assert response.status_code == 200, f"patch {plural}/{name}: {response.status_code} {response.text}"
        return response.json()

    def register_pod(self, namespace: str, name: str, labels: dict[str, str], ip: str = "127.0.0.1") -> None:
        """A Running pod at `ip`, as the kubelet would report the local stand-in (e2e/pod.py)."""
        assert self.http is not None
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
                "status": {"phase": "Running", "podIP": ip}}
        response = self.http.post(resource_url("v1", "pods", namespace), json=body)
        assert response.status_code in (200, 201), f"create Pod/{name}: {response.status_code} {response.text}"

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        assert self.http is not None
        response = self.http.get(resource_url(api_version, plural, namespace, name))
        return response.json() if response.status_code == 200 else None

    def table(self, namespace: str, secret_name: str) -> tuple[dict[str, str], TenantTable] | None:
        """The table Secret's files (data key -> text) and its parsed tenant table, or None while there is none."""
        secret = self.get("v1", "secrets", namespace, secret_name)
        if not secret or TENANT_TABLE_KEY not in (secret.get("data") or {}):
            return None
        files = {key: base64.b64decode(value).decode("utf-8") for key, value in secret["data"].items()}
        return files, TenantTable.model_validate_json(files[TENANT_TABLE_KEY])
