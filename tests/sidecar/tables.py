"""Tenant tables for sidecar tests: three tenants in the report's A/B/C shape, one key each."""

from __future__ import annotations

from typing import Any

from slaq.api.table import ReplicaShare, TenantEntry, TenantTable, derive_cache_salt, hash_api_key

SECRET = b"test-pool-secret"
KEYS = {"vip": "sk-vip-0123456789", "std": "sk-std-0123456789", "free": "sk-free-0123456789"}


def entry(name: str, tier: str, *, ttft_ms: float | None = None, tpot_ms: float | None = None, key: str | None = None,
          attainment_target: float = 0.99, **share: Any) -> TenantEntry:
    return TenantEntry(
        name=name,
        tier=tier,
        attainment_target=attainment_target,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        key_hashes=[hash_api_key(key or KEYS.get(name, f"sk-{name}-0123456789"))],
        cache_salt=derive_cache_salt(SECRET, name),
        share=ReplicaShare(**share),
    )


def abc_table(revision: str = "r1", **overrides: dict[str, Any]) -> TenantTable:
    """A: critical (TTFT 50 ms), B: standard (200 ms), C: batch without objectives."""
    specs = {
        "vip": dict(tier="critical", ttft_ms=50.0, tpot_ms=50.0),
        "std": dict(tier="standard", ttft_ms=200.0, tpot_ms=100.0),
        "free": dict(tier="batch"),
    }
    for name, extra in overrides.items():
        specs[name] = {**specs[name], **extra}
    return TenantTable(pool="ns/pool", revision=revision, tenants=[entry(name, **spec) for name, spec in specs.items()])


def bearer(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}
