"""`slaq up`'s tenant table: TenantSLA manifests + key Secrets → the operator's plan_tables output."""

from __future__ import annotations

import base64
import textwrap
from pathlib import Path

import pytest

from slaq.api.table import EngineTable, TenantTable, derive_key_hash_key, hash_api_key
from slaq.cli import repo_root
from slaq.local.errors import TenantFileError
from slaq.local.tenants import engine_table_beside, local_pool, plan_local_table, read_tenants, write_table

EXAMPLES = repo_root() / "crds" / "examples"


def test_examples_give_three_tenants_with_hashed_keys_only(tmp_path: Path) -> None:
    local = read_tenants([EXAMPLES])
    assert sorted(t.metadata.name for t in local.tenants) == ["free", "standard", "vip"]
    table = plan_local_table(local, local_pool("slaq-tiny"), salt_key=b"k" * 32)
    path = write_table(table, tmp_path / "t" / "tenants.json")
    text = path.read_text()
    for keys in local.keys.values():
        for key in keys:
            assert key not in text
    loaded = TenantTable.model_validate_json(text)
    by_name = {t.name: t for t in loaded.tenants}
    assert by_name["vip"].key_hashes == [hash_api_key("sk-demo-vip-0123456789abcdef", derive_key_hash_key(b"k" * 32))]
    assert by_name["vip"].ttft_ms == 50 and by_name["free"].ttft_ms is None
    assert by_name["vip"].share.requests_per_minute == 600  # one replica: the whole quota
    assert loaded.revision  # set by plan_tables, so the sidecar sees changes
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    # The engine's file beside it (what `slaq up` hands the engine): shares and erase modes, no hashes.
    engine = EngineTable.model_validate_json(engine_table_beside(path).read_text())
    assert engine.kv_shares() == {"free": 0.2, "standard": 0.4, "vip": 0.5} and engine.revision == loaded.revision
    assert "sha256:" not in engine_table_beside(path).read_text() and "keyHashKey" not in engine_table_beside(path).read_text()


def test_example_key_prefers_the_critical_tier() -> None:
    assert read_tenants([EXAMPLES]).example_key() == ("vip", "sk-demo-vip-0123456789abcdef")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return path


TENANT = """\
apiVersion: slaq.dev/v1alpha1
kind: TenantSLA
metadata: {name: acme}
spec:
  tier: standard
  objectives: {ttftMs: 300}
  apiKeySecretRef: {name: acme-keys, namespace: ns}
"""


def test_base64_data_keys_are_read(tmp_path: Path) -> None:
    encoded = base64.b64encode(b"sk-acme-0123456789").decode()
    path = _write(tmp_path, TENANT + f"---\napiVersion: v1\nkind: Secret\nmetadata: {{name: acme-keys, namespace: ns}}\ndata: {{k: {encoded}}}\n")
    assert read_tenants([path]).keys == {"acme": ["sk-acme-0123456789"]}


def test_missing_secret_is_named(tmp_path: Path) -> None:
    with pytest.raises(TenantFileError, match="Secret ns/acme-keys, which is not in the given files"):
        read_tenants([_write(tmp_path, TENANT)])


def test_invalid_tenant_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(TenantFileError, match=r"TenantSLA/acme: not a valid TenantSLA: spec.tier"):
        read_tenants([_write(tmp_path, TENANT.replace("tier: standard", "tier: gold"))])


def test_no_tenants_and_missing_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TenantFileError, match="no TenantSLA documents"):
        read_tenants([_write(tmp_path, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")])
    with pytest.raises(TenantFileError, match="does not exist"):
        read_tenants([tmp_path / "nope"])


def test_bad_base64_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, TENANT + "---\napiVersion: v1\nkind: Secret\nmetadata: {name: acme-keys, namespace: ns}\ndata: {k: '%%%'}\n")
    with pytest.raises(TenantFileError, match="data.k is not base64"):
        read_tenants([path])
