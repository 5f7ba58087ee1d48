"""Tenants as the sidecar knows them: the operator's tenant table, indexed by key hash, reloaded on change.

Each replica enforces its own share: the entry's `podShares` under this pod's name (the
operator's POD_NAME, `--pod-name`) when listed, else the entry's `share`.

The table file is a mounted Secret, watched by `slaq.table_file.TableFile` (the engine's table
has the same watcher). Reloading builds a new immutable index and swaps one reference: requests
already admitted keep the `Tenant` they were admitted with, so a reload never drops or alters
in-flight work.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from slaq.api.common import Tier
from slaq.api.table import LEGACY_KEY_HASH_PREFIX, ClusterQuota, TenantEntry, TenantTable, hash_api_key, key_fingerprint
from slaq.sidecar.errors import Unauthorized
from slaq.table_file import TableFile

log = logging.getLogger(__name__)

FAIRNESS_ID_HEADER = "x-llm-d-inference-fairness-id"
SLO_TTFT_HEADER = "x-llm-d-slo-ttft-ms"
SLO_TPOT_HEADER = "x-llm-d-slo-tpot-ms"


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant's identity, objectives and this replica's quota share (hot path: a plain dataclass)."""

    name: str
    tier: Tier
    ttft_ms: float | None
    tpot_ms: float | None
    cache_salt: str
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrency: int | None = None
    attainment_target: float = 0.99
    cluster_quota: ClusterQuota | None = None  # the whole quota, for a shared store (shared_quotas.py); None: not in the table

    @classmethod
    def from_entry(cls, entry: TenantEntry, pod: str | None = None) -> "Tenant":
        """The tenant as the replica named `pod` enforces it (its own share when the entry lists one)."""
        share = entry.share_for(pod)
        return cls(
            name=entry.name,
            tier=entry.tier,
            ttft_ms=entry.ttft_ms,
            tpot_ms=entry.tpot_ms,
            cache_salt=entry.cache_salt,
            requests_per_minute=share.requests_per_minute,
            tokens_per_minute=share.tokens_per_minute,
            max_concurrency=share.max_concurrency,
            attainment_target=entry.attainment_target,
            cluster_quota=entry.quota,
        )


@dataclass(frozen=True, slots=True)
class TenantIndex:
    """An immutable snapshot of one table revision."""

    pool: str
    revision: str
    by_key_hash: Mapping[str, Tenant]
    by_name: Mapping[str, Tenant]
    hash_key: bytes | None = None  # the table's key-hash key: keys are looked up by their HMAC under it
    legacy_hashes: bool = False  # some entries hold bare SHA-256 hashes (a table of an earlier operator)

    @classmethod
    def from_table(cls, table: TenantTable, pod: str | None = None) -> "TenantIndex":
        by_name = {entry.name: Tenant.from_entry(entry, pod) for entry in table.tenants}
        by_hash = {h: by_name[entry.name] for entry in table.tenants for h in entry.key_hashes}
        return cls(pool=table.pool, revision=table.revision, by_key_hash=by_hash, by_name=by_name, hash_key=table.hash_key(),
                   legacy_hashes=any(h.startswith(LEGACY_KEY_HASH_PREFIX) for h in by_hash))

    @classmethod
    def empty(cls) -> "TenantIndex":
        return cls(pool="", revision="", by_key_hash={}, by_name={})

    def tenant_for_key(self, key: str) -> Tenant | None:
        found = self.match_key(key)
        return found[0] if found is not None else None

    def match_key(self, key: str) -> tuple[Tenant, str] | None:
        """The tenant holding `key` and the stored hash it matched: hashed as the operator hashes it
        (HMAC-SHA256 under the table's key), and as bare SHA-256 only while the table still holds such entries."""
        if self.hash_key is not None:
            key_hash = hash_api_key(key, self.hash_key)
            if (tenant := self.by_key_hash.get(key_hash)) is not None:
                return tenant, key_hash
        if self.legacy_hashes:
            key_hash = hash_api_key(key)
            if (tenant := self.by_key_hash.get(key_hash)) is not None:
                return tenant, key_hash
        return None


class TenantDirectory:
    """The current tenant index plus the file it came from; `refresh()` reloads it when the file changed.

    A table that fails to load keeps the last good index serving (a typo in a new revision must
    not lock every tenant out) and is reported through `last_error`.
    """

    def __init__(self, path: Path | None = None, index: TenantIndex | None = None, *, pod: str | None = None) -> None:
        self.path = path
        self.pod = pod  # this replica's pod name: whose per-pod shares it enforces (None: the entries' `share`)
        self.index = index or TenantIndex.empty()
        self.loaded = index is not None
        self.last_error: str | None = None
        self._file = TableFile(path, TenantTable) if path is not None else None

    @classmethod
    def from_table(cls, table: TenantTable, pod: str | None = None) -> "TenantDirectory":
        return cls(index=TenantIndex.from_table(table, pod), pod=pod)

    def refresh(self) -> bool:
        """Reload if the file changed; True when a new index was installed."""
        change = self._file.poll() if self._file is not None else None
        if change is None:
            return False
        if change.table is None:
            self.last_error = change.error
            log.error("%s; keeping revision %r", change.error, self.index.revision)
            return False
        table = change.table
        self.index = TenantIndex.from_table(table, self.pod)
        self.loaded = True
        self.last_error = None
        log.info("tenant table %s loaded: revision %r, %d tenants", self.path, table.revision, len(table.tenants))
        return True


@dataclass(frozen=True, slots=True)
class Identity:
    """Who sent a request and which objectives apply to it."""

    tenant: Tenant
    ttft_ms: float | None
    tpot_ms: float | None
    key_fingerprint: str | None = None  # the bearer key's `key_fingerprint`; None when a trusted gateway named the tenant


class Authenticator:
    """Bearer key → tenant; optionally trusts a gateway's fairness id and SLO headers."""

    def __init__(self, directory: TenantDirectory, *, trust_gateway_headers: bool = False) -> None:
        self.directory = directory
        self.trust_gateway_headers = trust_gateway_headers

    def identify(self, headers: Mapping[str, str]) -> Identity:
        """`headers` has lower-case names. Raises Unauthorized for a missing or unknown key."""
        index = self.directory.index
        tenant: Tenant | None = None
        fingerprint: str | None = None
        authorization = headers.get("authorization")
        if authorization is not None:
            scheme, _, key = authorization.partition(" ")
            key = key.strip()
            if scheme.lower() != "bearer" or not key:
                raise Unauthorized("Authorization must be 'Bearer <api key>'")
            found = index.match_key(key)
            if found is None:
                raise Unauthorized("unknown API key")
            tenant, fingerprint = found[0], key_fingerprint(found[1])
        elif self.trust_gateway_headers and FAIRNESS_ID_HEADER in headers:
            # Behind a trusted gateway the gateway authenticated the caller and names the tenant.
            tenant = index.by_name.get(headers[FAIRNESS_ID_HEADER])
            if tenant is None:
                raise Unauthorized(f"{FAIRNESS_ID_HEADER} names no tenant of this pool")
        else:
            raise Unauthorized("missing Authorization: Bearer <api key>")
        ttft_ms, tpot_ms = tenant.ttft_ms, tenant.tpot_ms
        if self.trust_gateway_headers:
            ttft_ms = _header_ms(headers, SLO_TTFT_HEADER, ttft_ms)
            tpot_ms = _header_ms(headers, SLO_TPOT_HEADER, tpot_ms)
        return Identity(tenant=tenant, ttft_ms=ttft_ms, tpot_ms=tpot_ms, key_fingerprint=fingerprint)


def _header_ms(headers: Mapping[str, str], name: str, default: float | None) -> float | None:
    """A trusted gateway's per-request SLO replaces the tenant's default; a malformed value is ignored.

    Trust means the gateway sets (and strips client copies of) these headers; never enable it
    where clients reach the sidecar directly, or a client could promote its own requests.
    """
    raw = headers.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    if not (value > 0.0) or value == float("inf"):
        return default
    return value
