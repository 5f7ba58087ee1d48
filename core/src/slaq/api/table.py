"""The tenant table: what the operator hands to each pool's sidecars (a Secret, mounted as a file)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from pydantic import ConfigDict, Field

from slaq.api.common import ApiModel, KvErase, Tier

TABLE_FILE_NAME = "tenants.json"
KEY_HASH_PREFIX = "hmac-sha256:"
LEGACY_KEY_HASH_PREFIX = "sha256:"  # tables written before key hashes were keyed; still read (migration)
KEY_HASH_PATTERN = r"^(hmac-sha256|sha256):[0-9a-f]{64}$"
KEY_HASH_KEY_LABEL = b"slaq api-key hash v1"
SALT_FINGERPRINT_CHARS = 16
KEY_FINGERPRINT_LABEL = b"slaq key fingerprint v1\0"
KEY_FINGERPRINT_CHARS = 16


def derive_key_hash_key(secret: bytes) -> bytes:
    """The key API keys are hashed with, derived from the operator's secret (the cache-salt key
    Secret): tables carry it so sidecars can verify, and it reveals nothing of the cache salts."""
    return hmac.new(secret, KEY_HASH_KEY_LABEL, hashlib.sha256).digest()


def hash_api_key(key: str, hash_key: bytes | None = None) -> str:
    """The only form in which an API key leaves its Secret: HMAC-SHA256 under `hash_key`.

    Without `hash_key`, the bare SHA-256 of tables written by earlier operators (LEGACY_KEY_HASH_PREFIX),
    which sidecars still read so that a table is never unreadable during an upgrade."""
    if hash_key is None:
        return LEGACY_KEY_HASH_PREFIX + hashlib.sha256(key.encode("utf-8")).hexdigest()
    return KEY_HASH_PREFIX + hmac.new(hash_key, key.encode("utf-8"), hashlib.sha256).hexdigest()


def key_fingerprint(key_hash: str) -> str:
    """What the audit log names a key by: 16 hex characters of the SHA-256 of its stored hash
    (`hash_api_key`). Neither the key nor the hash: a log line cannot be turned into a credential
    or a table entry, and guessing a key from it needs the table's key-hash key, as the hash does.
    An operator computes it from the key (hash it under the table's key, then this) or lists it
    for every key of a tenant from the table's hashes; it changes when the key-hash key does."""
    return hashlib.sha256(KEY_FINGERPRINT_LABEL + key_hash.encode("ascii")).hexdigest()[:KEY_FINGERPRINT_CHARS]


def derive_cache_salt(secret: bytes, group: str) -> str:
    """Per-tenant (or per sharing group) `cache_salt`: unguessable, stable across restarts."""
    return hmac.new(secret, group.encode("utf-8"), hashlib.sha256).hexdigest()


def salt_fingerprint(cache_salt: str) -> str:
    """Enough of a salt's hash for the engine to notice that it changed; the salt itself stays out."""
    return hashlib.sha256(cache_salt.encode("utf-8")).hexdigest()[:SALT_FINGERPRINT_CHARS]


class ReplicaShare(ApiModel):
    """A tenant's quota share on one replica; None means unlimited."""

    requests_per_minute: Annotated[float | None, Field(ge=0.0)] = None
    tokens_per_minute: Annotated[float | None, Field(ge=0.0)] = None
    max_concurrency: Annotated[int | None, Field(ge=0)] = None


class ClusterQuota(ApiModel):
    """A tenant's quotas across every replica of every pool (its TenantSLA's), for sidecars that
    count them in a shared store (sidecar/README.md, Exact quotas); None means unlimited."""

    model_config = ConfigDict(**ApiModel.model_config, frozen=True)  # hashable: sidecars hold it in a frozen Tenant

    requests_per_minute: Annotated[float | None, Field(ge=0.0)] = None
    tokens_per_minute: Annotated[float | None, Field(ge=0.0)] = None
    max_concurrency: Annotated[int | None, Field(ge=0)] = None


class TenantEntry(ApiModel):
    name: Annotated[str, Field(min_length=1)]
    tier: Tier
    ttft_ms: Annotated[float | None, Field(gt=0.0)] = None
    tpot_ms: Annotated[float | None, Field(gt=0.0)] = None
    attainment_target: Annotated[float, Field(gt=0.0, le=1.0)] = 0.99
    key_hashes: list[Annotated[str, Field(pattern=KEY_HASH_PATTERN)]] = Field(default_factory=list)
    cache_salt: Annotated[str, Field(min_length=16)]
    share: ReplicaShare = Field(default_factory=ReplicaShare)
    # Per-pod shares where a pool's replicas see different demand (keyed by pod name, the sidecar's
    # POD_NAME); a pod not listed (a new one, or one without demand of its own) uses `share`.
    pod_shares: Annotated[dict[Annotated[str, Field(min_length=1)], ReplicaShare] | None, Field(
        description="Shares of the pods whose share differs from `share` (by pod name); None in tables of earlier operators.")] = None
    quota: ClusterQuota | None = None  # None: a table of an earlier operator (a sidecar with a store then keeps to its share)
    kv_cache_share: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    kv_erase: KvErase = KvErase.ON_REUSE  # the engine's KV erase mode for this tenant (TenantSLA.spec.kvErase)

    def share_for(self, pod: str | None) -> ReplicaShare:
        """The share of the replica named `pod`: its own when listed, else the pool's `share`
        (None: a sidecar that does not know its pod name reads `share`)."""
        if pod is not None and self.pod_shares:
            return self.pod_shares.get(pod, self.share)
        return self.share


PartIndex = Annotated[int | None, Field(ge=0, description="Which part of a table split over several Secrets (None: not split).")]
PartCount = Annotated[int | None, Field(ge=1, description="How many parts the table is split into (None: one).")]


def part_file_name(name: str, part: int) -> str:
    """The file (and Secret data key path) of part `part` of a table: `tenants.json`, `tenants-1.json`..."""
    if part == 0:
        return name
    stem, dot, suffix = name.rpartition(".")
    return f"{stem}-{part}{dot}{suffix}" if dot else f"{name}-{part}"


class TenantTable(ApiModel):
    """All tenants bound to one pool, with each replica's share of their quotas (`share`, or a pod's own in `podShares`).

    A pool with many tenants has its table split over several Secrets (the API server holds at
    most 1 MiB of data per Secret): each part is a TenantTable of its own tenants, with `part` and
    `parts` set, and readers join the parts (core/src/slaq/table_file.py)."""

    pool: Annotated[str, Field(description="namespace/name of the InferencePool.")]
    revision: Annotated[str, Field(description="Changes whenever the content changes.")] = ""
    part: PartIndex = None
    parts: PartCount = None
    key_hash_key: Annotated[str | None, Field(pattern=r"^[0-9a-f]{64}$", description="Hex of the key the entries' hmac-sha256 key hashes are made with (derive_key_hash_key); None in tables of earlier operators.")] = None
    tenants: list[TenantEntry] = Field(default_factory=list)

    def hash_key(self) -> bytes | None:
        return bytes.fromhex(self.key_hash_key) if self.key_hash_key else None

    def by_key_hash(self) -> dict[str, TenantEntry]:
        return {h: t for t in self.tenants for h in t.key_hashes}


class EngineTenant(ApiModel):
    """What the engine knows of a tenant, and all it needs: its KV share, its KV erase mode, and a
    fingerprint of its cache salt (a changed salt means its cached blocks must be erased)."""

    name: Annotated[str, Field(min_length=1)]
    kv_cache_share: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    kv_erase: KvErase = KvErase.ON_REUSE
    salt_fingerprint: Annotated[str, Field(pattern=rf"^[0-9a-f]{{{SALT_FINGERPRINT_CHARS}}}$")]


class EngineTable(ApiModel):
    """The engine's view of a pool's tenant table: no key hashes, no salts, no quotas or objectives.

    Mounted into the engine container instead of the full table (least knowledge: the engine is
    the larger attack surface, and reads only these fields). Unknown fields are refused, so a full
    TenantTable handed to the engine by mistake fails loudly rather than being read.
    """

    pool: str
    revision: Annotated[str, Field(description="The revision of the TenantTable it was cut from.")] = ""
    part: PartIndex = None
    parts: PartCount = None
    tenants: list[EngineTenant] = Field(default_factory=list)

    @classmethod
    def of(cls, table: TenantTable) -> "EngineTable":
        return cls(pool=table.pool, revision=table.revision, part=table.part, parts=table.parts, tenants=[
            EngineTenant(name=t.name, kv_cache_share=t.kv_cache_share, kv_erase=t.kv_erase, salt_fingerprint=salt_fingerprint(t.cache_salt))
            for t in table.tenants])

    def kv_shares(self) -> dict[str, float]:
        return {t.name: t.kv_cache_share for t in self.tenants}
