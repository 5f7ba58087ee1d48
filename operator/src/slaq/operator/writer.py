"""The operator's writes to the cluster: what the planner (planner.py) and the status renderers
(status.py) decided, applied through the client, with what was written recorded in the books.

Objects a pool owns are applied only where they are the pool's (`apply_owned`, `delete_owned`):
a foreign object of a child's name is left alone and reported. Table parts are written a few
pools at once, lowered shares first; tenant statuses a few patches at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from slaq.api.pool import InferencePool
from slaq.api.tenant import TenantSLA
from slaq.operator.books import Books, Marks
from slaq.operator.children import owned_by, render_table_secret
from slaq.operator.client import KubeClient, plural_of
from slaq.operator.conditions import now
from slaq.operator.errors import ApiError, NotFound, OperatorError, RetryableApiError, SpecError
from slaq.operator.events import render_event
from slaq.operator.names import FINALIZER, table_secret_name
from slaq.operator.planner import TableParts, TableWrites, unwritten
from slaq.operator.status import Event, changed, invalid_reported, invalid_status, pool_status
from slaq.operator.tables import pool_key
from slaq.operator.view import ClusterView, Indexed, deleting, name_of

log = logging.getLogger("slaq.operator")
STATUS_WRITERS = 8  # tenant status patches in flight at once
WRITERS = 8  # pools whose tables are written at once

TenantStatusOf = Callable[[TenantSLA, dict[str, Any]], tuple[dict[str, Any], Event | None]]


class Writer:
    def __init__(self, api: KubeClient, books: Books, marks: Marks) -> None:
        self.api = api
        self.books = books
        self.marks = marks  # a tenant status that failed to be written stays due here

    # ------------------------------------------------------------------ objects a pool owns

    async def apply_owned(self, child: dict[str, Any], owner: dict[str, Any]) -> bool:
        """Apply a child only if it is absent or already the owner's; False (nothing written) for a
        foreign object of that name, which server-side apply would otherwise take over and garbage
        collection later delete with the pool. Checked once per object: created, or a JSON-patch
        `test` of its controller reference (no read right needed). The owner is a pool: what is
        known to be its own is kept on its record, and forgotten with it."""
        meta, uid = child["metadata"], owner["metadata"]["uid"]
        plural = plural_of(child)
        known = (plural, meta["namespace"], meta["name"], uid)
        owned = self.books.pools.record(f"{owner['metadata']['namespace']}/{owner['metadata']['name']}").owned
        desired = owned_by(child, owner)
        if known not in owned:
            try:
                await self.api.create(desired)
                owned.add(known)
                return True
            except RetryableApiError as exc:
                if exc.status != 409:
                    raise
            if not await self.api.owned_by(plural, meta["name"], meta["namespace"], uid):
                log.warning("%s %s/%s exists and is not owned by %s; left alone", child["kind"], meta["namespace"], meta["name"], name_of(owner))
                return False
            owned.add(known)
        await self.api.apply(desired)
        return True

    async def delete_owned(self, plural: str, name: str, namespace: str, owner: dict[str, Any]) -> None:
        """Delete a child the pool no longer wants, only if it is the pool's (absent: nothing to do)."""
        known = (plural, namespace, name, owner["metadata"]["uid"])
        found = self.books.pools.get(f"{owner['metadata']['namespace']}/{owner['metadata']['name']}")
        try:
            if (found is None or known not in found.owned) and not await self.api.owned_by(plural, name, namespace, owner["metadata"]["uid"]):
                return  # someone else's object of that name: never deleted
        except NotFound:
            return
        await self.api.delete(plural, name, namespace)
        if found is not None:
            found.owned.discard(known)

    # ------------------------------------------------------------------ tables

    async def write_tables(self, pools: dict[str, Indexed[InferencePool]], writes: TableWrites) -> set[str]:
        """Apply the parts decided, a few pools at once (WRITERS), lowered shares first (all pools
        that lower one, then the rest: operator/README.md, overshoot bound). A pool whose Secrets the
        operator may not write (403: the chart grants Secret writes only where it is told pools live)
        is reported on its record and its table waits; the others are written. Returns the tenants
        whose entries that leaves unwritten (their status says so)."""
        gate = asyncio.Semaphore(WRITERS)
        forbidden: set[str] = set()

        async def one(key: str) -> None:
            async with gate:
                try:
                    await self.write_table(pools[key], key, writes.parts[key])
                except ApiError as exc:
                    if exc.status != 403:
                        raise
                    record, namespace = self.books.pools.record(key), pools[key].body["metadata"]["namespace"]
                    record.table_problem_reason = "SecretsForbidden"
                    record.table_problem = (f"pool {key}: the operator may not write Secrets in namespace {namespace} "
                                            "(add it to the chart's rbac.poolNamespaces): its tenant table is not written")
                    record.blocked = unwritten(record.table)
                    forbidden.update(record.blocked)
                    log.warning("pool %s: %s", key, exc)

        for wave in writes.waves():
            results = await asyncio.gather(*(one(key) for key in wave), return_exceptions=True)
            if failures := [r for r in results if isinstance(r, BaseException)]:
                raise failures[0]
        return forbidden

    async def write_table(self, pool: Indexed[InferencePool], key: str, parts: TableParts) -> None:
        """Apply the parts that differ from the ones written, delete the parts beyond the table's
        count (it was split over fewer Secrets), and set the pool's `status.tenants`."""
        meta, record = pool.body["metadata"], self.books.pools.record(key)
        table = record.table
        written = table.written if table.written is not None else {}
        table.written = written
        for rendered, texts in parts:
            if written.get(rendered.part or 0) != rendered:
                assert pool.model is not None
                if not await self.apply_owned(render_table_secret(pool.model, rendered, texts), pool.body):
                    name = f"Secret {meta['namespace']}/{table_secret_name(meta['name'], rendered.part or 0)}"
                    if name not in record.foreign:
                        record.foreign.append(name)
                    continue
                written[rendered.part or 0] = rendered
        for stale in sorted(part for part in written if part >= (table.parts or 0)):
            await self.api.delete("secrets", table_secret_name(meta["name"], stale), meta["namespace"])
            del written[stale]
        table.written_clean()
        names = sorted(table.entries)
        if (table.names if table.names is not None else (pool.body.get("status") or {}).get("tenants")) != names:
            await self.api.patch_status("inferencepools", meta["name"], meta["namespace"], {"tenants": names})
        table.names = names

    # ------------------------------------------------------------------ statuses

    async def write_tenant_statuses(self, names: Iterable[str], view: ClusterView, status_of: TenantStatusOf) -> None:
        """Status of each named tenant still served, a few patches in flight at once; the ones that
        failed stay due, and the first failure is raised."""
        gate = asyncio.Semaphore(STATUS_WRITERS)

        async def one(name: str) -> None:
            found = view.tenant(name)
            if found is None or found.model is None:
                return
            async with gate:
                try:
                    await self.write_tenant_status(found.model, found.body, status_of)
                except BaseException:
                    self.marks.status.add(name)
                    raise

        results = await asyncio.gather(*(one(name) for name in sorted(names)), return_exceptions=True)
        if failures := [r for r in results if isinstance(r, BaseException)]:
            raise failures[0]

    async def write_tenant_status(self, tenant: TenantSLA, body: dict[str, Any], status_of: TenantStatusOf) -> None:
        status, event = status_of(tenant, body)
        if changed(body, status):
            await self.api.patch_status("tenantslas", tenant.metadata.name, None, status)
        if event is not None:
            await self.post_event(body, *event)

    async def write_pool_status(self, pool: InferencePool, body: dict[str, Any], deployment: dict[str, Any] | None,
                                observed_pods: int | None = None) -> None:
        record = self.books.pools.get(pool_key(pool))
        problems = {}
        splits = {}
        for name in record.table.entries if record is not None else ():
            found = self.books.tenants.get(name)
            if found is not None and found.key_problem is not None:
                problems[name] = found.key_problem
            if found is not None and found.plan is not None:
                splits[name] = found.plan.splits
        status = pool_status(pool, body, deployment, record, problems, observed_pods, splits)
        if changed(body, status):
            await self.api.patch_status("inferencepools", pool.metadata.name, pool.metadata.namespace, status)

    async def post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event is a notice, not state: failing to post one is logged, never retried."""
        try:
            await self.api.create(render_event(body, type_=type_, reason=reason, message=message, timestamp=now()))
        except OperatorError as exc:
            log.warning("could not post the %s event for %s: %s", reason, name_of(body), exc)

    async def report_invalid(self, plural: str, body: dict[str, Any], error: SpecError) -> None:
        """Say on the object itself why it is not served (`kubectl describe` shows it)."""
        meta = body["metadata"]
        await self.api.patch_status(plural, meta["name"], meta.get("namespace"), invalid_status(body, error))

    async def tenant_not_served(self, name: str, found: Indexed[TenantSLA] | None) -> None:
        """An invalid tenant is told why on its status; a deleted one loses the finalizer an
        earlier version put on it (tables need none: a tenant gone is a tenant left out)."""
        if found is None:
            return
        meta = found.body.get("metadata") or {}
        if deleting(found.body):
            if FINALIZER in (meta.get("finalizers") or []):
                await self.api.merge_patch("tenantslas", name, None,
                                           {"metadata": {"finalizers": [f for f in meta["finalizers"] if f != FINALIZER]}})
            return
        if found.error is not None and not invalid_reported(found.body, found.error):
            log.warning("refused: %s", found.error)
            await self.report_invalid("tenantslas", found.body, found.error)
