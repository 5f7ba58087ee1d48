"""The operator's Kubernetes client: lightkube's AsyncClient behind five dict-in, dict-out calls.

lightkube (pinned in pyproject.toml) was chosen for server-side apply with a field manager
(`PatchType.APPLY`, `force`), credentials it refreshes itself (service-account token files are
re-read and exec plugins re-run on a 401), typed models of every built-in kind, and one pooled
HTTP connection. kopf does its own watching; this client does the operator's reads and writes
(children, tables, statuses), so tests point both at the same API emulator.

Errors come back as the operator's own tree (errors.py): 404 as NotFound (or None from `get`),
409/429/5xx and unreachable servers as RetryableApiError, which the handlers turn into
kopf.TemporaryError.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2
import kopf
from lightkube import ApiError as LightkubeApiError
from lightkube import AsyncClient, KubeConfig
from lightkube.codecs import from_dict
from lightkube.config.models import Cluster, User
from lightkube.core.resource import GlobalResource, Resource
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.autoscaling_v2 import HorizontalPodAutoscaler
from lightkube.resources.core_v1 import ConfigMap, Event, Pod, Secret, Service
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from slaq.api.common import GROUP, VERSION
from slaq.operator.errors import ApiError, NotFound, RetryableApiError, api_error
from slaq.operator.gateway import GIE_GROUP, GIE_PLURAL, GIE_VERSION, OBJECTIVE_GROUP, OBJECTIVE_PLURAL, OBJECTIVE_VERSION
from slaq.operator.names import MANAGER

InferencePoolResource = create_namespaced_resource(GROUP, VERSION, "InferencePool", "inferencepools")
TenantSLAResource = create_global_resource(GROUP, VERSION, "TenantSLA", "tenantslas")
# The Gateway API Inference Extension's kind of the same name (gateway.py); may not be served.
GatewayInferencePoolResource = create_namespaced_resource(GIE_GROUP, GIE_VERSION, "InferencePool", "inferencepools")
# llm-d router's per-tier objectives over it (gateway.py); may not be served either.
InferenceObjectiveResource = create_namespaced_resource(OBJECTIVE_GROUP, OBJECTIVE_VERSION, "InferenceObjective", "inferenceobjectives")

# Every kind the operator reads or writes, by plural (what the reconciler names).
RESOURCES: dict[str, type[Resource]] = {
    "deployments": Deployment,
    "services": Service,
    "secrets": Secret,
    "configmaps": ConfigMap,
    "events": Event,
    "pods": Pod,
    "poddisruptionbudgets": PodDisruptionBudget,
    "networkpolicies": NetworkPolicy,
    "horizontalpodautoscalers": HorizontalPodAutoscaler,
    "inferencepools": InferencePoolResource,
    "tenantslas": TenantSLAResource,
    GIE_PLURAL: GatewayInferencePoolResource,
    OBJECTIVE_PLURAL: InferenceObjectiveResource,
}


PLURALS: dict[tuple[str, str], str] = {(r._api_info.resource.group, r._api_info.resource.kind): plural
                                       for plural, r in RESOURCES.items() if plural != GIE_PLURAL}


def plural_of(obj: dict[str, Any]) -> str:
    """The plural RESOURCES names an object's kind by (its apiVersion's group and its kind)."""
    group = obj["apiVersion"].rpartition("/")[0]
    return PLURALS[(group, obj["kind"])]


@dataclass(frozen=True)
class Connection:
    """Where the API server is. `server=None`: the environment's (in-cluster service account,
    else $KUBECONFIG / ~/.kube/config); a plain URL without credentials for emulators and tests."""

    server: str | None = None

    def kube_config(self) -> KubeConfig:
        if self.server:  # (KubeConfig.from_server leaves the user out, which lightkube's client refuses)
            return KubeConfig.from_one(cluster=Cluster(server=self.server), user=User())
        return KubeConfig.from_env()

    def kopf_login(self, **kwargs: Any) -> kopf.ConnectionInfo | None:
        """kopf's credentials: kopf calls this again whenever the API answers 401, so expiring
        (exec, OIDC, projected service-account) tokens are fetched afresh."""
        if self.server:
            return kopf.ConnectionInfo(server=self.server)
        return kopf.login_via_client(**kwargs)


def load_connection() -> Connection:
    """The environment's API server and credentials (resolved when the client starts)."""
    return Connection()


def _translate(exc: Exception, method: str, what: str) -> Exception:
    if isinstance(exc, LightkubeApiError):
        status = exc.status
        return api_error(int(status.code or exc.response.status_code), status.reason or "", status.message or "",
                         method=method, url=what)
    if isinstance(exc, httpx2.HTTPStatusError):  # an answer that is not a Status object
        return api_error(exc.response.status_code, exc.response.reason_phrase, exc.response.text[:200], method=method, url=what)
    return RetryableApiError(0, "Unreachable", str(exc), method=method, url=what)


def _where(plural: str, namespace: str | None) -> str | None:
    """lightkube's namespace argument: "*" lists a namespaced kind in every namespace."""
    if namespace is not None or issubclass(RESOURCES[plural], GlobalResource):
        return namespace
    return "*"


def _plain(obj: Any) -> dict[str, Any]:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


class KubeClient:
    """get / list / watch / apply / create / patch_status / delete, on plain dicts."""

    def __init__(self, connection: Connection, *, timeout_s: float = 30.0) -> None:
        self._client = AsyncClient(connection.kube_config(), field_manager=MANAGER, timeout=httpx2.Timeout(timeout_s),
                                   lazy=False, trust_env=False)
        self.log = logging.getLogger("slaq.operator.client")

    async def close(self) -> None:
        await self._client.close()

    async def get(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return _plain(await self._client.get(RESOURCES[plural], name, namespace=namespace))
        except httpx2.HTTPError as exc:
            error = _translate(exc, "GET", f"{plural}/{name}")
            if isinstance(error, NotFound):
                return None
            raise error from exc

    async def list(self, plural: str, namespace: str | None = None,
                   labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        try:
            return [_plain(o) async for o in self._client.list(RESOURCES[plural], namespace=_where(plural, namespace), labels=labels)]
        except httpx2.HTTPError as exc:
            raise _translate(exc, "LIST", plural) from exc

    async def list_versioned(self, plural: str, namespace: str | None = None) -> tuple[list[dict[str, Any]], str]:
        """Every object and the list's resourceVersion (a watch from it misses nothing and repeats nothing)."""
        try:
            listing = self._client.list(RESOURCES[plural], namespace=_where(plural, namespace))
            items = [_plain(o) async for o in listing]
            return items, listing.resourceVersion
        except httpx2.HTTPError as exc:
            raise _translate(exc, "LIST", plural) from exc

    async def watch(self, plural: str, namespace: str | None = None,
                    resource_version: str | None = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) from `resource_version` on (without one: every object as ADDED,
        then changes), resumed by lightkube across timeouts."""
        try:
            async for event, obj in self._client.watch(RESOURCES[plural], namespace=_where(plural, namespace),
                                                       resource_version=resource_version):
                yield event, _plain(obj)
        except httpx2.HTTPError as exc:
            raise _translate(exc, "WATCH", plural) from exc

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of the whole desired object, by the one field manager `slaq-operator`.

        `force`: the operator owns these objects; a field another manager took is taken back.
        The body is first parsed into the official model of its kind (a typo fails here)."""
        meta = obj["metadata"]
        try:
            return _plain(await self._client.apply(from_dict(obj), namespace=meta.get("namespace"), force=True))
        except httpx2.HTTPError as exc:
            raise _translate(exc, "APPLY", f"{obj['kind']}/{meta['name']}") from exc

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        try:
            return _plain(await self._client.create(from_dict(obj), namespace=meta.get("namespace")))
        except httpx2.HTTPError as exc:
            raise _translate(exc, "CREATE", f"{obj['kind']}/{meta.get('name') or meta.get('generateName')}") from exc

    async def merge_patch(self, plural: str, name: str, namespace: str | None, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of the object itself (metadata the operator owns, e.g. finalizers)."""
        try:
            return _plain(await self._client.patch(RESOURCES[plural], name, patch, namespace=namespace, patch_type=PatchType.MERGE))
        except httpx2.HTTPError as exc:
            raise _translate(exc, "PATCH", f"{plural}/{name}") from exc

    async def owned_by(self, plural: str, name: str, namespace: str | None, uid: str) -> bool:
        """Whether the object's controller reference is the owner `uid`: a JSON patch whose only
        operation is a `test` (it changes nothing, and needs `patch`, not `get`). 422: it is not."""
        test = [{"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": uid}]
        try:
            await self._client.patch(RESOURCES[plural], name, test, namespace=namespace, patch_type=PatchType.JSON)
            return True
        except httpx2.HTTPError as exc:
            error = _translate(exc, "PATCH", f"{plural}/{name}")
            if isinstance(error, ApiError) and error.status == 422:
                return False
            raise error from exc

    async def patch_status(self, plural: str, name: str, namespace: str | None, status: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of the status subresource (the operator's own status fields only)."""
        resource = RESOURCES[plural]
        try:
            return _plain(await self._client.patch(resource.Status, name, {"status": status}, namespace=namespace,
                                                   patch_type=PatchType.MERGE))
        except httpx2.HTTPError as exc:
            raise _translate(exc, "PATCH", f"{plural}/{name}/status") from exc

    async def delete(self, plural: str, name: str, namespace: str | None = None) -> bool:
        try:
            await self._client.delete(RESOURCES[plural], name, namespace=namespace)
            return True
        except httpx2.HTTPError as exc:
            error = _translate(exc, "DELETE", f"{plural}/{name}")
            if isinstance(error, NotFound):
                return False
            raise error from exc
