"""What the operator would apply for a pool, computed from manifest files instead of a cluster.

`slaq render` (render_cli.py) calls `render_from_manifests`. It runs the operator's own pure
functions: key hashes by `keys.key_set`, tables by `tables.plan_tables`, objects by
`children.render_pool_objects`. The differences from a live operator are in what it cannot
know: no usage has been observed (the cold-start split over `spec.replicas`), no owner
references (the pool has no uid yet), and the cache-salt key is the one given (or random).

What it prints is for review, and may be committed to Git: each tenant-table Secret is replaced
by `review_secret`, which names each tenant's key Secret and carries fingerprints of its key
hashes and cache salt, never the hashes, the key they are made with, or the salts.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slaq.api.pool import InferencePool
from slaq.api.runtime import TENANT_TABLE_KEY
from slaq.api.table import TenantTable, derive_key_hash_key, hash_api_key, key_fingerprint, salt_fingerprint
from slaq.manifests import ManifestError, ManifestSet
from slaq.operator.children import render_pool_objects
from slaq.operator.errors import SpecError
from slaq.operator.images import PoolImages
from slaq.operator.keys import key_set
from slaq.operator.tables import plan_tables, pool_key

REVIEW_KEY = "review.yaml"  # the one stringData key of a table Secret rendered for review


@dataclass(frozen=True)
class Rendering:
    objects: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


def with_namespace(pool: InferencePool, namespace: str) -> InferencePool:
    """The pool in `namespace` when its manifest names none (as `kubectl apply -n` would place it)."""
    if pool.metadata.namespace:
        return pool
    return pool.model_copy(update={"metadata": pool.metadata.model_copy(update={"namespace": namespace})})


def key_hashes(found: ManifestSet, salt_key: bytes) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(tenant -> key hashes, tenant -> problem) from the Secrets among the manifests, as the operator
    reads them (hashed under the key derived from `salt_key`)."""
    hash_key = derive_key_hash_key(salt_key)
    hashes: dict[str, list[str]] = {}
    problems: dict[str, str] = {}
    for tenant in found.tenants:
        ref = tenant.spec.api_key_secret_ref
        values = found.secrets.get((ref.namespace, ref.name))
        data = None if values is None else {k: base64.b64encode(v.encode("utf-8")).decode("ascii") for k, v in values.items()}
        keys = key_set(ref.namespace, ref.name, data, lambda key: hash_api_key(key, hash_key))
        hashes[tenant.metadata.name] = list(keys.hashes)
        if keys.problem is not None:
            problems[tenant.metadata.name] = keys.problem
    return hashes, problems


def render_from_manifests(pools: Sequence[InferencePool], found: ManifestSet, salt_key: bytes, *,
                          allow_missing_keys: bool = False, where: str = "the given files",
                          images: PoolImages = PoolImages()) -> Rendering:
    """The objects the operator would apply for `pools`, given the tenants and Secrets in `found`.

    Quotas are split over every pool among `pools` and `found.pools` (a tenant bound to two pools
    gets a share on each, as in a cluster holding both). A tenant of a rendered pool whose key
    Secret is missing or empty is an error, unless `allow_missing_keys`: then it is rendered as
    the operator does while the Secret is missing (in the table, with no key hashes) and warned of.
    A pool that names no image takes `images`' (the operator's defaults); with none, it is an error.
    """
    rendered = {pool_key(p): p for p in pools}
    others = [p for p in found.pools if pool_key(p) not in rendered]
    everyone = [*rendered.values(), *others]
    hashes, problems = key_hashes(found, salt_key)
    replicas = {pool_key(p): p.spec.replicas.current for p in everyone}
    plan = plan_tables(everyone, found.tenants, hashes, salt_key, replicas, {})
    objects: list[dict[str, Any]] = []
    warnings: list[str] = []
    for key, pool in rendered.items():
        table = plan.tables[key]
        if not table.tenants:
            warnings.append(f"no TenantSLA in {where} binds pool {key}: its tenant table is empty (check spec.tenantSelector "
                            "and the tenants' spec.poolSelector)")
        for entry in table.tenants:
            problem = problems.get(entry.name)
            if problem is None:
                continue
            message = f"TenantSLA {entry.name} ({found.sources.get(('TenantSLA', (None, entry.name)), '?')}): {problem} in {where}"
            if not allow_missing_keys:
                raise ManifestError(f"{message}; add the Secret's manifest, or pass --allow-missing-keys to render the "
                                    "tenant without key hashes (as the operator does until the Secret exists)")
            warnings.append(f"{message}: rendered without key hashes (no key authenticates this tenant)")
        try:
            resolved = images.resolve(pool)
        except SpecError as exc:
            raise ManifestError(f"{exc} (or pass --default-{pool.spec.engine.device.value}-image, as the operator is started)") from exc
        objects += render_pool_objects(resolved, table)
    return Rendering(objects, warnings)


def review_table(table: TenantTable, key_secrets: Mapping[str, str]) -> dict[str, Any]:
    """The table as a reviewer reads it: every field but the secret ones, which become references.

    `keyHashKey` is left out; each tenant's `keyHashes` become `keyFingerprints` (the audit log's
    names for its keys, slaq.api.table.key_fingerprint) beside `keySecret` (namespace/name, from
    `key_secrets` by tenant), and its `cacheSalt` becomes `saltFingerprint` (what the engine's
    table carries). A changed key, salt or key-hash key still shows as a changed fingerprint."""
    body = table.model_dump(mode="json", by_alias=True, exclude_none=True)
    body.pop("keyHashKey", None)
    for tenant, entry in zip(body["tenants"], table.tenants, strict=True):
        del tenant["keyHashes"], tenant["cacheSalt"]
        tenant["keySecret"] = key_secrets.get(entry.name, "")
        tenant["keyFingerprints"] = [key_fingerprint(h) for h in entry.key_hashes]
        tenant["saltFingerprint"] = salt_fingerprint(entry.cache_salt)
    return body


def review_secret(secret: dict[str, Any], key_secrets: Mapping[str, str]) -> dict[str, Any]:
    """A tenant-table Secret (children.render_table_secret) as printed for review: the same object
    without `data` (neither table, the sidecar's nor the engine's), and the table's review
    (`review_table`) as YAML under `stringData.review.yaml`."""
    import yaml

    table = TenantTable.model_validate_json(base64.b64decode(secret["data"][TENANT_TABLE_KEY]))
    text = yaml.safe_dump(review_table(table, key_secrets), sort_keys=False, default_flow_style=False)
    return {**{k: v for k, v in secret.items() if k != "data"}, "stringData": {REVIEW_KEY: text}}


def key_secret_refs(found: ManifestSet) -> dict[str, str]:
    """Each tenant's key Secret as `namespace/name` (spec.apiKeySecretRef)."""
    return {t.metadata.name: f"{t.spec.api_key_secret_ref.namespace}/{t.spec.api_key_secret_ref.name}" for t in found.tenants}


def for_review(rendering: Rendering, found: ManifestSet) -> Rendering:
    """The rendering with every tenant-table Secret replaced by its review (`review_secret`)."""
    refs = key_secret_refs(found)
    return Rendering([review_secret(o, refs) if o.get("kind") == "Secret" else o for o in rendering.objects], rendering.warnings)
