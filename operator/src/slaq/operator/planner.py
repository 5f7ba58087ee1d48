"""Deciding what the tenant tables must become, without an API: synchronous, no I/O.

From the view (view.py), the key Secrets' hashes (keys.py) and the books (books.py) the planner
decides which tenants to plan again (their own inputs moved, or their pools' did), each tenant's
entries in the pools it binds (one `plan_tenant` call per tenant, so its shares sum within its
quota), which tables those entries touch, and which parts of those tables to write. It records
its decisions in the books and returns the writes; writer.py makes them.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from slaq.api.pool import InferencePool
from slaq.api.runtime import TenantUsage
from slaq.api.table import TenantTable
from slaq.api.tenant import TenantSLA
from slaq.operator.books import Books, Marks, PoolInputs, PoolTable
from slaq.operator.keys import TENANT_LABEL, KeySet
from slaq.operator import tables
from slaq.operator.tables import TableRenderer, TableTooLarge, binding, data_bytes, part_of, plan_tenant, pool_key, split_table
from slaq.operator.view import ClusterView, Indexed, deleting

log = logging.getLogger("slaq.operator")

TableParts = list[tuple[TenantTable, dict[str, str]]]  # table parts with their Secret data


class KeyLookup(Protocol):
    def get(self, namespace: str, name: str) -> KeySet: ...

    def watching(self, namespace: str) -> bool: ...


class Planned(enum.Enum):
    SKIPPED = "skipped"  # its inputs did not change
    PLANNED = "planned"
    NOT_SERVED = "not served"  # gone, being deleted or invalid: forgotten


def same_for_tables(new: Indexed[TenantSLA], old: Indexed[TenantSLA]) -> bool:
    """Whether two versions of a tenant plan the same: same spec, labels, validity and deletion."""
    if new.model is None or old.model is None:
        return False
    return (new.model.spec == old.model.spec and new.model.metadata.labels == old.model.metadata.labels
            and deleting(new.body) == deleting(old.body))


@dataclass(frozen=True)
class Snapshot:
    """The pools one refresh plans every tenant against."""

    pools: dict[str, Indexed[InferencePool]]  # served, by pool key
    models: list[InferencePool]
    replicas: dict[str, int]  # by pool key: what its tenants' quotas are split by
    usage: dict[str, dict[str, TenantUsage]]  # by pool key, then tenant: what its pods last reported
    salt_key: bytes


@dataclass(frozen=True)
class TableWrites:
    """The table parts to apply, by pool key; lowered shares are written first (all pools that
    lower one, then the rest), so the sum in force stays within the quota while raised shares wait."""

    parts: dict[str, TableParts]
    lowered: set[str]
    status_changed: set[str]  # tenants whose table-too-large problem came or went

    def waves(self) -> list[list[str]]:
        return [sorted(self.lowered), sorted(set(self.parts) - self.lowered)]


def lowers_a_share(table: PoolTable, new: TenantTable) -> bool:
    """Whether a part lowers some tenant's share below the one last written, on any pod (a pod's
    own share where the table lists one, the pool's default share for the others)."""
    written = (table.written or {}).get(new.part or 0)
    old = {t.name: t for t in (written.tenants if written is not None else [])}
    for entry in new.tenants:
        before = old.get(entry.name)
        if before is None:
            continue
        pods = {None, *(before.pod_shares or {}), *(entry.pod_shares or {})}
        for pod in pods:
            a_share, b_share = before.share_for(pod), entry.share_for(pod)
            for field in ("requests_per_minute", "tokens_per_minute", "max_concurrency"):
                a, b = getattr(a_share, field), getattr(b_share, field)
                if b is not None and (a is None or b < a):
                    return True
    return False


def unwritten(table: PoolTable) -> set[str]:
    """The tenants whose current entries the written table does not hold."""
    written = {entry.name: entry for part in (table.written or {}).values() for entry in part.tenants}
    return {name for name, entry in table.entries.items() if written.get(name) != entry}


def parts_to_write(key: str, table: PoolTable, renderer: TableRenderer) -> TableParts:
    """The parts of the pool's table to write, with their Secret data: the parts holding the
    touched tenants, or a new split (as few parts as fit) when all changed or a part outgrew its
    Secret (TableTooLarge when no split fits)."""
    entries, count, members, touched = table.entries, table.parts, table.members, table.touched
    if count is not None and members is not None and touched is not None:
        for name in touched:
            part = members[part_of(name, count)]
            if name in entries:
                part.add(name)
            else:
                part.discard(name)
        out = []
        for index in sorted({part_of(name, count) for name in touched}):
            rendered, texts = renderer.render(key, [entries[name] for name in members[index]], index, count)
            if data_bytes(texts) > tables.SECRET_DATA_LIMIT:  # tables.py's limit, read at call time (split_table's too)
                break
            out.append((rendered, texts))
        else:
            return out
    split = split_table(key, entries.values(), (count or 1) if touched is not None else 1, renderer=renderer)
    table.parts = len(split)
    table.members = [{entry.name for entry in rendered.tenants} for rendered, _ in split]
    return split


class Planner:
    def __init__(self, view: ClusterView, books: Books, marks: Marks, keys: KeyLookup, *,
                 key_namespaces: frozenset[str], open_namespaces: frozenset[str] = frozenset()) -> None:
        self.view = view
        self.books = books
        self.marks = marks  # tenants whose shared keys change are marked here for the next refresh
        self.keys = keys
        self.key_namespaces = key_namespaces  # where a TenantSLA's apiKeySecretRef may point
        self.open_namespaces = open_namespaces

    def replicas(self, pool: InferencePool) -> int:
        """How many replicas may be serving the pool: what the split divides by."""
        found = self.books.pools.get(pool_key(pool))
        return max(pool.spec.replicas.current, found.observed_replicas if found is not None else 0)

    def unwatched_key_namespaces(self, names: Iterable[str]) -> list[str]:
        """The allowed key namespaces these tenants name that are not watched yet (in first-named order)."""
        first: list[str] = []
        for name in names:
            found = self.view.tenant(name)
            if found is None or found.model is None:
                continue
            namespace = found.model.spec.api_key_secret_ref.namespace
            if namespace in self.key_namespaces and not self.keys.watching(namespace) and namespace not in first:
                first.append(namespace)
        return first

    def snapshot(self, salt_key: bytes) -> Snapshot:
        pools = {pool_key(p.model): p for p in self.view.pools() if p.model is not None}
        replicas = {key: self.replicas(p.model) for key, p in pools.items() if p.model is not None}
        usage = {key: found.usage for key, found in self.books.pools.items() if key in pools}
        return Snapshot(pools, [p.model for p in pools.values() if p.model is not None], replicas, usage, salt_key)

    def moved_pools(self, marked_pools: Iterable[str], pools: Mapping[str, Indexed[InferencePool]],
                    scan: bool = True) -> tuple[set[str], set[str]]:
        """(pools whose tables change, tenants to plan again) after these pools changed or went;
        without `scan`, the tenants a pool now binds are not looked for (all are planned anyway)."""
        changed, moved = set(), set()
        for key in marked_pools:
            found, table = pools.get(key), self.books.pools.table(key)
            inputs = PoolInputs.of(found.model, self.replicas(found.model)) if found is not None and found.model else None
            if table is not None and inputs == table.inputs and table.written is not None:
                continue
            changed.add(key)
            moved |= set(self.books.pools.entries(key))
            moved |= set(table.refused) if table is not None else set()
            if found is None or found.model is None:
                if table is not None:
                    table.inputs = None
                continue
            self.books.pools.record(key).table.inputs = inputs
            if scan:
                moved |= {t.body["metadata"]["name"] for t in self.view.tenants()
                          if t.model is not None and binding(t.model, found.model, self.open_namespaces) is not False}
        return changed, moved

    def to_plan(self, taken: Marks, everything: bool, snapshot: Snapshot) -> tuple[list[str], set[str]]:
        """(the tenants to look at, in order; those planned again even if their inputs did not
        change); the tables of the pools that changed are marked to be written whole."""
        marked, marked_pools = taken.tenants, taken.pools
        if everything:
            marked_pools = marked_pools | set(snapshot.pools) | set(self.books.pools.keys())
            marked = {**marked, **{name: True for name in [*self.view.tenant_names(), *self.books.tenants.planned()]}}
        changed, moved = self.moved_pools(marked_pools, snapshot.pools, scan=not everything)
        for key in changed:
            self.books.pools.touch(key)
        forced = {name for name, force in marked.items() if force} | moved
        return sorted(set(marked) | moved), forced

    def plan(self, name: str, snapshot: Snapshot, force: bool) -> Planned:
        """Plan one tenant again (unless its inputs are unchanged and not `force`): its entries in
        the pools' tables, each table it changes touched; a tenant no longer served is forgotten."""
        found, record = self.view.tenant(name), self.books.tenants.get(name)
        before = set(record.plan.entries) if record is not None and record.plan is not None else set()
        refused_before = set(record.plan.refused) if record is not None and record.plan is not None else set()
        if found is None or found.model is None:
            _, others = self.books.forget_tenant(name)
            for other in others:
                self.marks.tenant(other, True)
            for key in before:
                self.books.pools.touch(key, name)
            return Planned.NOT_SERVED
        tenant = found.model
        hashes = self.key_hashes(tenant)
        record = self.books.tenants.record(name)
        inputs = (tenant.spec.model_dump_json(), sorted(tenant.metadata.labels.items()), hashes, record.key_problem)
        if not force and record.inputs == inputs:
            return Planned.SKIPPED
        record.inputs = inputs
        previous = record.plan.splits if record.plan is not None else None
        record.plan = part = plan_tenant(tenant, snapshot.models, hashes, snapshot.salt_key, snapshot.replicas, snapshot.usage,
                                         previous, self.open_namespaces)
        for key in before - set(part.entries):
            self.books.pools.entries(key).pop(name, None)
            self.books.pools.touch(key, name)
        for key, entry in part.entries.items():
            table = self.books.pools.record(key).table
            if table.entries.get(name) != entry:
                table.entries[name] = entry
                table.touch(name)
        for key in refused_before - set(part.refused):
            if (gone := self.books.pools.table(key)) is not None:
                gone.refused.pop(name, None)
        for key, refusal in part.refused.items():
            self.books.pools.record(key).table.refused[name] = refusal  # the pool's TenantsRefused condition
        return Planned.PLANNED

    def key_hashes(self, tenant: TenantSLA) -> list[str]:
        """The tenant's key hashes from the watched Secrets (keys.py): no Secret is read per event,
        and nothing is waited for. What keeps keys out is recorded as its `key_problem` (the
        tenant's status says it): a Secret outside the allowed namespaces, one not listed (yet), one
        not labelled for this tenant, weak keys, more keys than spec.maxKeys, keys another tenant holds."""
        name, ref = tenant.metadata.name, tenant.spec.api_key_secret_ref
        where = (ref.namespace, ref.name)
        self.books.tenants.refer(name, where)
        record = self.books.tenants.record(name)
        secret = f"Secret {ref.namespace}/{ref.name}"
        if ref.namespace not in self.key_namespaces:
            found = KeySet(problem=f"{secret}: spec.apiKeySecretRef.namespace must be one of the namespaces the operator reads key "
                           f"Secrets in ({', '.join(sorted(self.key_namespaces))}; chart: rbac.secretNamespaces)",
                           reason="KeySecretNotAllowed")
        else:
            found = self.keys.get(*where)
            if found.hashes and found.tenant != name:
                found = KeySet(problem=f"{secret} is labelled {TENANT_LABEL}={found.tenant or '(none)'}, not {name}: label it "
                               f"{TENANT_LABEL}={name} to give its keys to this tenant", reason="KeySecretNotLabelled")
        hashes, problem = list(found.hashes), (found.reason, found.problem) if found.problem is not None else None
        if len(hashes) > tenant.spec.max_keys:
            hashes = record.accepted
            problem = ("TooManyKeys", f"{secret} holds {len(found.hashes)} keys, more than spec.maxKeys ({tenant.spec.max_keys}); "
                       f"the {len(hashes)} key(s) accepted before stay in force: remove keys or raise spec.maxKeys")
        else:
            record.accepted = hashes
        shared, others = self.books.tenants.claim(name, frozenset(hashes))
        for other in others:
            self.marks.tenant(other, True)
        if shared:
            hashes = [h for h in hashes if h not in shared]
            holders = sorted({other for h in shared for other in self.books.tenants.owners_of(h)} - {name})
            problem = ("DuplicateKey", f"{len(shared)} key(s) of {secret} are also keys of tenant(s) {', '.join(holders)}; "
                       "a key must belong to one tenant: it is refused for all of them until one Secret drops it")
        record.key_problem = problem
        return hashes

    def drop_gone(self, pools: Mapping[str, Indexed[InferencePool]]) -> None:
        """Tables of pools no longer served: nothing to write, their tables are dropped."""
        for key in set(self.books.pools.dirty()) - set(pools):
            self.books.pools.drop_table(key)

    def table_writes(self, renderer: TableRenderer) -> TableWrites:
        """The parts of the touched tables to write. A table too large to write (TableTooLarge) is
        left as last written and recorded on its pool, with the tenants whose entries that leaves
        unwritten; the other pools are written."""
        parts, blocked_before = {}, self.books.pools.blocked_tenants()
        for key in self.books.pools.dirty():
            record = self.books.pools.record(key)
            try:
                parts[key] = parts_to_write(key, record.table, renderer)
            except TableTooLarge as exc:
                record.table_problem, record.table_problem_reason, record.blocked = str(exc), "TableTooLarge", unwritten(record.table)
                log.warning("%s; the other pools' tables are written", exc)
            else:
                record.table_problem, record.blocked = None, set()
        lowered = {key for key, out in parts.items() if any(lowers_a_share(self.books.pools.record(key).table, t) for t, _ in out)}
        return TableWrites(parts, lowered, blocked_before ^ self.books.pools.blocked_tenants())

    def prune(self, renderer: TableRenderer) -> None:
        """Forget the JSON of entries replaced since (kept while a table holds them)."""
        tables = [found.table for _, found in self.books.pools.items()]
        if len(renderer) > 2 * sum(len(t.entries) for t in tables) + 1000:
            renderer.keep_only(entry for t in tables for entry in t.entries.values())
