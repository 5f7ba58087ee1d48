"""Tenants for a local run: TenantSLA manifests and their key Secrets → one tenant table file.

The table comes from the operator's own `plan_tables` (one table builder in the project), for a
single local pool with one replica, so the sidecar sees exactly what a pod would be handed.
Keys are read from the Secrets to hash them; only the hashes go into the table file. The plain
keys stay in memory so `slaq up` can print a ready-to-paste example and the demo can send
traffic as each tenant.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from slaq.api.common import API_VERSION, Tier
from slaq.api.pool import InferencePool
from slaq.api.runtime import ENGINE_TABLE_KEY
from slaq.api.table import EngineTable, TenantTable, derive_key_hash_key, hash_api_key
from slaq.api.tenant import TenantSLA
from slaq.local.errors import TenantFileError
from slaq.manifests import ManifestError, read_tenant_keys

LOCAL_POOL_NAMESPACE = "local"
LOCAL_POOL_NAME = "slaq-up"
TIER_ORDER = (Tier.CRITICAL, Tier.STANDARD, Tier.BATCH)


@dataclass(frozen=True)
class LocalTenants:
    tenants: list[TenantSLA]
    keys: dict[str, list[str]]  # tenant name → its plain API keys (memory only)

    def example_key(self) -> tuple[str, str]:
        """(tenant, key) of the most important tier, for the printed curl."""
        ordered = sorted(self.tenants, key=lambda t: (TIER_ORDER.index(t.spec.tier), t.metadata.name))
        name = ordered[0].metadata.name
        return name, self.keys[name][0]


LOCAL_POOL_LABELS = {"slaq.dev/tenancy": "shared"}  # what crds/examples/tenants.yaml select


def local_pool(model_name: str) -> InferencePool:
    """The one pool of a local run; its empty tenant selector takes every tenant that selects it:
    by the label the examples' tenants select (LOCAL_POOL_LABELS), or by an empty poolSelector
    (its namespace is open to those, plan_local_table)."""
    return InferencePool.model_validate({
        "apiVersion": API_VERSION, "kind": "InferencePool",
        "metadata": {"name": LOCAL_POOL_NAME, "namespace": LOCAL_POOL_NAMESPACE, "labels": dict(LOCAL_POOL_LABELS)},
        "spec": {"model": {"name": model_name}, "engine": {"device": "cpu"}, "resources": {"gpus": 0}},
    })


def read_tenants(paths: Sequence[Path]) -> LocalTenants:
    """TenantSLAs and their keys from manifest files or directories (other kinds are ignored)."""
    try:
        found = read_tenant_keys(paths)
    except ManifestError as exc:
        raise TenantFileError(f"--tenants: {exc}") from exc
    return LocalTenants(found.tenants, found.keys)


def plan_local_table(local: LocalTenants, pool: InferencePool, salt_key: bytes | None = None) -> TenantTable:
    """The pool's tenant table, as the operator would write it for one replica."""
    from slaq.operator.tables import plan_tables, pool_key

    salt_key = salt_key or os.urandom(32)
    hash_key = derive_key_hash_key(salt_key)
    hashes = {name: [hash_api_key(k, hash_key) for k in values] for name, values in local.keys.items()}
    # One person runs both sides here: the tenants' spec.pools name cluster namespaces, not the local
    # pool's, so they are read as naming none (served in the open namespaces: the local pool's).
    tenants = [t.model_copy(update={"spec": t.spec.model_copy(update={"pools": []})}) for t in local.tenants]
    plan = plan_tables([pool], tenants, hashes, salt_key, {pool_key(pool): 1}, {},
                       open_namespaces=frozenset({pool.metadata.namespace or ""}))
    table = plan.tables[pool_key(pool)]
    if not table.tenants:
        raise TenantFileError(f"no tenant selects the local pool {pool_key(pool)} (check spec.poolSelector)")
    return table


def engine_table_beside(path: Path) -> Path:
    """Where `write_table` puts the engine's cut of the table written at `path`."""
    return path.with_name(ENGINE_TABLE_KEY)


def write_table(table: TenantTable, path: Path) -> Path:
    """The sidecar's table at `path` and the engine's cut beside it, as a pod's two mounts hold them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    texts = {path: table.model_dump_json(by_alias=True, exclude_none=True),
             engine_table_beside(path): EngineTable.of(table).model_dump_json(by_alias=True, exclude_none=True)}
    for target, text in texts.items():
        tmp = target.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, 0o600)
        tmp.replace(target)  # atomic: the sidecar and the engine reload the file when it changes
    return path
