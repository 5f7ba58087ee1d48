"""A refresh without an API server: the planner (planner.py) over an in-memory view, and the
writer (writer.py) against a client stub that records what it was asked and keeps what it applied.

`Harness.refresh` runs the steps Reconciler._reconcile_tables runs, in its order.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from slaq.api.pool import InferencePool
from slaq.api.runtime import TENANT_TABLE_KEY
from slaq.api.table import TenantTable, derive_key_hash_key, hash_api_key
from slaq.api.tenant import TenantSLA
from slaq.bench.scale_objects import KEY_NAMESPACE, OPEN_NAMESPACES, POOL_NAMESPACE, key_secret, pool_body, pool_name, tenant_body, tenant_name
from slaq.operator.books import Books, Marks
from slaq.operator.client import plural_of
from slaq.operator.keys import KeySet, key_set
from slaq.operator.planner import Planned, Planner, TableWrites
from slaq.operator.tables import TableRenderer
from slaq.operator.view import ClusterView, Indexed, indexed_pool, indexed_tenant
from slaq.operator.writer import Writer

__all__ = ["Harness", "StubApi", "pool_key_of", "tenant_name"]

SALT_KEY = b"s" * 32
HASH_KEY = derive_key_hash_key(SALT_KEY)


def pool_key_of(tenant: int, models: int = 3) -> str:
    """The key of the first pool tenant `tenant` binds (pool p serves model p % models)."""
    return f"{POOL_NAMESPACE}/{pool_name(tenant % models)}"


class StubApi:
    """The client calls the writer makes, recorded; applied objects kept by (plural, namespace, name)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        self.calls.append(("create", plural_of(obj), meta.get("name", "")))
        self.objects[plural_of(obj), meta.get("namespace"), meta.get("name", "")] = obj
        return obj

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        self.calls.append(("apply", plural_of(obj), meta["name"]))
        self.objects[plural_of(obj), meta.get("namespace"), meta["name"]] = obj
        return obj

    async def owned_by(self, plural: str, name: str, namespace: str | None, uid: str) -> bool:
        self.calls.append(("owned_by", plural, name))
        return True

    async def delete(self, plural: str, name: str, namespace: str | None = None) -> bool:
        self.calls.append(("delete", plural, name))
        return self.objects.pop((plural, namespace, name), None) is not None

    async def patch_status(self, plural: str, name: str, namespace: str | None, status: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch_status", plural, name))
        return {}

    async def merge_patch(self, plural: str, name: str, namespace: str | None, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("merge_patch", plural, name))
        return {}

    def table(self, pool: str, part: int = 0) -> TenantTable | None:
        """The table part last applied for the pool (by name), parsed."""
        found = self.objects.get(("secrets", POOL_NAMESPACE, f"{pool}-tenants" + (f"-{part}" if part else "")))
        if found is None:
            return None
        return TenantTable.model_validate(json.loads(base64.b64decode(found["data"][TENANT_TABLE_KEY])))


class Keys:
    """The key Secrets' hashes, as KeyWatch would hold them (every namespace listed)."""

    def __init__(self) -> None:
        self.sets: dict[tuple[str, str], KeySet] = {}

    def put(self, secret: dict[str, Any]) -> None:
        meta = secret["metadata"]
        self.sets[meta["namespace"], meta["name"]] = key_set(meta["namespace"], meta["name"], secret["data"],
                                                             lambda key: hash_api_key(key, HASH_KEY), meta.get("labels"))

    def get(self, namespace: str, name: str) -> KeySet:
        return self.sets.get((namespace, name)) or key_set(namespace, name, None, lambda key: key)

    def watching(self, namespace: str) -> bool:
        return True


@dataclass
class Refreshed:
    replanned: set[str]
    not_served: list[str]
    writes: TableWrites
    statuses: set[str] = field(default_factory=set)  # tenants whose status the refresh would write


class Harness:
    def __init__(self, pools: int = 3, tenants: int = 9, models: int = 3) -> None:
        self.models = models
        self.pool_store: dict[str, Indexed[InferencePool]] = {}
        self.tenant_store: dict[str, Indexed[TenantSLA]] = {}
        self.keys = Keys()
        for p in range(pools):
            self.put_pool(pool_body(p, models))
        for j in range(tenants):
            self.put_tenant(tenant_body(j, models))
            self.keys.put(key_secret(j))
        self.books, self.marks = Books(), Marks()
        self.view = ClusterView(self.pool_store, self.tenant_store)
        self.planner = Planner(self.view, self.books, self.marks, self.keys, key_namespaces=frozenset({KEY_NAMESPACE}),
                               open_namespaces=frozenset(OPEN_NAMESPACES))
        self.renderer = TableRenderer(HASH_KEY.hex())
        self.api = StubApi()
        self.writer = Writer(self.api, self.books, self.marks)  # type: ignore[arg-type]

    def put_pool(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        body = {**body, "metadata": {**meta, "uid": f"uid-{meta['name']}"}}
        self.pool_store[f"{meta['namespace']}/{meta['name']}"] = indexed_pool(body)

    def put_tenant(self, body: dict[str, Any]) -> None:
        self.tenant_store[body["metadata"]["name"]] = indexed_tenant(body)

    async def refresh(self, tenants: list[str] = [], pools: list[str] = [], *, force: bool = False,  # noqa: B006
                      everything: bool = False, write: bool = True) -> Refreshed:
        """What Reconciler._reconcile_tables does, statuses counted instead of written."""
        for name in tenants:
            self.marks.tenant(name, force)
        self.marks.pools.update(pools)
        taken = self.marks.take()
        snapshot = self.planner.snapshot(SALT_KEY)
        names, forced = self.planner.to_plan(taken, everything, snapshot)
        replanned, not_served = set(), []
        for name in names:
            planned = self.planner.plan(name, snapshot, name in forced)
            if planned is Planned.NOT_SERVED:
                not_served.append(name)
            elif planned is Planned.PLANNED:
                replanned.add(name)
        self.planner.drop_gone(snapshot.pools)
        writes = self.planner.table_writes(self.renderer)
        if write:
            await self.writer.write_tables(snapshot.pools, writes)
        return Refreshed(replanned, not_served, writes, replanned | taken.status | writes.status_changed)
