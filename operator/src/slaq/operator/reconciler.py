"""The operator's work, independent of kopf: orchestrating the view, the planner and the writer.

Handlers (handlers.py) call one method each; each applies the desired state of what it names,
so running it twice, after a restart, or after a failed attempt converges to the same objects.
Watch events (pools, tenants: informer.py, view.py; key Secrets: keys.py) mark what they touch
(books.Marks); `refresh` takes the marks, has the planner (planner.py) decide what changed, and the
writer (writer.py) write it; a burst of events costs one pass, under one lock. What is remembered
between refreshes is in the books (books.py); statuses are rendered by status.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from slaq.api.pool import InferencePool
from slaq.api.tenant import TenantSLA
from slaq.operator.attainment import MIN_REQUESTS, AttainmentLedger
from slaq.operator.books import Books, Marks, TenantRecord
from slaq.operator.client import KubeClient
from slaq.operator.errors import OperatorError, RetryableApiError, SpecError
from slaq.operator.images import PoolImages
from slaq.operator.informer import Informer
from slaq.operator.keys import KeyWatch
from slaq.operator.planner import Planned, Planner, same_for_tables
from slaq.operator.netpol import NetworkPolicySettings
from slaq.operator.pod import QuotaStoreRef
from slaq.operator.pool_objects import PoolObjects
from slaq.operator.salt import SaltKey
from slaq.operator.status import Event, at_risk_event, attainment_verdict, tenant_status
from slaq.operator.tables import SECRET_DATA_LIMIT, TableRenderer, pool_key  # noqa: F401 - the limit planning reads is tables.py's
from slaq.operator.usage import UsageSource, bound_only, mean_sla_risk, sum_usage
from slaq.operator.view import ClusterView, Indexed, indexed_pool, indexed_tenant, parse_pool, parse_tenant
from slaq.operator.writer import Writer

__all__ = ["Reconciler", "parse_pool", "parse_tenant"]

log = logging.getLogger("slaq.operator")
RETRY_S = 2.0  # a refresh started by a watch event that failed is tried again after this long
START_SYNC_TIMEOUT_S = 60.0  # pools and tenants not listed by then: the startup handler fails and kopf retries it
KEY_SYNC_TIMEOUT_S = 30.0  # a key namespace first named is waited for (never under the lock) until listed, refused, or this long


class Reconciler:
    def __init__(self, api: KubeClient, usage_source: UsageSource, *, namespace: str,
                 attainment: AttainmentLedger | None = None, min_requests: int = MIN_REQUESTS,
                 clock: Callable[[], float] = time.time, key_secret_namespaces: Iterable[str] = (),
                 open_namespaces: Iterable[str] = (), quota_store: QuotaStoreRef | None = None,
                 images: PoolImages = PoolImages(), monitoring_namespaces: Iterable[str] | None = ("monitoring",)) -> None:
        self.api = api
        self.usage_source = usage_source
        self.namespace = namespace  # the operator's own namespace: holds the cache-salt key
        # Where a TenantSLA's apiKeySecretRef may point (the operator's own namespace and these);
        # `open_namespaces`: open to every tenant, whose pools need no spec.tenants list (tables.binding).
        self.key_secret_namespaces = frozenset(key_secret_namespaces) | {namespace}
        self.open_namespaces = frozenset(open_namespaces)
        self.images = images  # what a pool that names no image runs (images.py)
        self._lock = asyncio.Lock()
        self.salt = SaltKey(api, namespace)
        self.books = Books()
        self.marks = Marks()
        self._everything = True  # the first refresh plans every tenant and writes every table
        self.renderer = TableRenderer()
        self.pools = Informer(api, "inferencepools", indexed_pool, on_change=self._pool_changed)
        self.tenants = Informer(api, "tenantslas", indexed_tenant, on_change=self._tenant_changed)
        self.view = ClusterView(self.pools.store, self.tenants.store)
        self.keys = KeyWatch(api, self.on_key_secret_change, self.salt.hash_api_key, on_synced=self._key_namespace_synced)
        self.planner = Planner(self.view, self.books, self.marks, self.keys, key_namespaces=self.key_secret_namespaces,
                               open_namespaces=self.open_namespaces)
        self.writer = Writer(api, self.books, self.marks)
        # the install's shared quota store, rendered into every sidecar (None: local shares)
        # every pool's NetworkPolicy admits its metrics port from these and the operator's namespace (None: no policies)
        network = NetworkPolicySettings(namespace, tuple(monitoring_namespaces)) if monitoring_namespaces is not None else None
        self.objects = PoolObjects(api, self.books.pools, self.writer, quota_store, network)
        self._flusher: asyncio.Task[None] | None = None
        self.attainment = attainment or AttainmentLedger()
        self.min_requests = min_requests
        self.clock = clock  # wall clock: the sidecars' `_created` times are wall-clock times too

    async def ensure_salt_key(self) -> bytes:
        """The secret every cache salt derives from: read it, or create it on first start."""
        key = await self.salt.ensure()
        self.renderer.key_hash_key = self.salt.hash_key.hex() if self.salt.hash_key else None  # the tables carry it
        return key

    # ------------------------------------------------------------------ watching and marking

    async def start(self) -> None:
        """Watch pools and tenants, and return once both are listed (before any table is planned)."""
        self.pools.start()
        self.tenants.start()
        for informer in (self.pools, self.tenants):
            try:
                await asyncio.wait_for(informer.synced.wait(), START_SYNC_TIMEOUT_S)
            except TimeoutError:
                raise RetryableApiError(503, "NotListed", f"{informer.plural} not listed within {START_SYNC_TIMEOUT_S:.0f} s "
                                        f"({informer.last_error or 'no answer'}); the operator needs list and watch on them") from None
        self._kick()

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        for informer in (self.pools, self.tenants):
            await informer.close()
        await self.keys.close()

    async def _tenant_changed(self, name: str, new: Indexed[TenantSLA] | None, old: Indexed[TenantSLA] | None) -> None:
        if new is not None and old is not None and same_for_tables(new, old):
            return  # a status write (often the operator's own): nothing a table holds changed
        self.marks.tenant(name)
        self._kick()

    async def _pool_changed(self, key: str, new: Indexed[InferencePool] | None, old: Indexed[InferencePool] | None) -> None:
        self.marks.pools.add(key)
        self._kick()

    def _kick(self) -> None:
        """Refresh in the background what watch events marked (a burst of events: one pass)."""
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_marks(), name="slaq-table-refresh")

    async def _flush_marks(self) -> None:
        while self.marks or self._everything:
            try:
                await self.refresh()
            except OperatorError as exc:  # the marks stay pending
                log.warning("refreshing tenant tables: %s; again in %.0f s", exc, RETRY_S)
                await asyncio.sleep(RETRY_S)
            except Exception:  # noqa: BLE001 - a bug must not end the refreshes: logged whole, tried again
                log.exception("refreshing tenant tables failed; again in %.0f s", RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def on_key_secret_change(self, namespace: str, name: str) -> None:
        """A watched Secret changed: the tables of the tenants that name it are rewritten now."""
        users = self.books.tenants.users_of((namespace, name))
        if not users:
            return
        log.info("key Secret %s/%s changed: replanning tenant(s) %s", namespace, name, ", ".join(sorted(users)))
        try:
            await self.refresh(tenants=users)
        except OperatorError as exc:  # the marks stay pending: the next event or usage tick tries again
            log.warning("after key Secret %s/%s changed: %s", namespace, name, exc)

    async def _key_namespace_synced(self, namespace: str) -> None:
        """A key namespace is listed (perhaps after failing), or failed to list for a new reason: its
        tenants are planned again, so their status says which."""
        for name in (users := self.books.tenants.users_in(namespace)):
            self.marks.tenant(name)
        if users:
            self._kick()

    # ------------------------------------------------------------------ tenant tables

    async def refresh(self, tenants: Iterable[str] = (), pools: Iterable[str] = (), *, force: bool = False,
                      status: Iterable[str] = ()) -> None:
        """Plan the marked tenants again and write the tables and statuses that changed.

        `tenants` are planned again when their own inputs (spec, labels, key hashes) changed, or
        always with `force` (their pools' replicas or demand moved); a pool in `pools` whose
        labels, tenant selector or replica count changed has every tenant it holds or now binds
        planned again; `status` tenants get their status re-judged (attainment). Marks made while
        another refresh runs are taken by the next one; marks of a refresh that failed stay pending.
        """
        for name in tenants:
            self.marks.tenant(name, force)
        self.marks.pools.update(pools)
        self.marks.status.update(status)
        # Key namespaces first named are waited for (outside the lock) until listed or refused: once.
        names = self.view.tenant_names() if self._everything else list(self.marks.tenants)
        await self.keys.start_and_wait(self.planner.unwatched_key_namespaces(names), KEY_SYNC_TIMEOUT_S)
        async with self._lock:
            if not (self.marks or self._everything):
                return  # a refresh that started after these marks took them
            taken = self.marks.take()
            try:
                await self._reconcile_tables(taken, self._everything)
                self._everything = False
            except BaseException:
                self.marks.put_back(taken)
                raise
        if self.marks.tenants:
            self._kick()  # tenants whose key claims another tenant's plan just changed (duplicate keys)

    async def _reconcile_tables(self, taken: Marks, everything: bool) -> None:
        snapshot = self.planner.snapshot(await self.ensure_salt_key())
        names, forced = self.planner.to_plan(taken, everything, snapshot)
        replanned: set[str] = set()
        for name in names:
            planned = self.planner.plan(name, snapshot, name in forced)
            if planned is Planned.NOT_SERVED:
                await self.writer.tenant_not_served(name, self.view.tenant_entry(name))
            elif planned is Planned.PLANNED:
                replanned.add(name)
        self.planner.drop_gone(snapshot.pools)
        writes = self.planner.table_writes(self.renderer)
        forbidden = await self.writer.write_tables(snapshot.pools, writes)
        self.planner.prune(self.renderer)
        await self.writer.write_tenant_statuses(replanned | taken.status | writes.status_changed | forbidden, self.view, self._tenant_status)

    def _tenant_status(self, tenant: TenantSLA, body: dict[str, Any]) -> tuple[dict[str, Any], Event | None]:
        record = self.books.tenants.get(tenant.metadata.name) or TenantRecord()
        verdict, attainment = attainment_verdict(tenant, body, self.attainment, self.clock(), self.min_requests)
        status = tenant_status(tenant, body, shares=record.plan.pools if record.plan else [], key_problem=record.key_problem,
                               key_count=len(self.keys.get(*record.key_ref).hashes) if record.key_ref else 0,
                               blocked=self.books.pools.blocking(tenant.metadata.name), verdict=verdict, attainment=attainment,
                               open_namespaces=self.open_namespaces, splits=record.plan.splits if record.plan else None,
                               refused=record.plan.refused if record.plan else None)
        return status, at_risk_event(body, verdict)

    # ------------------------------------------------------------------ pools

    async def reconcile_pool(self, body: dict[str, Any]) -> None:
        """Apply the pool's children (table first, so pods mount it on their first start)."""
        try:
            pool = self.images.resolve(parse_pool(body))
        except SpecError as exc:
            await self.writer.report_invalid("inferencepools", body, exc)
            raise
        await self.refresh(pools=[pool_key(pool)])
        await self.objects.apply_children(pool, body)
        await self.objects.apply_gateway_pool(pool, body)
        deployment = await self.api.get("deployments", pool.metadata.name, pool.metadata.namespace)
        await self.writer.write_pool_status(pool, body, deployment)

    async def observe_pool(self, body: dict[str, Any]) -> None:
        """Read usage from the pool's pods, re-split quotas, and refresh the pool's status."""
        pool = parse_pool(body)
        key = pool_key(pool)
        bound = set(self.books.pools.entries(key))  # a pod's report counts only for the tenants this pool serves
        # The tick's time is taken before the read: a counter series created while the read was
        # under way is then seen first at the next tick with `_created` after this time, and counts
        # (stamped after the read, it fell between the read and the stamp and became baseline).
        read_at = self.clock()
        observations = [bound_only(o, bound) for o in await self.usage_source.observe(pool)]
        record = self.books.pools.record(key)
        before, record.usage = record.usage, sum_usage(observations)
        moved = set(before) | set(record.usage)  # active tenants: their split keeps moving toward demand (quotas.py smoothing)
        judged = {series[0] for o in observations for series in o.outcomes or ()}  # and, below, those whose window moved on
        record.risk = mean_sla_risk(observations)
        judged |= self.attainment.record(key, [(o.pod, o.outcomes) for o in observations], read_at)
        if any(outcome is not None and not outcome.ok for outcome in (record.gateway, record.objectives)):
            await self.objects.apply_gateway_pool(pool, body)  # the CRDs may have been installed since
        if pool.spec.autoscaling.enabled and await self.objects.rival_autoscaler(pool, body) != self.books.pools.record(key).rival:
            await self.objects.apply_children(self.images.resolve(pool), body)  # another autoscaler came or went
        deployment = await self.api.get("deployments", pool.metadata.name, pool.metadata.namespace)
        running = int(((deployment or {}).get("status") or {}).get("replicas") or 0)
        self.books.pools.record(key).observed_replicas = max(running, len(observations))
        await self.refresh(tenants=moved, pools=[key], force=True, status=judged)
        fresh = found.body if (found := self.view.pool(key)) is not None else body  # the index holds the latest status
        await self.writer.write_pool_status(pool, fresh, deployment, observed_pods=sum(not o.carried for o in observations))

    def forget_pool(self, namespace: str, name: str) -> None:
        """The pool was deleted: every trace of it goes, and the tenants its table held are planned
        again (their quotas are re-split over the pools that remain)."""
        key = f"{namespace}/{name}"
        for tenant in self.books.pools.forget(key):
            self.marks.tenant(tenant, True)
        self.attainment.forget_pool(key)
        if (forget := getattr(self.usage_source, "forget_pool", None)) is not None:
            forget(key)
