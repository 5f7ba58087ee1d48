"""Which tenants a pool serves, and the tenant table each pool gets (pure functions).

`plan_tables` turns one snapshot of the cluster (pools, tenants, key hashes, observed usage)
into every pool's table at once, so all pools' shares of a tenant come from the same inputs
and their sum stays within the tenant's quota.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slaq.api.pool import InferencePool
from slaq.api.runtime import TenantUsage
from slaq.api.runtime import ENGINE_TABLE_KEY, MAX_TABLE_PARTS, TENANT_TABLE_KEY
from slaq.api.table import ClusterQuota, EngineTable, ReplicaShare, TenantEntry, TenantTable, derive_cache_salt, derive_key_hash_key
from slaq.operator.errors import OperatorError
from slaq.api.tenant import PoolShare, TenantSLA
from slaq.operator.quotas import Slot, Split, split_quota
from slaq.operator.usage import PoolUsage

RATE_UNIT = 1000  # rates are split in milli-requests (milli-tokens) per minute
FLOOR_FRACTION = 0.1
SECRET_DATA_LIMIT = 1024 * 1024  # the API server refuses a Secret whose data holds more bytes


def pool_key(pool: InferencePool) -> str:
    return f"{pool.metadata.namespace}/{pool.metadata.name}"


@dataclass(frozen=True)
class Refusal:
    """Why a pool that claims a tenant, or that the tenant claims, does not receive it (the pool's
    `TenantsRefused` condition): the rule that refused it, and what would let it bind."""

    rule: str  # NotNamedByTenant, NamespaceNotOpen or NotAccepted
    message: str


def binding(tenant: TenantSLA, pool: InferencePool, open_namespaces: frozenset[str] = frozenset()) -> bool | Refusal:
    """Whether the pool receives the tenant (its key hashes, key-hash key, cache salt, a quota share).

    Both sides agree: the tenant's side when its owner names the pool or its namespace
    (spec.pools; a tenant naming none accepts the namespaces the cluster admin opened to every
    tenant, `open_namespaces`), the pool's side when its namespace is open or its owner lists the
    tenant (spec.tenants). Each side's label selector narrows further (poolSelector, tenantSelector).
    A pool that claims the tenant (by its labels, which anyone creating a pool chooses, or by its
    list) or that the tenant names, without both agreeing, gets a Refusal; other pools False."""
    selector, name = tenant.spec.pool_selector, tenant.metadata.name
    if not (selector.matches(pool.metadata.labels) and pool.spec.tenant_selector.matches(tenant.metadata.labels)):
        return False
    namespace, refs = pool.metadata.namespace, tenant.spec.pools
    opened, listed = namespace in open_namespaces, name in pool.spec.tenants
    named = any(ref.names(namespace, pool.metadata.name) for ref in refs) if refs else opened
    if named and (opened or listed):
        return True
    by_labels = bool(selector.match_labels or selector.match_expressions)
    if not (listed or by_labels or (refs and named)):
        return False
    if named:
        return Refusal("NotAccepted", f"TenantSLA {name} names this pool, but namespace {namespace} is not open to every tenant "
                                      f"(binding.openNamespaces) and spec.tenants does not list {name}")
    if refs:
        return Refusal("NotNamedByTenant", f"TenantSLA {name} names its pools in spec.pools ({', '.join(map(str, refs))}), "
                                           "not this pool or its namespace")
    return Refusal("NamespaceNotOpen", f"TenantSLA {name} names no pools (spec.pools), so it is served only in the namespaces open "
                                       f"to every tenant (binding.openNamespaces), and {namespace} is not one")


def binds(tenant: TenantSLA, pool: InferencePool, open_namespaces: frozenset[str] = frozenset()) -> bool:
    """Whether the pool receives the tenant (`binding`)."""
    return binding(tenant, pool, open_namespaces) is True


def cache_salt(salt_key: bytes, tenant: TenantSLA) -> str:
    """Tenants of one prefixCacheGroup share a salt (and so prefix-cache blocks); others get their own."""
    group = tenant.spec.prefix_cache_group
    return derive_cache_salt(salt_key, f"group:{group}" if group else f"tenant:{tenant.metadata.name}")


def table_revision(table: TenantTable) -> str:
    body = table.model_copy(update={"revision": ""}).model_dump_json(by_alias=True, exclude_none=True)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class TenantSplits:
    """A tenant's three quota splits (None: that quota is unlimited)."""

    requests: Split | None
    tokens: Split | None
    concurrency: Split | None

    def share(self, pool: str) -> ReplicaShare:
        """The share of the pool's replicas not listed in `pod_shares` (its default)."""
        return ReplicaShare(
            requests_per_minute=self.requests.per_replica(pool) if self.requests else None,
            tokens_per_minute=self.tokens.per_replica(pool) if self.tokens else None,
            max_concurrency=self.concurrency.units[pool] if self.concurrency else None,
        )

    def pod_shares(self, pool: str) -> dict[str, ReplicaShare]:
        """The pods of the pool whose share of any quota differs from the default, with all three shares."""
        splits = [s for s in (self.requests, self.tokens, self.concurrency) if s is not None]
        listed = sorted({pod for s in splits for pod in s.pods.get(pool, {})})
        return {pod: ReplicaShare(
            requests_per_minute=self.requests.pod_units(pool, pod) / self.requests.unit if self.requests else None,
            tokens_per_minute=self.tokens.pod_units(pool, pod) / self.tokens.unit if self.tokens else None,
            max_concurrency=self.concurrency.pod_units(pool, pod) if self.concurrency else None,
        ) for pod in listed}

    def named(self) -> list[tuple[str, Split]]:
        """(spec.quotas field, split) of each limited quota."""
        return [(name, s) for name, s in (("requestsPerMinute", self.requests), ("tokensPerMinute", self.tokens),
                                          ("maxConcurrency", self.concurrency)) if s is not None]


@dataclass
class TablePlan:
    tables: dict[str, TenantTable] = field(default_factory=dict)  # by pool key
    tenant_pools: dict[str, list[PoolShare]] = field(default_factory=dict)  # by tenant name
    splits: dict[str, TenantSplits] = field(default_factory=dict)  # by tenant name, for the next plan


def demand(usage: TenantUsage | None) -> float:
    """One demand signal per tenant and pool (or pod): requests admitted plus refused, per minute.

    Tokens and concurrency follow requests, so all three quotas are split by this one signal.
    """
    return 0.0 if usage is None else usage.requests_per_minute + usage.refused_per_minute


def split_tenant(tenant: TenantSLA, slots: Sequence[Slot], previous: TenantSplits | None) -> TenantSplits:
    """The floor of every quota is at least one unit when the quota affords one per replica: one
    concurrent request, or one milli-request (milli-token) per minute, which admits a first request
    (a token bucket smaller than one request admits one when full)."""
    quotas = tenant.spec.quotas

    def one(quota: int | None, unit: int, min_floor: int, prev: Split | None) -> Split | None:
        if quota is None:
            return None
        return split_quota(quota, slots, unit=unit, floor_fraction=FLOOR_FRACTION, min_floor_units=min_floor, previous=prev)

    return TenantSplits(
        requests=one(quotas.requests_per_minute, RATE_UNIT, 1, previous.requests if previous else None),
        tokens=one(quotas.tokens_per_minute, RATE_UNIT, 1, previous.tokens if previous else None),
        concurrency=one(quotas.max_concurrency, 1, 1, previous.concurrency if previous else None),
    )


def tenant_slot(pool: str, replicas: int, usage: Mapping[str, TenantUsage], tenant: str) -> Slot:
    """A tenant's slot in a pool: demand per pod when the pool's usage names its pods (PoolUsage),
    else the pool's summed demand. The replica count covers at least the pods that answered."""
    if isinstance(usage, PoolUsage) and usage.pods:
        pods = {pod: demand(u) for pod, u in usage.by_pod(tenant).items()}
        return Slot(pool, max(1, replicas, len(pods)), pods=pods)
    return Slot(pool, max(1, replicas), demand(usage.get(tenant)))


def _share_key(share: ReplicaShare) -> tuple[float | int | None, ...]:
    return (share.requests_per_minute, share.tokens_per_minute, share.max_concurrency)


@dataclass(frozen=True)
class TenantPlan:
    """One tenant's part of every table: its entry per bound pool, its shares, its splits."""

    entries: dict[str, TenantEntry]  # by pool key
    pools: list[PoolShare]
    splits: TenantSplits
    refused: dict[str, Refusal] = field(default_factory=dict)  # by pool key: pools that claim it, or it names, refused


def plan_tenant(
    tenant: TenantSLA,
    pools: Sequence[InferencePool],
    key_hashes: Sequence[str],
    salt_key: bytes,
    replicas: Mapping[str, int],
    usage: Mapping[str, Mapping[str, TenantUsage]],
    previous: TenantSplits | None = None,
    open_namespaces: frozenset[str] = frozenset(),
) -> TenantPlan:
    """A tenant's entries in the tables of the pools it binds, from the same inputs as plan_tables."""
    name, spec = tenant.metadata.name, tenant.spec
    bound, refused = [], {}
    for pool in pools:
        verdict = binding(tenant, pool, open_namespaces)
        if verdict is True:
            bound.append(pool)
        elif isinstance(verdict, Refusal):
            refused[pool_key(pool)] = verdict
    slots = [tenant_slot(pool_key(p), replicas.get(pool_key(p), 1), usage.get(pool_key(p), {}), name) for p in bound]
    splits = split_tenant(tenant, slots, previous)
    salt = cache_salt(salt_key, tenant)
    entries: dict[str, TenantEntry] = {}
    shares: list[PoolShare] = []
    by_share: dict[tuple[object, ...], TenantEntry] = {}  # pools with equal shares (and no per-pod ones) share one entry object
    for slot in slots:
        share, per_pod = splits.share(slot.pool), splits.pod_shares(slot.pool)
        same = (_share_key(share), *((pod, _share_key(s)) for pod, s in per_pod.items()))
        if same not in by_share:
            by_share[same] = TenantEntry(
                name=name, tier=spec.tier, ttft_ms=spec.objectives.ttft_ms, tpot_ms=spec.objectives.tpot_ms,
                attainment_target=spec.objectives.attainment_target, key_hashes=sorted(key_hashes),
                cache_salt=salt, share=share, pod_shares=per_pod or None, kv_cache_share=spec.quotas.kv_cache_share,
                kv_erase=spec.kv_erase,
                quota=ClusterQuota(requests_per_minute=spec.quotas.requests_per_minute, tokens_per_minute=spec.quotas.tokens_per_minute,
                                   max_concurrency=spec.quotas.max_concurrency),
            )
        entries[slot.pool] = by_share[same]
        observed = usage.get(slot.pool, {}).get(name)
        shares.append(PoolShare(
            pool=slot.pool, replicas=slot.replicas, requests_per_minute=share.requests_per_minute,
            tokens_per_minute=share.tokens_per_minute, max_concurrency=share.max_concurrency,
            observed_requests_per_minute=observed.requests_per_minute if observed else 0.0,
            observed_tokens_per_minute=observed.tokens_per_minute if observed else 0.0,
        ))
    return TenantPlan(entries, shares, splits, refused)


def assemble_table(pool: str, entries: Iterable[TenantEntry], part: int = 0, parts: int = 1,
                   key_hash_key: str | None = None) -> TenantTable:
    """A pool's table (or part `part` of `parts`) from its tenants' entries (sorted by name), with
    its content revision; `key_hash_key`: hex of the key its key hashes are made with."""
    ordered = sorted(entries, key=lambda e: e.name)
    # A table with no tenant carries no key-hash key either: a pool nobody agreed to serve learns nothing.
    table = TenantTable(pool=pool, tenants=ordered, key_hash_key=key_hash_key if ordered else None,
                        part=part if parts > 1 else None, parts=parts if parts > 1 else None)
    return table.model_copy(update={"revision": table_revision(table)})


def part_of(tenant: str, parts: int) -> int:
    """Which part of a split table holds a tenant: stable, so a change rewrites one part."""
    return zlib.crc32(tenant.encode("utf-8")) % parts


def table_texts(table: TenantTable) -> dict[str, str]:
    """The table Secret's data: the sidecar's table and the engine's cut of it."""
    return {TENANT_TABLE_KEY: table.model_dump_json(by_alias=True, exclude_none=True),
            ENGINE_TABLE_KEY: EngineTable.of(table).model_dump_json(by_alias=True, exclude_none=True)}


class TableRenderer:
    """Table parts and their Secret data, each entry serialised once: the JSON of an entry object
    is kept while the entry is (a table part of 1,000 tenants whose one entry changed costs one
    entry's serialisation and a join). The texts equal `table_texts(assemble_table(...))`."""

    def __init__(self, key_hash_key: str | None = None) -> None:
        self.key_hash_key = key_hash_key  # hex; in the sidecar's table only (the engine's has no key hashes)
        self._texts: dict[int, tuple[TenantEntry, str, str]] = {}  # id(entry) -> (entry, its JSON, its engine JSON)

    def _entry(self, entry: TenantEntry) -> tuple[str, str]:
        cached = self._texts.get(id(entry))
        if cached is None or cached[0] is not entry:
            engine = EngineTable.of(TenantTable(pool="", tenants=[entry])).tenants[0]
            cached = (entry, entry.model_dump_json(by_alias=True, exclude_none=True), engine.model_dump_json(by_alias=True, exclude_none=True))
            self._texts[id(entry)] = cached
        return cached[1], cached[2]

    def __len__(self) -> int:
        return len(self._texts)

    def keep_only(self, live: Iterable[TenantEntry]) -> None:
        """Forget the JSON of entries no table holds any more."""
        keep = {id(e) for e in live}
        self._texts = {k: v for k, v in self._texts.items() if k in keep}

    def render(self, pool: str, entries: Iterable[TenantEntry], part: int = 0, parts: int = 1) -> tuple[TenantTable, dict[str, str]]:
        ordered = sorted(entries, key=lambda e: e.name)
        texts = [self._entry(e) for e in ordered]
        where = f',"part":{part},"parts":{parts}' if parts > 1 else ""
        key_hash_key = self.key_hash_key if ordered else None  # no tenant, no key (as assemble_table)
        keyed = f',"keyHashKey":"{key_hash_key}"' if key_hash_key else ""
        head = '{"pool":' + json.dumps(pool, ensure_ascii=False)
        tail = where + keyed + ',"tenants":['
        unrevised = head + ',"revision":""' + tail + ",".join(t for t, _ in texts) + "]}"
        revision = hashlib.sha256(unrevised.encode("utf-8")).hexdigest()[:16]
        table = TenantTable(pool=pool, revision=revision, part=part if parts > 1 else None, parts=parts if parts > 1 else None,
                            key_hash_key=key_hash_key, tenants=ordered)
        tenants = head + f',"revision":"{revision}"' + tail + ",".join(t for t, _ in texts) + "]}"
        engine = head + f',"revision":"{revision}"' + where + ',"tenants":[' + ",".join(e for _, e in texts) + "]}"
        return table, {TENANT_TABLE_KEY: tenants, ENGINE_TABLE_KEY: engine}


def data_bytes(texts: Mapping[str, str]) -> int:
    """What the API server counts against a Secret's 1 MiB: the decoded bytes of every value."""
    return sum(len(text.encode("utf-8")) for text in texts.values())


class TableTooLarge(OperatorError):
    pass


def split_table(pool: str, entries: Iterable[TenantEntry], parts: int = 1,
                renderer: TableRenderer | None = None) -> list[tuple[TenantTable, dict[str, str]]]:
    """The pool's table as few parts as fit one Secret each (a power of two, at least `parts`),
    each with its Secret data; TableTooLarge beyond MAX_TABLE_PARTS."""
    entries = list(entries)
    renderer = renderer if renderer is not None else TableRenderer()
    while True:
        groups: list[list[TenantEntry]] = [[] for _ in range(parts)]
        for entry in entries:
            groups[part_of(entry.name, parts)].append(entry)
        split = [renderer.render(pool, group, i, parts) for i, group in enumerate(groups)]
        if all(data_bytes(texts) <= SECRET_DATA_LIMIT for _, texts in split):
            return split
        if parts * 2 > MAX_TABLE_PARTS:
            raise TableTooLarge(f"pool {pool}: {len(entries)} tenants do not fit {MAX_TABLE_PARTS} table Secrets of "
                                f"{SECRET_DATA_LIMIT} bytes; split the tenants over more pools (tenantSelector)")
        parts *= 2


def plan_tables(
    pools: Sequence[InferencePool],
    tenants: Sequence[TenantSLA],
    key_hashes: Mapping[str, list[str]],
    salt_key: bytes,
    replicas: Mapping[str, int],
    usage: Mapping[str, Mapping[str, TenantUsage]],
    previous: Mapping[str, TenantSplits] | None = None,
    open_namespaces: frozenset[str] = frozenset(),
) -> TablePlan:
    """Every pool's tenant table and every tenant's per-pool shares, from one snapshot.

    `replicas[pool_key]` is how many replicas may be serving (the split divides by it);
    `usage[pool_key][tenant]` is the pool's summed usage; `key_hashes[tenant]` its key hashes
    (made with derive_key_hash_key(salt_key), which the tables carry).
    """
    plan = TablePlan()
    entries: dict[str, list[TenantEntry]] = {pool_key(p): [] for p in pools}
    for tenant in sorted(tenants, key=lambda t: t.metadata.name):
        name = tenant.metadata.name
        part = plan_tenant(tenant, pools, key_hashes.get(name, []), salt_key, replicas, usage, (previous or {}).get(name), open_namespaces)
        plan.splits[name] = part.splits
        plan.tenant_pools[name] = part.pools
        for key, entry in part.entries.items():
            entries[key].append(entry)
    for key, tenant_entries in entries.items():
        plan.tables[key] = assemble_table(key, tenant_entries, key_hash_key=derive_key_hash_key(salt_key).hex())
    return plan

