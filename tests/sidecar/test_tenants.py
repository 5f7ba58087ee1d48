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


def per_pod_table(revision: str = "r1") -> "TenantTable":
    """vip: 1 concurrent request and 60 rpm on a replica not listed; pod `llama-7f9c-a` holds 3 and 240."""
    from slaq.api.table import ReplicaShare

    table = abc_table(revision, vip={"max_concurrency": 1, "requests_per_minute": 60.0})
    vip = table.tenants[0]
    listed = vip.model_copy(update={"pod_shares": {"llama-7f9c-a": ReplicaShare(max_concurrency=3, requests_per_minute=240.0)}})
    return table.model_copy(update={"tenants": [listed, *table.tenants[1:]]})


def test_a_replica_enforces_its_own_per_pod_share(tmp_path: Path) -> None:
    from slaq.sidecar.admission import QuotaGate
    from slaq.sidecar.errors import ConcurrencyExceeded

    path = tmp_path / "tenants.json"
    path.write_text(per_pod_table().model_dump_json(by_alias=True, exclude_none=True))
    hot, other, unnamed = (TenantDirectory(path, pod=pod) for pod in ("llama-7f9c-a", "llama-7f9c-b", None))
    for directory in (hot, other, unnamed):
        assert directory.refresh()
    mine = Authenticator(hot).identify(bearer("vip")).tenant
    assert (mine.max_concurrency, mine.requests_per_minute) == (3, 240.0)
    for directory in (other, unnamed):  # a pod not listed, or a sidecar without a name: the entry's share
        tenant = Authenticator(directory).identify(bearer("vip")).tenant
        assert (tenant.max_concurrency, tenant.requests_per_minute) == (1, 60.0)
    assert hot.index.by_name["std"] == other.index.by_name["std"]  # tenants without per-pod shares: the same everywhere
    # The gate enforces it: three in flight on the listed pod, the fourth refused; one on the other.
    gate = QuotaGate()
    for _ in range(3):
        gate.admit(mine, 10, now=0.0)
    with pytest.raises(ConcurrencyExceeded, match="limit 3"):
        gate.admit(mine, 10, now=0.0)
    elsewhere = QuotaGate()
    elsewhere.admit(other.index.by_name["vip"], 10, now=0.0)
    with pytest.raises(ConcurrencyExceeded, match="limit 1"):
        elsewhere.admit(other.index.by_name["vip"], 10, now=0.0)


def test_a_table_without_per_pod_shares_reads_as_before() -> None:
    table = abc_table(vip={"max_concurrency": 2})
    assert "podShares" not in table.model_dump_json(by_alias=True, exclude_none=True)
    for pod in ("any-pod", None):
        assert TenantDirectory.from_table(table, pod).index.by_name["vip"].max_concurrency == 2


def test_the_sidecar_takes_its_pod_name_from_the_downward_api(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from slaq.cli import build_parser
    from slaq.sidecar.server import SidecarOptions, build_app

    monkeypatch.setenv("POD_NAME", "llama-7f9c-a")
    assert build_parser().parse_args(["sidecar"]).pod_name == "llama-7f9c-a"
    assert build_parser().parse_args(["sidecar", "--pod-name", "x"]).pod_name == "x"
    monkeypatch.delenv("POD_NAME")
    assert build_parser().parse_args(["sidecar"]).pod_name is None
    path = tmp_path / "tenants.json"
    path.write_text(per_pod_table().model_dump_json(by_alias=True, exclude_none=True))
    app = build_app(SidecarOptions(host="127.0.0.1", port=1, engine_url="http://127.0.0.1:1", tenant_table=path, pod_name="llama-7f9c-a"))
    assert app.core.directory.refresh() and app.core.directory.index.by_name["vip"].max_concurrency == 3
