"""A Kubernetes API emulator: kmock 0.8 plus the server-side behaviour kopf relies on.

The tests get a running one from the `kube` fixture (tests/support/fixtures.py, with slaq's CRDs
and a kubeconfig); tools/src/slaq/bench/operator_scale.py serves one in a child process. Its API:

    async def test_something(kube: KubeEmulator) -> None:
        kube.url                # http://127.0.0.1:<port> of the emulated API server
        kube.kubeconfig         # path of a kubeconfig pointing at it (also made the kubernetes
                                # client's default location for the duration of the test)
        kube.objects            # kmock's object store: kube.objects['apps/v1/deployments', 'ns', 'n']
        kube.live(resource, namespace=None) -> list[dict]     # live (not deleted) objects
        kube.read(resource, namespace, name) -> dict | None   # one live object, or None
                                # (kube.get/patch/post/delete stay kmock's HTTP client shortcuts)
        kube.fail(method, resource, status, times=1, name=None, subresource=None)
                                # the next `times` matching requests answer `status` with
                                # no state change (method: GET, POST, PATCH, DELETE or '*')
        kube.collect_garbage() -> list[key]   # what the garbage collector would delete now
        kube.calls              # every API request served, as Call(verb, resource, namespace, name,
                                # subresource): what a test counts (watch streams are verb WATCH)
        kube.keep_requests = False   # stop kmock keeping every request with its body (benches)
        kube.install_crds(paths)              # declare CRDs (done for crds/*.yaml by the fixture)
        kube.preload(resource, body)          # store an object without an event (before watchers)

What it adds to kmock 0.8's `KubernetesEmulator` (pinned: this subclass reaches into it):
uid, resourceVersion, generation (bumped only when the object outside metadata/status changes)
and creationTimestamp; metadata.namespace from the URL and `generateName`; 201 on create;
`status` and `scale` subresources with their real semantics; server-side apply
(`application/apply-patch+yaml`, create-or-replace by one field manager); JSON-patch `test`
failures as 422; label selectors on list and watch; list `kind`; `/api/v1` groupVersion `v1`;
`GET /api/v1/namespaces`; ownerReference garbage collection on request (`collect_garbage`); and
the 1 MiB limit on a Secret's data (422 naming the size, as the API server's validation answers).
Not emulated: admission, schema validation, field selectors, watch timeouts and bookmarks, PUT,
strategic merge patch, managedFields. A real cluster remains the final word for those.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import datetime
import json
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import jsonpatch
import kmock
import yaml
from kmock._internal import dicts as kmock_dicts
from kmock._internal import rendering

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
NAMESPACES = kmock.resource("", "v1", "namespaces")
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
EVENT_DELAY_S = 0.005
SECRETS = kmock.resource("", "v1", "secrets")
MAX_REQUEST_BYTES = 3 * 1024 * 1024  # the API server's limit on a request body
MAX_SECRET_SIZE = 1024 * 1024  # corev1.MaxSecretSize: the API server refuses a Secret whose data holds more


def check_secret_size(resource: kmock.resource, body: dict[str, Any]) -> None:
    """422 like the API server's validation for a Secret whose data (decoded) and stringData
    together hold more than 1 MiB."""
    if resource != SECRETS:
        return
    size = 0
    for value in (body.get("data") or {}).values():
        try:
            size += len(base64.b64decode(value or "", validate=True))
        except (binascii.Error, ValueError) as exc:
            raise KubeApiError(422, "Invalid", f"data: Invalid value: illegal base64 data: {exc}") from exc
    size += sum(len(str(v).encode("utf-8")) for v in (body.get("stringData") or {}).values())
    if size > MAX_SECRET_SIZE:
        name = (body.get("metadata") or {}).get("name", "")
        raise KubeApiError(422, "Invalid", f'Secret "{name}" is invalid: data: Too long: may not be more than '
                                           f"{MAX_SECRET_SIZE} bytes (it holds {size})")


@dataclass
class Fault:
    method: str
    resource: kmock.resource
    status: int
    times: int
    name: str | None
    subresource: str | None
    namespace: str | None = None

    def matches(self, request: rendering.Request) -> bool:
        return (
            self.times > 0
            and (self.method == "*" or request.method.value == self.method)
            and request.resource == self.resource
            and (self.name is None or request.name == self.name)
            and (self.namespace is None or request.namespace == self.namespace)
            and request.subresource == self.subresource
        )


@dataclass(frozen=True)
class Call:
    """One request the emulator served, as an API server's audit log would name it."""

    verb: str  # GET, LIST, WATCH, CREATE (POST), PATCH, DELETE
    resource: str  # plural, e.g. "secrets"
    namespace: str | None
    name: str | None
    subresource: str | None = None


def _verb(request: rendering.Request) -> str:
    method = request.method.value
    if method == "GET" and request.name is None:
        return "WATCH" if request.params.get("watch") in ("true", "1") else "LIST"
    return {"POST": "CREATE"}.get(method, method)


@dataclass(frozen=True)
class ScalePaths:
    spec_replicas: str
    status_replicas: str
    label_selector: str | None


class KubeApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    def response(self) -> aiohttp.web.Response:
        return aiohttp.web.json_response(
            {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
             "code": self.status, "reason": self.reason, "message": self.message},
            status=self.status,
        )


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(body: dict[str, Any]) -> dict[str, Any]:
    """What `generation` tracks: everything except metadata and status."""
    return {k: v for k, v in body.items() if k not in ("metadata", "status")}


def _get_path(body: dict[str, Any], dotted: str) -> Any:
    node: Any = body
    for part in dotted.strip(".").split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _set_path(body: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.strip(".").split(".")
    node = body
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


_REQUIREMENT = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(==|=|!=)\s*(\S*)|\s+(in|notin)\s+\(([^)]*)\))?\s*$")


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector syntax: `a=b,c!=d,e,!f,g in (h,i),j notin (k)`."""
    for requirement in re.split(r",(?![^(]*\))", selector):
        if not requirement.strip():
            continue
        m = _REQUIREMENT.match(requirement)
        if m is None:
            raise KubeApiError(400, "BadRequest", f"unable to parse requirement: {requirement!r}")
        negated, key, op, value, set_op, values = m.groups()
        if set_op:
            options = {v.strip() for v in values.split(",") if v.strip()}
            ok = (labels.get(key) in options) if set_op == "in" else (labels.get(key) not in options)
        elif op in ("=", "=="):
            ok = labels.get(key) == value
        elif op == "!=":
            ok = labels.get(key) != value
        else:
            ok = (key in labels) != bool(negated)
        if not ok:
            return False
    return True


class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the server-assigned fields and answers kopf and kubectl expect."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._faults: list[Fault] = []
        self._version = 0
        self._outbox: asyncio.Queue[Any] | None = None
        self._history: list[tuple[int, kmock.resource, dict[str, Any]]] = []
        self._watchers: set[asyncio.Queue[Any]] = set()
        self._oldest_version = 0  # watches may resume from any resourceVersion since the start
        self._pump: asyncio.Task[None] | None = None
        self._scale_paths: dict[kmock.resource, ScalePaths] = {}
        self.kubeconfig: Path | None = None
        self.calls: list[Call] = []
        self.keep_requests = True

    # ---------------------------------------------------------------- test-facing helpers

    def fail(self, method: str, resource: str, status: int, *, times: int = 1, name: str | None = None,
             subresource: str | None = None, namespace: str | None = None) -> Fault:
        """Answer the next `times` matching requests (in `namespace`, or any) with `status`, changing nothing."""
        fault = Fault(method.upper(), kmock.resource(resource), status, times, name, subresource, namespace)
        self._faults.append(fault)
        return fault

    def live(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        res = kmock.resource(resource)
        return [copy.deepcopy(obj.raw) for (r, ns, _), obj in self.objects.items()
                if r == res and not obj.deleted and (namespace is None or ns == namespace)]

    def read(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(resource), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def preload(self, resource: str, body: dict[str, Any]) -> dict[str, Any]:
        """Store an object as if created before anyone watched (no event): for large benches."""
        namespace = (body.get("metadata") or {}).get("namespace")
        stored = self._stamp_new(copy.deepcopy(body), namespace)
        self._store_new(kmock.resource(resource), namespace, stored)
        return stored

    def install_crds(self, paths: Iterable[Path]) -> None:
        """Declare the CRDs in these files for discovery, store them, and learn their subresources."""
        for path in paths:
            for crd in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                spec, names = crd["spec"], crd["spec"]["names"]
                for version in spec["versions"]:
                    res = kmock.resource(spec["group"], version["name"], names["plural"])
                    subresources = version.get("subresources") or {}
                    self.resources[res] = kmock.ResourceInfo(
                        kind=names["kind"], singular=names.get("singular"),
                        namespaced=spec["scope"] == "Namespaced",
                        verbs={"create", "delete", "get", "list", "patch", "update", "watch"},
                        shortnames=set(names.get("shortNames", [])),
                        categories=set(names.get("categories", [])), subresources=set(subresources),
                    )
                    if "scale" in subresources:
                        scale = subresources["scale"]
                        self._scale_paths[res] = ScalePaths(
                            scale["specReplicasPath"], scale["statusReplicasPath"], scale.get("labelSelectorPath"))
                self._store_new(CRDS, None, self._stamp_new(copy.deepcopy(crd), None))

    def collect_garbage(self) -> list[tuple[kmock.resource, str | None, str]]:
        """Delete every object whose owners are all gone (repeating until nothing changes).

        Call it from a running event loop: watchers get DELETED events."""
        collected: list[tuple[kmock.resource, str | None, str]] = []
        while True:
            uids = {obj.raw.get("metadata", {}).get("uid") for obj in self.objects.values() if not obj.deleted}
            orphans = [key for key, obj in self.objects.items() if not obj.deleted
                       and (refs := obj.raw.get("metadata", {}).get("ownerReferences"))
                       and not any(ref.get("uid") in uids for ref in refs)]
            if not orphans:
                return collected
            for key in orphans:
                body = copy.deepcopy(self.objects[key].raw)
                body["metadata"]["resourceVersion"] = self._next_version()
                self.objects[key].delete()
                self._emit(key[0], "DELETED", body)
                collected.append(key)

    # ---------------------------------------------------------------- request handling

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # aiohttp reads at most 1 MiB of a request body by default; the API server takes up to 3 MiB
        # (a 1 MiB Secret is 1.33 MiB in base64), and then applies its own limits (check_secret_size).
        raw_request._client_max_size = MAX_REQUEST_BYTES
        # kmock 0.8 fails to parse `/api/v1/namespaces` (a cluster-scoped core list) into a request.
        if raw_request.method == "GET" and raw_request.path.rstrip("/") == "/api/v1/namespaces":
            self.calls.append(Call("LIST", "namespaces", None, None))
            return await self._serve_namespace_list(raw_request)
        try:
            return await super().__call__(raw_request)
        finally:
            if not self.keep_requests:
                self._requests.clear()

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.resource.plural is not None:
            self.calls.append(Call(_verb(request), request.resource.plural, request.namespace, request.name, request.subresource))
        try:
            for fault in self._faults:
                if fault.matches(request):
                    fault.times -= 1
                    raise KubeApiError(fault.status, "InjectedFault", f"injected {fault.status} for {request.method.value} {request.url.path}")
            if request.url.path.rstrip("/") == "/api/v1":
                return aiohttp.web.json_response(await self._serve_core_discovery(request))
            if request.resource is not None and request.resource.plural is not None:
                if request.subresource == "scale" and request.resource in self._scale_paths:
                    return await self._serve_scale(request)
                if request.action == kmock.action.CREATE:
                    return await self._create(request)
                if request.action == kmock.action.UPDATE:
                    return await self._patch(request)
                if request.action == kmock.action.DELETE:
                    return await self._delete(request)
        except KubeApiError as exc:
            return exc.response()
        return await super()._handle(request)

    async def _serve_core_discovery(self, request: rendering.Request) -> dict[str, Any]:
        answer = await self._serve_version(request)
        answer["groupVersion"] = "v1"  # kmock says "/v1", which kubectl rejects
        return answer

    async def _serve_namespace_list(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        names = {ns for (_, ns, _), obj in self.objects.items() if ns and not obj.deleted}
        stored = {name: obj.raw for (res, _, name), obj in self.objects.items() if res == NAMESPACES and not obj.deleted}
        items = [stored.get(name) or {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}} for name in sorted(names | set(stored))]
        selector = raw_request.query.get("labelSelector")
        if selector:
            items = [i for i in items if label_selector_matches(selector, i.get("metadata", {}).get("labels") or {})]
        return aiohttp.web.json_response({"apiVersion": "v1", "kind": "NamespaceList", "metadata": {"resourceVersion": str(self._version)}, "items": items})

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        answer = dict(await super()._serve_list(request))
        selector = request.params.get("labelSelector")
        if selector:
            answer["items"] = [i for i in answer["items"] if label_selector_matches(selector, i.get("metadata", {}).get("labels") or {})]
        assert request.resource is not None
        info = self.resources[request.resource] if request.resource in self.resources else None
        kind = info.kind if info is not None and info.kind else request.resource.plural.capitalize()
        answer["kind"] = f"{kind}List"
        answer["apiVersion"] = f"{request.resource.group}/{request.resource.version}".lstrip("/")
        answer["metadata"] = {"resourceVersion": str(self._version)}
        return answer

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        """Watch semantics of a real server: from `resourceVersion` on, or a listing then changes.

        Every event is stamped with the global resourceVersion of its write, so a watch resumed
        from a list's resourceVersion gets exactly the changes after it: no gaps, no replays.
        """
        yield b""  # send the headers now
        assert request.resource is not None
        selector = request.params.get("labelSelector") or ""
        since_param = request.params.get("resourceVersion") or "0"
        inbox: asyncio.Queue[tuple[int, kmock.resource, dict[str, Any]]] = asyncio.Queue()
        self._watchers.add(inbox)  # subscribe before reading state or history: nothing falls in between
        try:
            listed: dict[tuple[str | None, str], int] = {}
            resumed_from = 0
            if since_param != "0" and since_param.isdigit() and int(since_param) >= self._oldest_version:
                resumed_from = int(since_param)
                backlog = [(rv, res, ev) for rv, res, ev in self._history if rv > resumed_from]
            else:
                backlog = []
                for (res, ns, name), obj in self.objects.items():
                    if res == request.resource and not obj.deleted:
                        body = copy.deepcopy(obj.raw)
                        listed[(ns, name)] = int(body.get("metadata", {}).get("resourceVersion") or 0)
                        backlog.append((listed[(ns, name)], res, {"type": "ADDED", "object": body}))
            for rv, res, event in backlog:
                if self._watch_wants(request, res, event, selector):
                    yield event
            while True:
                rv, res, event = await inbox.get()
                meta = event["object"].get("metadata", {})
                if rv <= resumed_from or rv <= listed.get((meta.get("namespace"), meta.get("name")), 0):
                    continue  # already before the version resumed from, or in the listing it started with
                if self._watch_wants(request, res, event, selector):
                    yield event
        finally:
            self._watchers.discard(inbox)

    @staticmethod
    def _watch_wants(request: rendering.Request, resource: kmock.resource, event: dict[str, Any], selector: str) -> bool:
        meta = event["object"].get("metadata", {})
        return (resource == request.resource
                and (request.namespace is None or meta.get("namespace") == request.namespace)
                and (request.name is None or meta.get("name") == request.name)
                and (not selector or label_selector_matches(selector, meta.get("labels") or {})))

    # ---------------------------------------------------------------- mutations

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _stamp_new(self, body: dict[str, Any], namespace: str | None) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        if namespace:
            meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not meta.get("name"):
            raise KubeApiError(422, "Invalid", "metadata.name: Required value: name or generateName is required")
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = self._next_version()
        meta["generation"] = 1
        meta["creationTimestamp"] = _now()
        meta.pop("deletionTimestamp", None)
        return body

    def _key(self, request: rendering.Request, name: str | None = None) -> tuple[kmock.resource, str | None, str]:
        assert request.resource is not None
        return (request.resource, request.namespace, name or request.name or "")

    def _live(self, key: tuple[kmock.resource, str | None, str]) -> dict[str, Any] | None:
        if key in self.objects and not self.objects[key].deleted:
            return copy.deepcopy(self.objects[key].raw)
        return None

    def _store_new(self, resource: kmock.resource, namespace: str | None, body: dict[str, Any]) -> None:
        key = (resource, namespace, body["metadata"]["name"])
        if key in self.objects:
            self.objects[key].create(body)
        else:
            self.objects[key] = body

    def _emit(self, resource: kmock.resource, kind: str, body: dict[str, Any]) -> None:
        # Like a real server, a watch event follows the write's response by a moment (kopf's
        # consistency logic assumes it); events stay in write order.
        if self._outbox is None:
            self._outbox = asyncio.Queue()
            self._pump = asyncio.create_task(self._pump_events(self._outbox))
        loop = asyncio.get_running_loop()
        self._outbox.put_nowait((loop.time() + EVENT_DELAY_S, resource, {"type": kind, "object": copy.deepcopy(body)}))

    async def _pump_events(self, outbox: "asyncio.Queue[tuple[float, kmock.resource, dict[str, Any]]]") -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, resource, event = await outbox.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            rv = int(event["object"].get("metadata", {}).get("resourceVersion") or self._version)
            self._history.append((rv, resource, event))
            for inbox in self._watchers:
                inbox.put_nowait((rv, resource, event))

    async def __aexit__(self, *exc: Any) -> None:
        if self._pump is not None:
            self._pump.cancel()
            try:
                await self._pump
            except asyncio.CancelledError:
                pass
        await super().__aexit__(*exc)

    async def _create(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if not isinstance(request.data, dict):
            raise KubeApiError(400, "BadRequest", "the body of a create must be an object")
        body = self._stamp_new(copy.deepcopy(request.data), request.namespace)
        assert request.resource is not None
        check_secret_size(request.resource, body)
        async with self._lock:
            if self._live(self._key(request, body["metadata"]["name"])) is not None:
                raise KubeApiError(409, "AlreadyExists", f'{request.resource.plural} "{body["metadata"]["name"]}" already exists')
            self._store_new(request.resource, request.namespace, body)
            self._emit(request.resource, "ADDED", body)
        return aiohttp.web.json_response(body, status=201)

    def _has_status_subresource(self, request: rendering.Request) -> bool:
        assert request.resource is not None
        return request.resource in self.resources and "status" in self.resources[request.resource].subresources

    async def _patch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        key = self._key(request)
        headers = {k.lower(): v for k, v in request.headers.items()}
        content_type = headers.get("content-type", "").split(";")[0].strip()
        async with self._lock:
            old = self._live(key)
            if content_type == APPLY_CONTENT_TYPE:
                return await self._apply(request, key, old)
            if old is None:
                raise KubeApiError(404, "NotFound", f"{key[0].plural} {key[2]!r} not found")
            try:
                new = dict(kmock_dicts.patch_dict(copy.deepcopy(old), request.data or {}))
            except jsonpatch.JsonPatchTestFailed as exc:
                raise KubeApiError(422, "Invalid", f"the JSON patch test failed: {exc}") from exc
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, ValueError, TypeError) as exc:
                raise KubeApiError(422, "Invalid", f"the patch cannot be applied: {exc}") from exc
            new = self._restrict_to_endpoint(request, old, new)
            check_secret_size(key[0], new)
            return await self._replace(key, old, new)

    def _restrict_to_endpoint(self, request: rendering.Request, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        """The status endpoint writes only status; the main endpoint never writes status."""
        if request.subresource == "status":
            return {**old, "status": new.get("status")} if new.get("status") is not None else {k: v for k, v in old.items() if k != "status"}
        if self._has_status_subresource(request):
            restricted = {k: v for k, v in new.items() if k != "status"}
            if "status" in old:
                restricted["status"] = old["status"]
            return restricted
        return new

    async def _replace(self, key: tuple[kmock.resource, str | None, str], old: dict[str, Any], new: dict[str, Any]) -> aiohttp.web.StreamResponse:
        meta, old_meta = new.setdefault("metadata", {}), old.get("metadata", {})
        for field in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp"):
            if field in old_meta:
                meta[field] = old_meta[field]
        meta["generation"] = old_meta.get("generation", 1) + (1 if _spec_part(new) != _spec_part(old) else 0)
        if new == old:
            return aiohttp.web.json_response(new)  # a no-op write does not bump resourceVersion
        meta["resourceVersion"] = self._next_version()
        self.objects[key].create(new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.objects[key].delete()
            self._emit(key[0], "DELETED", new)
        else:
            self._emit(key[0], "MODIFIED", new)
        return aiohttp.web.json_response(new)

    async def _apply(self, request: rendering.Request, key: tuple[kmock.resource, str | None, str], old: dict[str, Any] | None) -> aiohttp.web.StreamResponse:
        applied = request.data
        if not isinstance(applied, dict):
            raise KubeApiError(400, "BadRequest", "an apply patch must be an object (JSON or YAML)")
        if request.params.get("fieldManager") in (None, ""):
            raise KubeApiError(422, "Invalid", "fieldManager is required for apply patches")
        applied = copy.deepcopy(applied)
        check_secret_size(key[0], applied)
        if old is None:
            applied.setdefault("metadata", {})["name"] = key[2]
            body = self._stamp_new(applied, key[1])
            self._store_new(key[0], key[1], body)
            self._emit(key[0], "ADDED", body)
            return aiohttp.web.json_response(body, status=201)
        # One field manager owns the whole object here: the applied config replaces everything it
        # may own; server-owned metadata and (behind a status subresource) status are kept.
        new = {k: v for k, v in applied.items() if k != "status"}
        new["metadata"] = {**{k: v for k, v in old.get("metadata", {}).items() if k in ("finalizers",)}, **applied.get("metadata", {})}
        if "status" in old:
            new["status"] = old["status"]
        return await self._replace(key, old, new)

    async def _delete(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        key = self._key(request)
        async with self._lock:
            old = self._live(key)
            if old is None:
                raise KubeApiError(404, "NotFound", f"{key[0].plural} {key[2]!r} not found")
            meta = old.setdefault("metadata", {})
            if meta.get("finalizers"):
                if not meta.get("deletionTimestamp"):
                    meta["deletionTimestamp"] = _now()
                    meta["resourceVersion"] = self._next_version()
                    self.objects[key].create(old)
                    self._emit(key[0], "MODIFIED", old)
                return aiohttp.web.json_response(old, status=202)
            meta["resourceVersion"] = self._next_version()
            self.objects[key].delete()
            self._emit(key[0], "DELETED", old)
        return aiohttp.web.json_response(old)

    async def _serve_scale(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        assert request.resource is not None
        paths = self._scale_paths[request.resource]
        key = self._key(request)
        async with self._lock:
            body = self._live(key)
            if body is None:
                raise KubeApiError(404, "NotFound", f"{key[0].plural} {key[2]!r} not found")
            if request.method.value == "PATCH":
                replicas = ((request.data or {}).get("spec") or {}).get("replicas")
                if not isinstance(replicas, int) or replicas < 0:
                    raise KubeApiError(422, "Invalid", "spec.replicas: must be a non-negative integer")
                new = copy.deepcopy(body)
                _set_path(new, paths.spec_replicas, replicas)
                await self._replace(key, body, new)
                body = self._live(key) or new
            elif request.method.value != "GET":
                raise KubeApiError(405, "MethodNotAllowed", "the scale subresource supports GET and PATCH here")
        meta = body["metadata"]
        scale = {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace"), "uid": meta["uid"],
                         "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta.get("creationTimestamp")},
            "spec": {"replicas": _get_path(body, paths.spec_replicas) or 0},
            "status": {"replicas": _get_path(body, paths.status_replicas) or 0},
        }
        if paths.label_selector and (selector := _get_path(body, paths.label_selector)):
            scale["status"]["selector"] = selector
        return aiohttp.web.json_response(scale)


def write_kubeconfig(path: Path, url: str) -> Path:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        "users": [{"name": "kmock", "user": {"token": "kmock"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": "default"}}],
    }
    path.write_text(json.dumps(config), encoding="utf-8")
    return path
