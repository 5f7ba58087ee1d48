"""A small async Kubernetes API client: get, list, server-side apply, status patch, delete.

kopf talks to the API for its own watching and progress; the operator's own reads and writes
(children, tables, statuses) go through this client, so tests point both at the same emulator.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from slaq.operator.errors import NotFound, RetryableApiError, api_error
from slaq.operator.names import MANAGER

PLURALS: dict[str, str] = {
    "Deployment": "deployments",
    "Service": "services",
    "Secret": "secrets",
    "Pod": "pods",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "InferencePool": "inferencepools",
    "TenantSLA": "tenantslas",
}
IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate; `token_file` is re-read (tokens rotate)."""

    server: str
    token: str | None = None
    token_file: Path | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False
    extra_headers: dict[str, str] = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        headers = dict(self.extra_headers)
        token = self.token_file.read_text(encoding="utf-8").strip() if self.token_file else self.token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https"):
            return False
        if self.insecure:
            return False
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def kopf_login(self) -> Any:
        """The same credentials as kopf's ConnectionInfo."""
        import kopf

        return kopf.ConnectionInfo(
            server=self.server, token=self.headers().get("Authorization", "").removeprefix("Bearer ") or None,
            ca_path=self.ca_file, certificate_path=self.cert_file, private_key_path=self.key_file,
            insecure=self.insecure or None,
        )


def load_connection() -> Connection:
    """In-cluster service account when running in a pod, else the current kubeconfig context."""
    import os

    if os.environ.get("KUBERNETES_SERVICE_HOST") and (IN_CLUSTER_DIR / "token").exists():
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        return Connection(server=f"https://{host}:{port}", token_file=IN_CLUSTER_DIR / "token", ca_file=str(IN_CLUSTER_DIR / "ca.crt"))
    from kubernetes import client, config
    from kubernetes.config import kube_config

    configuration = client.Configuration()
    config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or kube_config.KUBE_CONFIG_DEFAULT_LOCATION,
                            client_configuration=configuration)
    token = configuration.api_key.get("authorization", "").removeprefix("Bearer ").strip() or None
    return Connection(server=configuration.host, token=token, ca_file=configuration.ssl_ca_cert,
                      cert_file=configuration.cert_file, key_file=configuration.key_file,
                      insecure=not configuration.verify_ssl)


def resource_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None,
                  subresource: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


class KubeClient:
    def __init__(self, connection: Connection, *, timeout_s: float = 30.0) -> None:
        self._connection = connection
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, *, body: Any = None, content_type: str = "application/json",
                       params: dict[str, str] | None = None) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = self._connection.server.rstrip("/") + path
        headers = {**self._connection.headers(), "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        try:
            async with self._session.request(method, url, data=data, headers=headers, params=params,
                                             ssl=self._connection.ssl_context()) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    try:
                        status = json.loads(text)
                    except ValueError:
                        status = {}
                    raise api_error(resp.status, status.get("reason", resp.reason or ""), status.get("message", text[:200]),
                                    method=method, url=path)
                return json.loads(text) if text else None
        except aiohttp.ClientError as exc:
            raise RetryableApiError(0, "Unreachable", str(exc), method=method, url=path) from exc

    async def get(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return await self._request("GET", resource_path(api_version, plural, namespace, name))
        except NotFound:
            return None

    async def list(self, api_version: str, plural: str, namespace: str | None = None,
                   label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        answer = await self._request("GET", resource_path(api_version, plural, namespace), params=params)
        return list(answer.get("items") or [])

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of the whole desired object, owned by the slaq operator."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], PLURALS[obj["kind"]], meta.get("namespace"), meta["name"])
        return await self._request("PATCH", path, body=obj, content_type="application/apply-patch+yaml",
                                   params={"fieldManager": MANAGER, "force": "true"})

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return await self._request("POST", resource_path(obj["apiVersion"], PLURALS[obj["kind"]], meta.get("namespace")), body=obj)

    async def patch_status(self, api_version: str, plural: str, name: str, namespace: str | None,
                           status: dict[str, Any]) -> dict[str, Any]:
        return await self._request("PATCH", resource_path(api_version, plural, namespace, name, "status"),
                                   body={"status": status}, content_type="application/merge-patch+json")

    async def delete(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> bool:
        try:
            await self._request("DELETE", resource_path(api_version, plural, namespace, name))
            return True
        except NotFound:
            return False
