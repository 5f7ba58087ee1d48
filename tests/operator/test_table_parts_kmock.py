"""A pool whose tenant table outgrows one Secret (1 MiB, enforced by the emulator as by the API
server): the operator splits it over several Secrets, the pod's projected volume gathers them,
and the shared table reader (core/src/slaq/table_file.py) joins them; one tenant's change rewrites one part."""

from __future__ import annotations

import base64
from pathlib import Path

from slaq.bench.scale_objects import KEY_NAMESPACE, OPEN_NAMESPACES, POOL_NAMESPACE, key_secret, pool_body, pool_name, tenant_body, tenant_name
from slaq.api.runtime import ENGINE_TABLE_KEY, MAX_TABLE_PARTS, TENANT_TABLE_KEY
from slaq.api.table import EngineTable, TenantTable, part_file_name
from slaq.operator.names import table_secret_name
from slaq.operator.tables import part_of
from slaq.table_file import TableFile
from tests.operator.test_indexed_reconcile import quiet
from tests.operator.test_operator_kmock import merge_patch, operator
from slaq.testing.kube import MAX_SECRET_SIZE, KubeEmulator
from tests.support.polling import eventually

TENANTS = 2500  # about 1.7 MB of table: more than one Secret holds


def project(kube: KubeEmulator, directory: Path, key: str) -> None:
    """As the kubelet fills the pod's projected volume: `key` of every part Secret that exists."""
    directory.mkdir(exist_ok=True)
    for part in range(MAX_TABLE_PARTS):
        secret = kube.read("v1/secrets", POOL_NAMESPACE, table_secret_name(pool_name(0), part))
        target = directory / part_file_name(key, part)
        if secret is None:
            target.unlink(missing_ok=True)
            continue
        target.write_bytes(base64.b64decode(secret["data"][key]))


def parts(kube: KubeEmulator) -> list[dict]:
    return [s for s in kube.live("v1/secrets", POOL_NAMESPACE) if s["metadata"]["name"].startswith(f"{pool_name(0)}-tenants")]


def joined(kube: KubeEmulator, tmp_path: Path) -> TenantTable | None:
    project(kube, tmp_path / "tenants", TENANT_TABLE_KEY)
    try:
        return TableFile(tmp_path / "tenants" / TENANT_TABLE_KEY, TenantTable).read()
    except ValueError:
        return None  # parts of two splits: not all written yet


async def test_a_table_over_one_mebibyte_is_split_over_secrets_and_read_back_whole(kube: KubeEmulator, tmp_path: Path) -> None:
    for name in (KEY_NAMESPACE, POOL_NAMESPACE):
        kube.objects["v1/namespaces", None, name] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    for j in range(TENANTS):
        kube.preload("v1/secrets", key_secret(j))
        kube.preload("slaq.dev/v1alpha1/tenantslas", tenant_body(j, 1))
    kube.preload("slaq.dev/v1alpha1/inferencepools", pool_body(0, 1))
    async with operator(kube, interval=3600.0, open_namespaces=OPEN_NAMESPACES):
        table = await eventually(lambda: (t := joined(kube, tmp_path)) is not None and len(t.tenants) == TENANTS and t,
                                 timeout=180, what="every tenant in the joined table")
        written = parts(kube)
        assert len(written) > 1, "the table fits one Secret: the test needs more tenants"
        sizes = [sum(len(base64.b64decode(v)) for v in s["data"].values()) for s in written]
        assert max(sizes) <= MAX_SECRET_SIZE < sum(sizes)
        assert all(len(t.key_hashes) == 1 for t in table.tenants)
        # The engine's cut joins the same way, with no key hashes or salts.
        project(kube, tmp_path / "engine", ENGINE_TABLE_KEY)
        engine = TableFile(tmp_path / "engine" / ENGINE_TABLE_KEY, EngineTable).read()
        assert len(engine.tenants) == TENANTS and "sha256:" not in (tmp_path / "engine" / ENGINE_TABLE_KEY).read_text()

        mark = await quiet(kube)
        changed = tenant_name(7)
        await merge_patch(kube, f"/apis/slaq.dev/v1alpha1/tenantslas/{changed}", {"spec": {"quotas": {"requestsPerMinute": 300}}})
        await eventually(lambda: (t := joined(kube, tmp_path)) is not None
                         and next(e for e in t.tenants if e.name == changed).share.requests_per_minute == 300, what="the new quota")
        await quiet(kube)
        writes = [c.name for c in kube.calls[mark + 1:] if c.resource == "secrets" and c.verb != "WATCH"]
    assert writes == [table_secret_name(pool_name(0), part_of(changed, len(written)))]
