"""Tenant lookup by key hash, gateway headers and table reloads, without sockets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slaq.api.common import Tier
from slaq.sidecar.errors import Unauthorized
from slaq.sidecar.tenants import Authenticator, TenantDirectory
from tests.sidecar.tables import abc_table, bearer


def write_table(path: Path, revision: str, **overrides: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(abc_table(revision, **overrides).model_dump_json(by_alias=True))
    os.replace(tmp, path)  # atomic, like the kubelet's symlink swap


def test_bearer_key_identifies_the_tenant() -> None:
    auth = Authenticator(TenantDirectory.from_table(abc_table()))
    identity = auth.identify(bearer("vip"))
    assert identity.tenant.name == "vip" and identity.tenant.tier is Tier.CRITICAL and identity.ttft_ms == 50.0


@pytest.mark.parametrize("headers", [
    {},
    {"authorization": "Bearer sk-not-a-key-of-anyone"},
    {"authorization": "Basic dXNlcjpwYXNz"},
    {"authorization": "Bearer "},
    {"authorization": "sk-vip-0123456789"},
])
def test_missing_or_unknown_keys_are_unauthorized(headers: dict[str, str]) -> None:
    with pytest.raises(Unauthorized):
        Authenticator(TenantDirectory.from_table(abc_table())).identify(headers)


def test_gateway_headers_are_ignored_unless_trusted() -> None:
    headers = {"x-llm-d-inference-fairness-id": "vip", "x-llm-d-slo-ttft-ms": "10"}
    with pytest.raises(Unauthorized):
        Authenticator(TenantDirectory.from_table(abc_table())).identify(headers)
    identity = Authenticator(TenantDirectory.from_table(abc_table())).identify({**bearer("std"), **headers})
    assert identity.tenant.name == "std" and identity.ttft_ms == 200.0


def test_trusted_gateway_names_the_tenant_and_sets_objectives() -> None:
    auth = Authenticator(TenantDirectory.from_table(abc_table()), trust_gateway_headers=True)
    identity = auth.identify({"x-llm-d-inference-fairness-id": "std", "x-llm-d-slo-ttft-ms": "120", "x-llm-d-slo-tpot-ms": "bogus"})
    assert identity.tenant.name == "std" and identity.ttft_ms == 120.0 and identity.tpot_ms == 100.0
    with pytest.raises(Unauthorized):
        auth.identify({"x-llm-d-inference-fairness-id": "nobody"})


def test_table_reloads_on_change_and_keeps_last_good_on_error(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    directory = TenantDirectory(path)
    assert not directory.refresh() and not directory.loaded and "is missing" in (directory.last_error or "")
    write_table(path, "r1")
    assert directory.refresh() and directory.index.revision == "r1"
    old_vip = directory.index.by_name["vip"]
    assert not directory.refresh()  # unchanged file: no reload
    write_table(path, "r2", vip={"tier": "standard", "ttft_ms": 300.0})
    assert directory.refresh()
    assert directory.index.by_name["vip"].tier is Tier.STANDARD
    assert old_vip.tier is Tier.CRITICAL  # a request admitted earlier keeps its snapshot
    path.write_text('{"pool": "p", "tenants": [{"name": "x"}]}')
    assert not directory.refresh()
    assert directory.index.revision == "r2" and "invalid tenant table" in (directory.last_error or "")


def keyed_table(key: str, *, hash_key: bytes | None) -> "TenantTable":
    """One tenant `vip` holding `key`, hashed as the operator hashes it (hash_key) or as an earlier one did (None)."""
    from slaq.api.table import TenantTable, hash_api_key
    from tests.sidecar.tables import entry

    vip = entry("vip", "critical", ttft_ms=50.0).model_copy(update={"key_hashes": [hash_api_key(key, hash_key)]})
    return TenantTable(pool="ns/pool", revision="r", key_hash_key=hash_key.hex() if hash_key else None, tenants=[vip])


def test_keys_are_looked_up_by_their_hmac_under_the_tables_key() -> None:
    from slaq.api.table import derive_key_hash_key, hash_api_key

    hash_key, key = derive_key_hash_key(b"operator pepper"), "sk-keyed-0123456789abcdefgh"
    table = keyed_table(key, hash_key=hash_key)
    assert table.tenants[0].key_hashes[0].startswith("hmac-sha256:")
    assert Authenticator(TenantDirectory.from_table(table)).identify({"authorization": f"Bearer {key}"}).tenant.name == "vip"
    # The bare SHA-256 of the key is not a valid entry of a keyed table: the sidecar does not try it.
    # A table midway through the migration (one entry still bare SHA-256) reads both forms.
    mixed = table.model_copy(update={"tenants": [table.tenants[0].model_copy(update={"key_hashes": [hash_api_key(key)]})]})
    index = TenantDirectory.from_table(mixed).index
    assert index.legacy_hashes and index.tenant_for_key(key) is not None
    assert not TenantDirectory.from_table(table).index.legacy_hashes
    other = keyed_table(key, hash_key=derive_key_hash_key(b"another pepper"))
    with pytest.raises(Unauthorized):
        Authenticator(TenantDirectory.from_table(other.model_copy(update={"key_hash_key": table.key_hash_key}))).identify(
            {"authorization": f"Bearer {key}"})


def test_a_table_of_an_earlier_operator_still_authenticates() -> None:
    key = "sk-legacy-0123456789abcdefgh"
    legacy = keyed_table(key, hash_key=None)
    assert legacy.key_hash_key is None and legacy.tenants[0].key_hashes[0].startswith("sha256:")
    assert Authenticator(TenantDirectory.from_table(legacy)).identify({"authorization": f"Bearer {key}"}).tenant.name == "vip"
