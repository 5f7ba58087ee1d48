"""The operator's work, independent of kopf: read the view, render, apply, write status.

Handlers (handlers.py) call one method each. Every method applies the desired state of what it
names, so running it twice, after a restart, or after a failed attempt converges to the same
objects.

Tenant tables are reconciled incrementally from the in-memory view (view.py, fed by the
informer's list-then-watch, informer.py) and the watched key Secrets (keys.py): no list call per event or per tick. An event
marks what it touches (a tenant, a pool, a key Secret's tenants) and `refresh` plans only those
tenants again (each tenant's entries in the pools it binds come from one `plan_tenant` call, so
its shares still sum within its quota) and writes only the tables whose entries changed. Marks
made while a refresh runs are taken by the next one, so a burst of events costs one pass.
Planning and writing are serialised by one lock.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from slaq.api.common import GROUP, Tier
from slaq.api.pool import InferencePool
from slaq.api.runtime import TenantUsage
from slaq.api.table import TenantEntry, TenantTable, derive_key_hash_key, hash_api_key
from slaq.api.tenant import PoolShare, TenantSLA
from slaq.operator.attainment import MIN_REQUESTS, AttainmentLedger, Verdict, judge
from slaq.operator.children import owned_by, render_children, render_table_secret
from slaq.operator.client import KubeClient, plural_of
from slaq.operator.conditions import condition, merge_conditions, now
from slaq.operator.errors import ApiError, NotFound, OperatorError, RetryableApiError, SpecError
from slaq.operator.events import NORMAL, WARNING, render_event
from slaq.operator.gateway import (
    GIE_API_VERSION, GIE_PLURAL, OBJECTIVE_API_VERSION, OBJECTIVE_HEADER, OBJECTIVE_PLURAL, endpoint_picker_name,
    objective_name, render_gateway_inference_pool, render_inference_objectives,
)
from slaq.operator.keys import TENANT_LABEL, KeySet, KeyWatch
from slaq.operator.names import FINALIZER, MANAGER, SALT_SECRET_KEY, SALT_SECRET_NAME, pool_selector_labels, selector_string, table_secret_name
from slaq.operator.tables import (
    SECRET_DATA_LIMIT, TableRenderer, TableTooLarge, TenantPlan, TenantSplits, binds, data_bytes, part_of, plan_tenant, pool_key,
    split_table,
)
from slaq.operator.usage import UsageSource, bound_only, mean_sla_risk, sum_usage
from slaq.operator.informer import Informer
from slaq.operator.view import ClusterView, Indexed, deleting, indexed_pool, indexed_tenant, name_of, parse_pool, parse_tenant

__all__ = ["Reconciler", "parse_pool", "parse_tenant"]

log = logging.getLogger("slaq.operator")
SALT_KEY_BYTES = 32
STATUS_WRITERS = 8  # tenant status patches in flight at once
WRITERS = 8  # pools whose tables are written at once
RETRY_S = 2.0  # a refresh started by a watch event that failed is tried again after this long
START_SYNC_TIMEOUT_S = 60.0  # pools and tenants not listed by then: the startup handler fails and kopf retries it
KEY_SYNC_TIMEOUT_S = 30.0  # a key namespace first named is waited for (never under the lock) until listed, refused, or this long


def render_salt_secret(namespace: str, key: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": SALT_SECRET_NAME, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "slaq", "app.kubernetes.io/managed-by": MANAGER}},
        "data": {SALT_SECRET_KEY: base64.b64encode(key).decode("ascii")},
    }


@dataclass(frozen=True)
class GatewayOutcome:
    """What became of a pool's GIE InferencePool, or of its llm-d InferenceObjectives: the
    `GatewayInferencePool` / `GatewayInferenceObjectives` condition's content."""

    ok: bool
    reason: str
    message: str


def _condition_of(body: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


def same_for_tables(new: Indexed[TenantSLA], old: Indexed[TenantSLA]) -> bool:
    """Whether two versions of a tenant plan the same: same spec, labels, validity and deletion."""
    if new.model is None or old.model is None:
        return False
    return (new.model.spec == old.model.spec and new.model.metadata.labels == old.model.metadata.labels
            and deleting(new.body) == deleting(old.body))


@dataclass(frozen=True)
class PoolInputs:
    """What of a pool its tenants' entries depend on: which tenants it binds, and the replica
    count their quotas are split by. When it changes, every tenant of the pool is planned again."""

    labels: tuple[tuple[str, str], ...]
    tenant_selector: str
    replicas: int

    @classmethod
    def of(cls, pool: InferencePool, replicas: int) -> "PoolInputs":
        return cls(tuple(sorted(pool.metadata.labels.items())), pool.spec.tenant_selector.model_dump_json(), replicas)


class Reconciler:
    def __init__(self, api: KubeClient, usage_source: UsageSource, *, namespace: str,
                 attainment: AttainmentLedger | None = None, min_requests: int = MIN_REQUESTS,
                 clock: Callable[[], float] = time.time, key_secret_namespaces: Iterable[str] = (),
                 open_namespaces: Iterable[str] = ()) -> None:
        self.api = api
        self.usage_source = usage_source
        self.namespace = namespace  # the operator's own namespace: holds the cache-salt key
        # Where a TenantSLA's apiKeySecretRef may point (the operator's own namespace and these);
        # pools in `open_namespaces` bind tenants whose poolSelector is empty (tables.binds).
        self.key_secret_namespaces = frozenset(key_secret_namespaces) | {namespace}
        self.open_namespaces = frozenset(open_namespaces)
        self._lock = asyncio.Lock()
        self._salt_key: bytes | None = None
        self._key_hash_key: bytes | None = None
        self._splits: dict[str, TenantSplits] = {}
        self._usage: dict[str, dict[str, TenantUsage]] = {}
        self._risk: dict[str, float | None] = {}
        self._observed_replicas: dict[str, int] = {}
        self._gateway: dict[str, GatewayOutcome] = {}
        self._objectives: dict[str, GatewayOutcome] = {}
        self._rivals: dict[str, str | None] = {}  # by pool key: another autoscaler of the pool, described
        self._written: dict[str, dict[int, TenantTable]] = {}  # by pool key, then part: the table parts last applied
        self._parts: dict[str, int] = {}  # by pool key: how many Secrets its table is split over
        self._touched: dict[str, set[str] | None] = {}  # by pool key: tenants whose entries changed since written (None: all)
        self._members: dict[str, list[set[str]]] = {}  # by pool key: the tenants of each part of its table
        self._renderer = TableRenderer()
        self._table_names: dict[str, list[str]] = {}  # by pool key: status.tenants last written
        self._key_problems: dict[str, tuple[str, str]] = {}  # by tenant: (condition reason, message)
        self._hash_owners: dict[str, set[str]] = {}  # key hash -> tenants whose Secrets hold it
        self._claimed: dict[str, frozenset[str]] = {}  # by tenant: the key hashes it claims
        self._accepted: dict[str, list[str]] = {}  # by tenant: its key hashes last planned without a cap problem
        self._table_problems: dict[str, tuple[str, str]] = {}  # by pool key: why its table cannot be written (reason, message)
        self._table_blocked: dict[str, set[str]] = {}  # by pool key: tenants whose entries that leaves unwritten
        self._foreign: dict[str, list[str]] = {}  # by pool key: objects of its children's names it does not own
        self._owned: set[tuple[str, str, str, str]] = set()  # (plural, namespace, name, owner uid) known to be the pool's
        self._key_users: dict[tuple[str, str], set[str]] = {}  # key Secret -> tenants naming it
        self._key_ref: dict[str, tuple[str, str]] = {}  # tenant -> its key Secret
        self._entries: dict[str, dict[str, TenantEntry]] = {}  # by pool key, then tenant name
        self._plans: dict[str, TenantPlan] = {}  # by tenant name: its entries and shares
        self._tenant_inputs: dict[str, tuple[Any, ...]] = {}  # by tenant name: what its plan came from
        self._pool_inputs: dict[str, PoolInputs] = {}  # by pool key: what its tenants' plans came from
        self._pending: dict[str, bool] = {}  # tenant -> plan again even if its own inputs are unchanged
        self._pending_pools: set[str] = set()
        self._pending_status: set[str] = set()
        self._everything = True  # the first refresh plans every tenant and writes every table
        self.pools = Informer(api, "inferencepools", indexed_pool, on_change=self._pool_changed)
        self.tenants = Informer(api, "tenantslas", indexed_tenant, on_change=self._tenant_changed)
        self.view = ClusterView(self.pools.store, self.tenants.store)
        self.keys = KeyWatch(api, self.on_key_secret_change, self._hash_api_key, on_synced=self._key_namespace_synced)
        self._flusher: asyncio.Task[None] | None = None
        self.attainment = attainment or AttainmentLedger()
        self.min_requests = min_requests
        self.clock = clock  # wall clock: the sidecars' `_created` times are wall-clock times too

    # ------------------------------------------------------------------ cache-salt key

    async def ensure_salt_key(self) -> bytes:
        """The secret every cache salt derives from: read it, or create it on first start."""
        if self._salt_key is not None:
            return self._salt_key
        secret = await self.api.get("secrets", SALT_SECRET_NAME, self.namespace)
        if secret is None:
            try:
                secret = await self.api.create(render_salt_secret(self.namespace, secrets.token_bytes(SALT_KEY_BYTES)))
                log.info("created the cache-salt key Secret %s/%s", self.namespace, SALT_SECRET_NAME)
            except RetryableApiError as exc:
                if exc.status != 409:
                    raise
                secret = await self.api.get("secrets", SALT_SECRET_NAME, self.namespace)  # another start won the race
        try:
            key = base64.b64decode((secret or {}).get("data", {}).get(SALT_SECRET_KEY, ""), validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) < 16:
            raise OperatorError(f"Secret {self.namespace}/{SALT_SECRET_NAME}: data.{SALT_SECRET_KEY} must hold at least "
                                "16 random bytes; delete the Secret to have a new key generated (cache salts will change)")
        self._salt_key, self._key_hash_key = key, derive_key_hash_key(key)
        self._renderer.key_hash_key = self._key_hash_key.hex()
        return key

    def _hash_api_key(self, key: str) -> str:
        if self._key_hash_key is None:
            raise OperatorError("API keys are hashed only once the cache-salt key is read (ensure_salt_key)")
        return hash_api_key(key, self._key_hash_key)

    # ------------------------------------------------------------------ tenant tables

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
        self._pending.setdefault(name, False)
        self._kick()

    async def _pool_changed(self, key: str, new: Indexed[InferencePool] | None, old: Indexed[InferencePool] | None) -> None:
        self._pending_pools.add(key)
        self._kick()

    def _kick(self) -> None:
        """Refresh in the background what watch events marked (a burst of events: one pass)."""
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_marks(), name="slaq-table-refresh")

    async def _flush_marks(self) -> None:
        while self._pending or self._pending_pools or self._pending_status or self._everything:
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
        users = self._key_users.get((namespace, name))
        if not users:
            return
        log.info("key Secret %s/%s changed: replanning tenant(s) %s", namespace, name, ", ".join(sorted(users)))
        try:
            await self.refresh(tenants=users)
        except OperatorError as exc:  # the marks stay pending: the next event or usage tick tries again
            log.warning("after key Secret %s/%s changed: %s", namespace, name, exc)

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
            self._pending[name] = self._pending.get(name, False) or force
        self._pending_pools.update(pools)
        self._pending_status.update(status)
        await self._list_key_namespaces(self.view.tenant_names() if self._everything else list(self._pending))
        async with self._lock:
            marked, marked_pools, due = self._pending, self._pending_pools, self._pending_status
            everything = self._everything
            if not (marked or marked_pools or due or everything):
                return  # a refresh that started after these marks took them
            self._pending, self._pending_pools, self._pending_status = {}, set(), set()
            try:
                await self._reconcile_tables(marked, marked_pools, due, everything)
                self._everything = False
            except BaseException:
                for name, forced in marked.items():
                    self._pending[name] = self._pending.get(name, False) or forced
                self._pending_pools |= marked_pools
                self._pending_status |= due
                raise
        if self._pending:
            self._kick()  # tenants whose key claims another tenant's plan just changed (duplicate keys)

    async def _list_key_namespaces(self, names: Iterable[str]) -> None:
        """Start watching the key namespaces these tenants name, and wait (outside the lock) for the
        first listing of the ones first named to succeed or fail: a namespace that cannot be
        listed is reported on its tenants at once, never awaited again."""
        first = []
        for name in names:
            found = self.view.tenant(name)
            if found is None or found.model is None:
                continue
            namespace = found.model.spec.api_key_secret_ref.namespace
            if self._key_namespace_allowed(namespace) and not self.keys.watching(namespace):
                first.append(self.keys.start(namespace).tried.wait())
        if first:
            await asyncio.wait([asyncio.ensure_future(w) for w in first], timeout=KEY_SYNC_TIMEOUT_S)

    def _key_namespace_allowed(self, namespace: str) -> bool:
        return namespace in self.key_secret_namespaces

    async def _key_namespace_synced(self, namespace: str) -> None:
        """A key namespace is listed (perhaps after failing), or failed to list for a new reason: its
        tenants are planned again, so their status says which."""
        users = {name for (ns, _), names in self._key_users.items() if ns == namespace for name in names}
        for name in users:
            self._pending.setdefault(name, False)
        if users:
            self._kick()

    def _replicas(self, pool: InferencePool) -> int:
        """How many replicas may be serving the pool: what the split divides by."""
        return max(pool.spec.replicas.current, self._observed_replicas.get(pool_key(pool), 0))

    def _moved_pools(self, marked_pools: set[str], pools: dict[str, Indexed[InferencePool]],
                     scan: bool = True) -> tuple[set[str], set[str]]:
        """(pools whose tables change, tenants to plan again) after these pools changed or went;
        without `scan`, the tenants a pool now binds are not looked for (all are planned anyway)."""
        changed, moved = set(), set()
        for key in marked_pools:
            found = pools.get(key)
            inputs = PoolInputs.of(found.model, self._replicas(found.model)) if found is not None and found.model else None
            if inputs == self._pool_inputs.get(key) and key in self._written:
                continue
            changed.add(key)
            moved |= set(self._entries.get(key, {}))
            if found is None or found.model is None:
                self._pool_inputs.pop(key, None)
                continue
            self._pool_inputs[key] = inputs
            if scan:
                moved |= {t.body["metadata"]["name"] for t in self.view.tenants() if binds(t.model, found.model, self.open_namespaces)}
        return changed, moved

    async def _reconcile_tables(self, marked: dict[str, bool], marked_pools: set[str], due: set[str], everything: bool) -> None:
        salt_key = await self.ensure_salt_key()
        pools = {pool_key(p.model): p for p in self.view.pools() if p.model is not None}
        if everything:
            marked_pools = marked_pools | set(pools) | set(self._entries)
            marked = {**marked, **{name: True for name in [*self.view.tenant_names(), *self._plans]}}
        changed, moved = self._moved_pools(marked_pools, pools, scan=not everything)
        for key in changed:
            self._touch(key)
        forced = {name for name, force in marked.items() if force} | moved
        replicas = {key: self._replicas(p.model) for key, p in pools.items() if p.model is not None}
        usage = {key: u for key, u in self._usage.items() if key in pools}
        models = [p.model for p in pools.values() if p.model is not None]
        replanned: set[str] = set()
        for name in sorted(set(marked) | moved):
            found = self.view.tenant(name)
            before = set(self._plans[name].entries) if name in self._plans else set()
            if found is None or found.model is None:
                for key in self._drop_tenant(name, before):
                    self._touch(key, name)
                await self._tenant_not_served(name)
                continue
            tenant = found.model
            hashes = await self._key_hashes(tenant)
            inputs = (tenant.spec.model_dump_json(), sorted(tenant.metadata.labels.items()), hashes, self._key_problems.get(name))
            if name not in forced and self._tenant_inputs.get(name) == inputs:
                continue
            self._tenant_inputs[name] = inputs
            part = plan_tenant(tenant, models, hashes, salt_key, replicas, usage, self._splits.get(name), self.open_namespaces)
            self._plans[name], self._splits[name] = part, part.splits
            for key in before - set(part.entries):
                self._entries.get(key, {}).pop(name, None)
                self._touch(key, name)
            for key, entry in part.entries.items():
                if self._entries.setdefault(key, {}).get(name) != entry:
                    self._entries[key][name] = entry
                    self._touch(key, name)
            replanned.add(name)
        for key in set(self._touched) - set(pools):  # pools gone: nothing to write
            for book in (self._entries, self._written, self._parts, self._members, self._touched, self._table_names):
                book.pop(key, None)
        blocked = await self._write_tables(pools)
        await self._write_tenant_statuses(replanned | due | blocked)

    async def _tenant_not_served(self, name: str) -> None:
        """An invalid tenant is told why on its status; a deleted one loses the finalizer an
        earlier version put on it (tables need none: a tenant gone is a tenant left out)."""
        found = self.view.tenant_entry(name)
        if found is None:
            return
        meta = found.body.get("metadata") or {}
        if deleting(found.body):
            if FINALIZER in (meta.get("finalizers") or []):
                await self.api.merge_patch("tenantslas", name, None,
                                           {"metadata": {"finalizers": [f for f in meta["finalizers"] if f != FINALIZER]}})
            return
        if found.error is not None:
            ready = _condition_of(found.body, "Ready") or {}
            reported = ready.get("reason") == "InvalidSpec" and ready.get("message") == str(found.error) \
                and (found.body.get("status") or {}).get("observedGeneration") == meta.get("generation")
            if not reported:
                log.warning("refused: %s", found.error)
                await self.report_invalid("tenantslas", found.body, found.error)

    def _drop_tenant(self, name: str, pools: set[str]) -> set[str]:
        """Forget a tenant that is gone, being deleted or invalid; the pools whose tables held it."""
        for book in (self._plans, self._splits, self._tenant_inputs, self._key_problems, self._accepted):
            book.pop(name, None)
        self._claim(name, frozenset())
        ref = self._key_ref.pop(name, None)
        if ref is not None:
            self._key_users.get(ref, set()).discard(name)
        for key in pools:
            self._entries.get(key, {}).pop(name, None)
        return pools

    async def _key_hashes(self, tenant: TenantSLA) -> list[str]:
        """The tenant's key hashes from the watched Secrets (keys.py): no Secret is read per event,
        and nothing is waited for. What keeps keys out is recorded in `_key_problems` (the tenant's
        status says it): a Secret outside the allowed namespaces, one not listed (yet), one not
        labelled for this tenant, weak keys, more keys than spec.maxKeys, keys another tenant holds."""
        name, ref = tenant.metadata.name, tenant.spec.api_key_secret_ref
        where = (ref.namespace, ref.name)
        if self._key_ref.get(name) != where:
            old = self._key_ref.get(name)
            if old is not None:
                self._key_users.get(old, set()).discard(name)
            self._key_ref[name] = where
            self._key_users.setdefault(where, set()).add(name)
        secret = f"Secret {ref.namespace}/{ref.name}"
        if not self._key_namespace_allowed(ref.namespace):
            found = KeySet(problem=f"{secret}: spec.apiKeySecretRef.namespace must be one of the namespaces the operator reads key "
                           f"Secrets in ({', '.join(sorted(self.key_secret_namespaces))}; chart: rbac.secretNamespaces)",
                           reason="KeySecretNotAllowed")
        else:
            found = self.keys.get(*where)
            if found.hashes and found.tenant != name:
                found = KeySet(problem=f"{secret} is labelled {TENANT_LABEL}={found.tenant or '(none)'}, not {name}: label it "
                               f"{TENANT_LABEL}={name} to give its keys to this tenant", reason="KeySecretNotLabelled")
        hashes, problem = list(found.hashes), (found.reason, found.problem) if found.problem is not None else None
        if len(hashes) > tenant.spec.max_keys:
            hashes = self._accepted.get(name, [])
            problem = ("TooManyKeys", f"{secret} holds {len(found.hashes)} keys, more than spec.maxKeys ({tenant.spec.max_keys}); "
                       f"the {len(hashes)} key(s) accepted before stay in force: remove keys or raise spec.maxKeys")
        else:
            self._accepted[name] = hashes
        shared = self._claim(name, frozenset(hashes))
        if shared:
            hashes = [h for h in hashes if h not in shared]
            others = sorted({other for h in shared for other in self._hash_owners[h]} - {name})
            problem = ("DuplicateKey", f"{len(shared)} key(s) of {secret} are also keys of tenant(s) {', '.join(others)}; "
                       "a key must belong to one tenant: it is refused for all of them until one Secret drops it")
        if problem is not None:
            self._key_problems[name] = problem
        else:
            self._key_problems.pop(name, None)
        return hashes

    def _claim(self, name: str, hashes: frozenset[str]) -> set[str]:
        """Record the key hashes a tenant's Secret holds; the ones another tenant holds too. A
        tenant whose shared keys change is marked to be planned again (it must refuse them too)."""
        before = self._claimed.get(name, frozenset())
        touched: set[str] = set()
        for h in before - hashes:
            owners = self._hash_owners.get(h, set())
            owners.discard(name)
            touched |= owners
            if not owners:
                self._hash_owners.pop(h, None)
        for h in hashes - before:
            owners = self._hash_owners.setdefault(h, set())
            touched |= owners
            owners.add(name)
        if hashes:
            self._claimed[name] = hashes
        else:
            self._claimed.pop(name, None)
        for other in touched:
            self._pending[other] = True
        return {h for h in hashes if len(self._hash_owners.get(h, ())) > 1}

    def _touch(self, key: str, tenant: str | None = None) -> None:
        """The pool's table must be written again: the part holding `tenant`, or (None) all of it."""
        if tenant is None:
            self._touched[key] = None
        elif (touched := self._touched.setdefault(key, set())) is not None:
            touched.add(tenant)

    def _lowers_a_share(self, key: str, table: TenantTable) -> bool:
        written = self._written.get(key, {}).get(table.part or 0)
        old = {t.name: t.share for t in (written.tenants if written is not None else [])}
        for entry in table.tenants:
            before = old.get(entry.name)
            if before is None:
                continue
            for field in ("requests_per_minute", "tokens_per_minute", "max_concurrency"):
                a, b = getattr(before, field), getattr(entry.share, field)
                if b is not None and (a is None or b < a):
                    return True
        return False

    def _parts_to_write(self, key: str, touched: set[str] | None) -> list[tuple[TenantTable, dict[str, str]]]:
        """The parts of the pool's table to write, with their Secret data: the parts holding the
        touched tenants, or a new split (as few parts as fit) when all changed or a part outgrew
        its Secret."""
        entries, count, members = self._entries.get(key, {}), self._parts.get(key), self._members.get(key)
        if count is not None and members is not None and touched is not None:
            for name in touched:
                part = members[part_of(name, count)]
                if name in entries:
                    part.add(name)
                else:
                    part.discard(name)
            out = []
            for index in sorted({part_of(name, count) for name in touched}):
                table, texts = self._renderer.render(key, [entries[name] for name in members[index]], index, count)
                if data_bytes(texts) > SECRET_DATA_LIMIT:
                    break
                out.append((table, texts))
            else:
                return out
        split = split_table(key, entries.values(), (count or 1) if touched is not None else 1, renderer=self._renderer)
        self._parts[key] = len(split)
        self._members[key] = [{entry.name for entry in table.tenants} for table, _ in split]
        return split

    async def _write_tables(self, pools: dict[str, Indexed[InferencePool]]) -> set[str]:
        """Apply the changed parts of the tables whose entries changed, and their `status.tenants`,
        a few pools at once (WRITERS).

        Lowered shares are written first (all pools that lower one, then the rest), so the sum in
        force stays within the quota while raised shares wait (operator/README.md: overshoot bound).
        A table split over fewer Secrets than before has the parts beyond its count deleted.

        A table too large to write (TableTooLarge) is left as last written and reported on its pool
        and on the tenants whose entries that leaves unwritten; the other pools are written. Returns
        the tenants whose status that changes."""
        plans, blocked_before = {}, {t for names in self._table_blocked.values() for t in names}
        for key, touched in self._touched.items():
            try:
                plans[key] = self._parts_to_write(key, touched)
            except TableTooLarge as exc:
                self._table_problems[key] = ("TableTooLarge", str(exc))
                self._table_blocked[key] = self._unwritten(key)
                log.warning("%s; the other pools' tables are written", exc)
            else:
                self._table_problems.pop(key, None)
                self._table_blocked.pop(key, None)
        lowered = {key for key, parts in plans.items() if any(self._lowers_a_share(key, table) for table, _ in parts)}
        gate = asyncio.Semaphore(WRITERS)

        async def one(key: str) -> None:
            async with gate:
                try:
                    await self._write_table(pools[key], key, plans[key])
                except ApiError as exc:
                    if exc.status != 403:
                        raise
                    # The chart grants Secret writes only where it is told pools live: this pool's
                    # table waits (its tenants stay touched) and the others are written.
                    namespace = pools[key].body["metadata"]["namespace"]
                    self._table_problems[key] = ("SecretsForbidden", f"pool {key}: the operator may not write Secrets in namespace {namespace} "
                                                 "(add it to the chart's rbac.poolNamespaces): its tenant table is not written")
                    self._table_blocked[key] = self._unwritten(key)
                    log.warning("pool %s: %s", key, exc)

        for wave in (sorted(lowered), sorted(set(plans) - lowered)):
            results = await asyncio.gather(*(one(key) for key in wave), return_exceptions=True)
            if failures := [r for r in results if isinstance(r, BaseException)]:
                raise failures[0]
        live = sum(len(entries) for entries in self._entries.values())
        if len(self._renderer) > 2 * live + 1000:  # entries replaced since: their JSON goes too
            self._renderer.keep_only(entry for entries in self._entries.values() for entry in entries.values())
        return blocked_before ^ {t for names in self._table_blocked.values() for t in names}

    def _unwritten(self, key: str) -> set[str]:
        """The pool's tenants whose current entries its written table does not hold."""
        written = {entry.name: entry for table in self._written.get(key, {}).values() for entry in table.tenants}
        return {name for name, entry in self._entries.get(key, {}).items() if written.get(name) != entry}

    async def _write_table(self, pool: Indexed[InferencePool], key: str, parts: list[tuple[TenantTable, dict[str, str]]]) -> None:
        meta, written = pool.body["metadata"], self._written.setdefault(key, {})
        for table, texts in parts:
            if written.get(table.part or 0) != table:
                if not await self._apply_owned(render_table_secret(pool.model, table, texts), pool.body):
                    self._foreign.setdefault(key, [])
                    name = f"Secret {meta['namespace']}/{table_secret_name(meta['name'], table.part or 0)}"
                    if name not in self._foreign[key]:
                        self._foreign[key].append(name)
                    continue
                written[table.part or 0] = table
        for stale in sorted(part for part in written if part >= self._parts[key]):
            await self.api.delete("secrets", table_secret_name(meta["name"], stale), meta["namespace"])
            del written[stale]
        self._touched.pop(key, None)
        names = sorted(self._entries.get(key, {}))
        if self._table_names.get(key, (pool.body.get("status") or {}).get("tenants")) != names:
            await self.api.patch_status("inferencepools", meta["name"], meta["namespace"], {"tenants": names})
        self._table_names[key] = names

    async def _write_tenant_statuses(self, names: set[str]) -> None:
        """Status of each named tenant still served, a few patches in flight at once; the ones that
        failed stay due, and the first failure is raised."""
        due = sorted(names)
        gate = asyncio.Semaphore(STATUS_WRITERS)

        async def one(name: str) -> None:
            found = self.view.tenant(name)
            if found is None or found.model is None:
                return
            async with gate:
                try:
                    await self._write_tenant_status(found.model, found.body)
                except BaseException:
                    self._pending_status.add(name)
                    raise

        results = await asyncio.gather(*(one(name) for name in due), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]

    async def _write_tenant_status(self, tenant: TenantSLA, body: dict[str, Any]) -> None:
        name, generation = tenant.metadata.name, body["metadata"].get("generation")
        plan = self._plans.get(name)
        pools = [share.to_wire() for share in (plan.pools if plan else [])]
        ref = self._key_ref.get(name)
        key_count = len(self.keys.get(*ref).hashes) if ref else 0
        problem = self._key_problems.get(name)
        blocked = sorted(key for key, names in self._table_blocked.items() if name in names)
        if problem is None and blocked:
            problem = (self._table_problems[blocked[0]][0], "; ".join(f"{self._table_problems[key][1]}: this tenant's entry there is not updated"
                                                                     for key in blocked))
        ready = bool(pools) and problem is None
        conditions = [
            condition("Ready", ready, "Bound" if ready else (problem[0] if problem else "NoPool"),
                      f"in the tenant tables of {len(pools)} pool(s)" if ready else (problem[1] if problem else self._no_pool_message(tenant)),
                      generation),
            condition("Degraded", problem is not None, problem[0] if problem else "AsExpected", problem[1] if problem else "", generation),
        ]
        old = body.get("status") or {}
        verdict, attainment = self._attainment_verdict(tenant, body)
        conditions.append(condition("AtRisk", None if verdict.status == "Unknown" else verdict.at_risk,
                                    verdict.reason, verdict.message, generation))
        status = {"observedGeneration": generation, "keyCount": key_count, "pools": pools, "attainment": attainment,
                  "conditions": merge_conditions(old.get("conditions"), conditions)}
        if any(old.get(k) != v for k, v in status.items()):
            await self.api.patch_status("tenantslas", name, None, status)
        was = (_condition_of(body, "AtRisk") or {}).get("status")
        if (was == "True") != verdict.at_risk:
            await self._post_event(body, WARNING if verdict.at_risk else NORMAL, verdict.reason, verdict.message)

    def _no_pool_message(self, tenant: TenantSLA) -> str:
        selector = tenant.spec.pool_selector
        if selector.match_labels or selector.match_expressions:
            return "no InferencePool matches spec.poolSelector (and selects this tenant)"
        opened = ", ".join(sorted(self.open_namespaces))
        return ("spec.poolSelector is empty: it binds only pools in the namespaces open to every tenant"
                + (f" ({opened})" if opened else " (none are: the chart's binding.openNamespaces)") + "; name the pools to use")

    def _attainment_verdict(self, tenant: TenantSLA, body: dict[str, Any]) -> tuple[Verdict, float | None]:
        """The AtRisk verdict and `status.attainment` from the ledger's window; while the ledger
        warms up with too few requests to judge, what the object records is kept."""
        at = self.clock()
        outcomes = self.attainment.outcomes(tenant.metadata.name, at)
        verdict = judge(tenant, outcomes, window_s=self.attainment.window_s, min_requests=self.min_requests,
                        warming=self.attainment.warming(at))
        if verdict.status is not None:
            return verdict, outcomes.attainment
        recorded = _condition_of(body, "AtRisk")
        kept = (Verdict(recorded["status"], recorded.get("reason", ""), recorded.get("message", "")) if recorded
                else Verdict("Unknown", verdict.reason, verdict.message))
        return kept, (body.get("status") or {}).get("attainment", outcomes.attainment)

    async def _post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event is a notice, not state: failing to post one is logged, never retried."""
        try:
            await self.api.create(render_event(body, type_=type_, reason=reason, message=message, timestamp=now()))
        except OperatorError as exc:
            log.warning("could not post the %s event for %s: %s", reason, name_of(body), exc)

    # ------------------------------------------------------------------ pools

    async def report_invalid(self, plural: str, body: dict[str, Any], error: SpecError) -> None:
        """Say on the object itself why it is not served (`kubectl describe` shows it)."""
        meta = body["metadata"]
        generation = meta.get("generation")
        conditions = [condition("Ready", False, "InvalidSpec", str(error), generation),
                      condition("Degraded", True, "InvalidSpec", f"fix {error.field}: {error.message}", generation)]
        old = body.get("status") or {}
        await self.api.patch_status(plural, meta["name"], meta.get("namespace"),
                                    {"observedGeneration": generation, "conditions": merge_conditions(old.get("conditions"), conditions)})

    async def reconcile_pool(self, body: dict[str, Any]) -> None:
        """Apply the pool's children (table first, so pods mount it on their first start)."""
        try:
            pool = parse_pool(body)
        except SpecError as exc:
            await self.report_invalid("inferencepools", body, exc)
            raise
        await self.refresh(pools=[pool_key(pool)])
        await self._apply_children(pool, body)
        await self.apply_gateway_pool(pool, body)
        deployment = await self.api.get("deployments", pool.metadata.name, pool.metadata.namespace)
        await self._write_pool_status(pool, body, deployment)

    async def _apply_children(self, pool: InferencePool, body: dict[str, Any]) -> None:
        """The pool's children; its HPA only while no other autoscaler scales the pool (one owner of
        the replicas: two HPAs on one scale subresource undo each other's decisions)."""
        key = pool_key(pool)
        children = render_children(pool)
        self._rivals[key] = await self._rival_autoscaler(pool, body) if pool.spec.autoscaling.enabled else None
        if self._rivals[key] is not None:
            children = [child for child in children if child["kind"] != "HorizontalPodAutoscaler"]
        foreign = []
        for child in children:
            if not await self._apply_owned(child, body):
                foreign.append(f"{child['kind']} {pool.metadata.namespace}/{child['metadata']['name']}")
        tables = [name for name in self._foreign.get(pool_key(pool), []) if name.startswith("Secret ")]  # found by _write_table
        self._foreign[pool_key(pool)] = foreign + tables
        if all(child["kind"] != "HorizontalPodAutoscaler" for child in children):
            await self._delete_owned("horizontalpodautoscalers", pool.metadata.name, pool.metadata.namespace, body)

    async def _rival_autoscaler(self, pool: InferencePool, body: dict[str, Any]) -> str | None:
        """Another HPA on the pool's scale subresource (KEDA's ScaledObject drives one named
        keda-hpa-<scaledobject>), described for the pool's status; None when there is none."""
        try:
            hpas = await self.api.list("horizontalpodautoscalers", pool.metadata.namespace)
        except ApiError as exc:
            if exc.status != 403:
                raise
            # A hand-made role without `list` on HPAs: the pool keeps its HPA, unchecked.
            log.debug("not allowed to list horizontalpodautoscalers in %s: %s", pool.metadata.namespace, exc)
            return None
        for hpa in hpas:
            target = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
            meta = hpa.get("metadata") or {}
            owners = meta.get("ownerReferences") or []
            if (target.get("kind") == "InferencePool" and str(target.get("apiVersion", "")).startswith(f"{GROUP}/")
                    and target.get("name") == pool.metadata.name and body["metadata"]["uid"] not in {o.get("uid") for o in owners}):
                made_by = next((f" (made by {o.get('kind')} {o.get('name')})" for o in owners if o.get("controller")), "")
                return f"HorizontalPodAutoscaler {pool.metadata.namespace}/{meta.get('name')}{made_by}"
        return None

    async def _apply_owned(self, child: dict[str, Any], owner: dict[str, Any]) -> bool:
        """Apply a child only if it is absent or already the owner's; False (nothing written) for a
        foreign object of that name, which server-side apply would otherwise take over and garbage
        collection later delete with the pool. Checked once per object: created, or a JSON-patch
        `test` of its controller reference (no read right needed)."""
        meta, uid = child["metadata"], owner["metadata"]["uid"]
        plural = plural_of(child)
        known = (plural, meta["namespace"], meta["name"], uid)
        desired = owned_by(child, owner)
        if known not in self._owned:
            try:
                await self.api.create(desired)
                self._owned.add(known)
                return True
            except RetryableApiError as exc:
                if exc.status != 409:
                    raise
            if not await self.api.owned_by(plural, meta["name"], meta["namespace"], uid):
                log.warning("%s %s/%s exists and is not owned by %s; left alone", child["kind"], meta["namespace"], meta["name"], name_of(owner))
                return False
            self._owned.add(known)
        await self.api.apply(desired)
        return True

    async def _delete_owned(self, plural: str, name: str, namespace: str, owner: dict[str, Any]) -> None:
        """Delete a child the pool no longer wants, only if it is the pool's (absent: nothing to do)."""
        known = (plural, namespace, name, owner["metadata"]["uid"])
        try:
            if known not in self._owned and not await self.api.owned_by(plural, name, namespace, owner["metadata"]["uid"]):
                return  # someone else's object of that name: never deleted
        except NotFound:
            return
        await self.api.delete(plural, name, namespace)
        self._owned.discard(known)

    async def apply_gateway_pool(self, pool: InferencePool, body: dict[str, Any]) -> None:
        """Apply (or delete) the pool's GIE InferencePool (gateway.py). A cluster that does not serve
        that API, or an object of that name the pool does not own, is reported in the pool's
        status, never raised: the pool itself keeps being served."""
        key, name, namespace = pool_key(pool), pool.metadata.name, pool.metadata.namespace
        desired = render_gateway_inference_pool(pool)
        if desired is None:
            self._gateway.pop(key, None)
            self._objectives.pop(key, None)
            await self._delete_gateway_object(GIE_PLURAL, name, namespace, body)
            for tier in Tier:
                await self._delete_gateway_object(OBJECTIVE_PLURAL, objective_name(name, tier), namespace, body)
            return
        try:
            existing = await self.api.get(GIE_PLURAL, name, namespace)
            owners = {ref.get("uid") for ref in ((existing or {}).get("metadata") or {}).get("ownerReferences") or []}
            if existing is not None and body["metadata"]["uid"] not in owners:
                self._gateway[key] = GatewayOutcome(False, "NameTaken", f"{GIE_API_VERSION} InferencePool {namespace}/{name} exists "
                                                    "and is not owned by this pool; slaq leaves it alone (delete it, or rename one)")
                return
            await self.api.apply(owned_by(desired, body))
        except NotFound:
            self._gateway[key] = GatewayOutcome(False, "ApiNotServed", f"the cluster does not serve {GIE_API_VERSION} InferencePool: "
                                                "install the Gateway API Inference Extension CRDs (docs/gateway.md); retried on every usage tick")
            return
        except ApiError as exc:
            if exc.status != 403:
                raise
            self._gateway[key] = GatewayOutcome(False, "Forbidden", f"the operator may not read or write {GIE_PLURAL}: grant it "
                                                "get, create, patch and delete (the chart's RBAC does); retried on every usage tick")
            return
        picker = pool.spec.gateway.endpoint_picker
        self._gateway[key] = GatewayOutcome(True, "Applied", f"{GIE_API_VERSION} InferencePool {name} selects this pool's pods on port "
                                            f"{pool.spec.sidecar.port}; endpoint picker Service {endpoint_picker_name(pool)}:{picker.port} "
                                            f"({picker.failure_mode.value}). Tenant quotas are shared evenly over the pool's replicas, "
                                            "so routing a tenant unevenly gets 429s from its busy replica first (docs/gateway.md)")
        self._objectives[key] = await self._apply_objectives(pool, body)

    async def _apply_objectives(self, pool: InferencePool, body: dict[str, Any]) -> GatewayOutcome:
        """The pool's llm-d InferenceObjectives (one per tier). Optional beside the InferencePool: a
        cluster without llm-d's CRDs is reported in the condition, not as Degraded."""
        objectives = render_inference_objectives(pool)
        taken = []
        try:
            for objective in objectives:
                if not await self._apply_owned(objective, body):
                    taken.append(objective["metadata"]["name"])
        except NotFound:
            return GatewayOutcome(False, "ApiNotServed", f"the cluster does not serve {OBJECTIVE_API_VERSION} InferenceObjective: install the "
                                  "llm-d router's CRDs to order requests by tier at the gateway (docs/gateway.md); retried on every usage tick")
        except ApiError as exc:
            if exc.status != 403:
                raise
            return GatewayOutcome(False, "Forbidden", f"the operator may not write {OBJECTIVE_PLURAL}: grant it create, patch and delete "
                                  "(the chart's RBAC does); retried on every usage tick")
        if taken:
            return GatewayOutcome(False, "NameTaken", f"{OBJECTIVE_API_VERSION} InferenceObjective {', '.join(taken)} in "
                                  f"{pool.metadata.namespace} exist and are not owned by this pool; slaq leaves them alone "
                                  "(delete them, or rename the pool)")
        priorities = ", ".join(f"{o['metadata']['name']} ({o['spec']['priority']})" for o in objectives)
        return GatewayOutcome(True, "Applied", f"{OBJECTIVE_API_VERSION} InferenceObjectives {priorities}; a request names one in "
                              f"the {OBJECTIVE_HEADER} header")

    async def _delete_gateway_object(self, plural: str, name: str, namespace: str, owner: dict[str, Any]) -> None:
        """Delete a gateway object the pool no longer wants, only if it is the pool's (a foreign one of
        that name stays; none, or the API not served, is fine)."""
        try:
            await self._delete_owned(plural, name, namespace, owner)
        except ApiError as exc:
            if exc.status != 403:
                raise
            # RBAC without the gateway's kinds (a hand-made role): a pool that does not use the
            # gateway must not fail for it.
            log.debug("not allowed to delete %s %s/%s: %s", plural, namespace, name, exc)

    async def observe_pool(self, body: dict[str, Any]) -> None:
        """Read usage from the pool's pods, re-split quotas, and refresh the pool's status."""
        pool = parse_pool(body)
        key = pool_key(pool)
        bound = set(self._entries.get(key, {}))  # a pod's report counts only for the tenants this pool serves
        observations = [bound_only(o, bound) for o in await self.usage_source.observe(pool)]
        before, usage = self._usage.get(key, {}), sum_usage(observations)
        self._usage[key] = usage
        moved = set(before) | set(usage)  # active tenants: their split keeps moving toward demand (quotas.py smoothing)
        judged = {series[0] for o in observations for series in o.outcomes}
        self._risk[key] = mean_sla_risk(observations)
        self.attainment.record(key, [(o.pod, o.outcomes) for o in observations], self.clock())
        if any(key in book and not book[key].ok for book in (self._gateway, self._objectives)):
            await self.apply_gateway_pool(pool, body)  # the CRDs may have been installed since
        if pool.spec.autoscaling.enabled and await self._rival_autoscaler(pool, body) != self._rivals.get(key):
            await self._apply_children(pool, body)  # another autoscaler came or went
        deployment = await self.api.get("deployments", pool.metadata.name, pool.metadata.namespace)
        running = int(((deployment or {}).get("status") or {}).get("replicas") or 0)
        self._observed_replicas[key] = max(running, len(observations))
        await self.refresh(tenants=moved, pools=[key], force=True, status=judged)
        fresh = found.body if (found := self.view.pool(key)) is not None else body  # the index holds the latest status
        await self._write_pool_status(pool, fresh, deployment, observed_pods=len(observations))

    def forget_pool(self, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        for book in (self._usage, self._risk, self._observed_replicas, self._written, self._parts, self._members, self._gateway,
                     self._objectives, self._rivals, self._table_problems, self._table_blocked, self._foreign):
            book.pop(key, None)
        self.attainment.forget_pool(key)

    async def _write_pool_status(self, pool: InferencePool, body: dict[str, Any], deployment: dict[str, Any] | None,
                                 observed_pods: int | None = None) -> None:
        key, generation = pool_key(pool), body["metadata"].get("generation")
        dstatus = (deployment or {}).get("status") or {}
        ready, wanted = int(dstatus.get("readyReplicas") or 0), pool.spec.replicas.current
        tenants = sorted(self._entries.get(key, {}))
        missing = sorted(t for t in tenants if t in self._key_problems)
        degraded_reason, degraded_message = "AsExpected", ""
        if key in self._table_problems:
            degraded_reason, degraded_message = self._table_problems[key]
            if degraded_reason == "TableTooLarge":
                degraded_message += "; the table last written stays in force"
        elif self._foreign.get(key):
            degraded_reason = "NameTaken"
            degraded_message = (f"{', '.join(self._foreign[key])} exist(s) and are not owned by this pool; slaq leaves them alone "
                                "(delete them, or rename the pool)")
        elif missing:
            degraded_reason, degraded_message = "TenantKeysMissing", "; ".join(self._key_problems[t][1] for t in missing)
        elif observed_pods is not None and observed_pods < ready:
            degraded_reason = "UsageUnavailable"
            degraded_message = f"{ready - observed_pods} of {ready} ready pod(s) did not report usage; their demand is not counted"
        rival = self._rivals.get(key) if pool.spec.autoscaling.enabled else None
        if degraded_reason == "AsExpected" and rival is not None:
            degraded_reason = "ScaledByAnother"
            degraded_message = (f"{rival} also scales this pool, so the operator leaves its own HPA out: one autoscaler owns the "
                                "replicas. Set spec.autoscaling.enabled false, or remove the pool from that autoscaler "
                                "(the chart's autoscaling.keda.pools)")
        gateway = self._gateway.get(key) if pool.spec.gateway.inference_pool else None
        if degraded_reason == "AsExpected" and gateway is not None and not gateway.ok:
            degraded_reason, degraded_message = f"Gateway{gateway.reason}", gateway.message
        conditions = [
            condition("Ready", ready >= wanted, "AllReplicasReady" if ready >= wanted else "ReplicasNotReady",
                      f"{ready}/{wanted} replicas ready", generation),
            condition("Degraded", degraded_reason != "AsExpected", degraded_reason, degraded_message, generation),
        ]
        if gateway is not None:
            conditions.append(condition("GatewayInferencePool", gateway.ok, gateway.reason, gateway.message, generation))
        objectives = self._objectives.get(key) if pool.spec.gateway.inference_pool else None
        if objectives is not None:
            conditions.append(condition("GatewayInferenceObjectives", objectives.ok, objectives.reason, objectives.message, generation))
        old = body.get("status") or {}
        status: dict[str, Any] = {
            "observedGeneration": generation,
            "replicas": int(dstatus.get("replicas") or 0),
            "readyReplicas": ready,
            "selector": selector_string(pool_selector_labels(pool.metadata.name)),
            "tenants": tenants,
            "conditions": merge_conditions(old.get("conditions"), conditions),
        }
        if self._risk.get(key) is not None:
            status["slaRisk"] = self._risk[key]
        if any(old.get(k) != v for k, v in status.items()):
            await self.api.patch_status("inferencepools", pool.metadata.name, pool.metadata.namespace, status)
