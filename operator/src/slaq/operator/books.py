"""What the operator remembers between refreshes: a pool book, a tenant book, and the marks owed.

Each pool's memory is one `PoolRecord` (what its pods reported, what it owns or found taken, its
table as planned and as written) and each tenant's one `TenantRecord` (its plan, its key Secret,
its keys' problems), so forgetting one is one deletion: `PoolBook.forget` (the pool is deleted)
and `Books.forget_tenant` (the tenant is gone, being deleted or invalid), which also takes its
entries out of every pool's table and keeps the tenant book's two indexes (key hash -> tenants,
key Secret -> tenants) in step. Nothing of a forgotten pool or tenant is left in another dict;
what a table's Secrets and its pool's status.tenants hold (`PoolTable.written`, `.names`) is the
cluster's state, and loses a forgotten tenant when that table is next written.

A pool that leaves the view (not listed yet, invalid, or being deleted) has only its table dropped
(`PoolBook.drop_table`): what was observed of it and what it owns stay until it is forgotten.

Pure bookkeeping: no API calls, no asyncio.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slaq.api.pool import InferencePool
from slaq.api.runtime import TenantUsage
from slaq.api.table import TenantEntry, TenantTable
from slaq.operator.tables import Refusal, TenantPlan

Owned = tuple[str, str, str, str]  # (plural, namespace, name, owner uid): an object known to be the pool's
KeyProblem = tuple[str, str]  # (condition reason, message)


@dataclass(frozen=True)
class GatewayOutcome:
    """What became of a pool's GIE InferencePool, or of its llm-d InferenceObjectives: the
    `GatewayInferencePool` / `GatewayInferenceObjectives` condition's content."""

    ok: bool
    reason: str
    message: str


@dataclass(frozen=True)
class PoolInputs:
    """What of a pool its tenants' entries depend on: which tenants it binds, and the replica
    count their quotas are split by. When it changes, every tenant of the pool is planned again."""

    labels: tuple[tuple[str, str], ...]
    tenant_selector: str
    replicas: int
    tenants: tuple[str, ...] = ()  # spec.tenants: the tenants its owner accepts

    @classmethod
    def of(cls, pool: InferencePool, replicas: int) -> "PoolInputs":
        return cls(tuple(sorted(pool.metadata.labels.items())), pool.spec.tenant_selector.model_dump_json(), replicas,
                   tuple(sorted(pool.spec.tenants)))


@dataclass
class PoolTable:
    """A pool's tenant table as planned and as written: dropped whole when the pool leaves the view."""

    inputs: PoolInputs | None = None  # what its tenants' plans came from
    entries: dict[str, TenantEntry] = field(default_factory=dict)  # by tenant
    refused: dict[str, Refusal] = field(default_factory=dict)  # by tenant: claimed or named, not bound (tables.binding)
    written: dict[int, TenantTable] | None = None  # by part: the parts last applied (None: never written)
    parts: int | None = None  # how many Secrets the table is split over
    members: list[set[str]] | None = None  # the tenants of each part
    dirty: bool = False  # must be written again
    touched: set[str] | None = None  # while dirty: the tenants whose entries changed (None: all of them)
    names: list[str] | None = None  # status.tenants last written

    def touch(self, tenant: str | None = None) -> None:
        """The table must be written again: the part holding `tenant`, or (None) all of it."""
        if tenant is None:
            self.touched = None
        elif not self.dirty:
            self.touched = {tenant}
        elif self.touched is not None:
            self.touched.add(tenant)
        self.dirty = True

    def written_clean(self) -> None:
        self.dirty, self.touched = False, None


@dataclass
class PoolRecord:
    """Everything the operator remembers of one pool (by `namespace/name`)."""

    usage: dict[str, TenantUsage] = field(default_factory=dict)  # by tenant: summed over the pods' last reports
    risk: float | None = None  # mean SLA risk the pods reported
    observed_replicas: int = 0
    gateway: GatewayOutcome | None = None
    objectives: GatewayOutcome | None = None
    rival: str | None = None  # another autoscaler of the pool, described
    foreign: list[str] = field(default_factory=list)  # objects of its children's names it does not own
    owned: set[Owned] = field(default_factory=set)
    table_problem: str | None = None  # why its table cannot be written
    table_problem_reason: str = "TableTooLarge"  # the condition reason of that: TableTooLarge, SecretsForbidden
    blocked: set[str] = field(default_factory=set)  # tenants whose entries that leaves unwritten
    table: PoolTable = field(default_factory=PoolTable)


class PoolBook:
    """PoolRecords by pool key; a record is made by the first thing written to it."""

    def __init__(self) -> None:
        self._records: dict[str, PoolRecord] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def keys(self) -> list[str]:
        return list(self._records)

    def items(self) -> list[tuple[str, PoolRecord]]:
        return list(self._records.items())

    def get(self, key: str) -> PoolRecord | None:
        return self._records.get(key)

    def record(self, key: str) -> PoolRecord:
        found = self._records.get(key)
        if found is None:
            found = self._records[key] = PoolRecord()
        return found

    def table(self, key: str) -> PoolTable | None:
        found = self._records.get(key)
        return found.table if found is not None else None

    def entries(self, key: str) -> dict[str, TenantEntry]:
        """The pool's planned entries by tenant (empty for a pool not known)."""
        found = self._records.get(key)
        return found.table.entries if found is not None else {}

    def touch(self, key: str, tenant: str | None = None) -> None:
        self.record(key).table.touch(tenant)

    def dirty(self) -> dict[str, set[str] | None]:
        """The pools whose tables must be written again, with their touched tenants (None: all)."""
        return {key: r.table.touched for key, r in self._records.items() if r.table.dirty}

    def blocked_tenants(self) -> set[str]:
        return {name for r in self._records.values() for name in r.blocked}

    def blocking(self, tenant: str) -> dict[str, tuple[str, str]]:
        """Why the tenant's entry is not written, (reason, message) by the pool key of each table that
        cannot be written (too large, or Secret writes forbidden in its namespace)."""
        return {key: (r.table_problem_reason, r.table_problem or "") for key, r in sorted(self._records.items())
                if r.blocked and tenant in r.blocked}

    def forget(self, key: str) -> set[str]:
        """Forget the pool (it was deleted); the tenants its table held."""
        found = self._records.pop(key, None)
        return set(found.table.entries) if found is not None else set()

    def drop_table(self, key: str) -> None:
        """The pool left the view: its table is not planned nor written any more (nothing else goes)."""
        found = self._records.get(key)
        if found is None:
            return
        found.table = PoolTable()
        if found == PoolRecord():
            del self._records[key]

    def forget_tenant(self, name: str) -> set[str]:
        """Take a tenant out of every table's entries and parts; the pools whose entries held it."""
        held = set()
        for key, found in self._records.items():
            if found.table.entries.pop(name, None) is not None:
                held.add(key)
            found.table.refused.pop(name, None)
            for part in found.table.members or []:
                part.discard(name)
            found.blocked.discard(name)
        return held


@dataclass
class TenantRecord:
    """Everything the operator remembers of one tenant (by name)."""

    plan: TenantPlan | None = None  # its entries, shares and splits, last planned
    inputs: tuple[Any, ...] | None = None  # what that plan came from
    key_ref: tuple[str, str] | None = None  # its key Secret (namespace, name)
    key_problem: KeyProblem | None = None  # what keeps its keys out
    accepted: list[str] = field(default_factory=list)  # its key hashes last planned without a cap problem
    claimed: frozenset[str] = frozenset()  # the key hashes its Secret holds


class TenantBook:
    """TenantRecords by name, with the indexes derived from them: which tenants hold a key hash,
    and which tenants name a key Secret."""

    def __init__(self) -> None:
        self._records: dict[str, TenantRecord] = {}
        self._hash_owners: dict[str, set[str]] = {}
        self._key_users: dict[tuple[str, str], set[str]] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._records

    def __len__(self) -> int:
        return len(self._records)

    def names(self) -> list[str]:
        return list(self._records)

    def planned(self) -> list[str]:
        return [name for name, r in self._records.items() if r.plan is not None]

    def get(self, name: str) -> TenantRecord | None:
        return self._records.get(name)

    def record(self, name: str) -> TenantRecord:
        found = self._records.get(name)
        if found is None:
            found = self._records[name] = TenantRecord()
        return found

    def refer(self, name: str, secret: tuple[str, str]) -> None:
        """The tenant's key Secret is `secret` (namespace, name)."""
        found = self.record(name)
        if found.key_ref != secret:
            self._unrefer(name, found.key_ref)
            found.key_ref = secret
            self._key_users.setdefault(secret, set()).add(name)

    def _unrefer(self, name: str, secret: tuple[str, str] | None) -> None:
        users = self._key_users.get(secret) if secret is not None else None
        if users is not None:
            users.discard(name)
            if not users:
                del self._key_users[secret]  # type: ignore[arg-type]

    def users_of(self, secret: tuple[str, str]) -> set[str]:
        """The tenants whose key Secret is `secret`."""
        return set(self._key_users.get(secret, ()))

    def users_in(self, namespace: str) -> set[str]:
        """The tenants whose key Secret is in `namespace`."""
        return {name for (ns, _), names in self._key_users.items() if ns == namespace for name in names}

    def owners_of(self, key_hash: str) -> set[str]:
        return set(self._hash_owners.get(key_hash, ()))

    def claim(self, name: str, hashes: frozenset[str]) -> tuple[set[str], set[str]]:
        """Record the key hashes the tenant's Secret holds. Returns (the ones another tenant holds
        too, the other tenants whose shared keys this changes: they must be planned again)."""
        before = self._records[name].claimed if name in self._records else frozenset()
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
        if hashes or name in self._records:
            self.record(name).claimed = hashes
        return {h for h in hashes if len(self._hash_owners.get(h, ())) > 1}, touched

    def forget(self, name: str) -> set[str]:
        """Forget the tenant; the other tenants whose shared keys that changes."""
        if name not in self._records:
            return set()
        _, touched = self.claim(name, frozenset())
        found = self._records.pop(name)
        self._unrefer(name, found.key_ref)
        return touched


class Books:
    """The pool book and the tenant book, and the one way to forget a tenant from both."""

    def __init__(self) -> None:
        self.pools = PoolBook()
        self.tenants = TenantBook()

    def forget_tenant(self, name: str) -> tuple[set[str], set[str]]:
        """Forget the tenant everywhere; (the pools whose tables held it, the other tenants whose
        shared keys that changes)."""
        return self.pools.forget_tenant(name), self.tenants.forget(name)


@dataclass
class Marks:
    """What the next refresh must look at; a refresh takes them whole and puts them back if it fails."""

    tenants: dict[str, bool] = field(default_factory=dict)  # tenant -> plan again even if its own inputs are unchanged
    pools: set[str] = field(default_factory=set)
    status: set[str] = field(default_factory=set)  # tenants whose status is due (attainment)

    def __bool__(self) -> bool:
        return bool(self.tenants or self.pools or self.status)

    def tenant(self, name: str, force: bool = False) -> None:
        self.tenants[name] = self.tenants.get(name, False) or force

    def take(self) -> "Marks":
        taken = Marks(self.tenants, self.pools, self.status)
        self.tenants, self.pools, self.status = {}, set(), set()
        return taken

    def put_back(self, taken: "Marks") -> None:
        for name, forced in taken.tenants.items():
            self.tenant(name, forced)
        self.pools |= taken.pools
        self.status |= taken.status
