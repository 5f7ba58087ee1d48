"""The KV connector's planner takes tenants' erase modes and salt fingerprints from the engine table."""

from __future__ import annotations

from pathlib import Path

from slaq.api.common import KvErase, Tier
from slaq.api.table import EngineTable, TenantEntry, TenantTable, hash_api_key
from slaq.engine.kv_security.ownership import REASON_SALT_CHANGED, REASON_TENANT_REMOVED
from slaq.engine.kv_security.planner import KVSecurityPlanner
from slaq.engine.metrics import engine_metrics


def engine_table(salts: dict[str, str], on_free: frozenset[str] = frozenset()) -> EngineTable:
    return EngineTable.of(TenantTable(pool="ns/p", tenants=[
        TenantEntry(name=name, tier=Tier.STANDARD, cache_salt=salt, key_hashes=[hash_api_key(name)],
                    kv_erase=KvErase.ON_FREE if name in on_free else KvErase.ON_REUSE)
        for name, salt in salts.items()]))


def test_a_changed_salt_or_a_removed_tenant_erases_its_blocks_and_an_unchanged_table_erases_nothing(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    first = engine_table({"vip": "a" * 64, "free": "b" * 64}, on_free=frozenset({"free"}))
    path.write_text(first.model_dump_json(by_alias=True))
    planner = KVSecurityPlanner(num_blocks=8, block_size=16, erase=True, host_capacity_blocks=0, metrics=engine_metrics(),
                                engine_table=path)
    assert planner.ownership.erase_when_freed == {"free"}  # read from the file at startup
    planner.ownership.written("vip", [1, 2])
    planner.ownership.written("free", [3])
    planner.apply_table(first)
    assert planner.ownership.take_erase_orders() == {}  # negative control: nothing changed
    planner.apply_table(engine_table({"vip": "c" * 64, "free": "b" * 64}, on_free=frozenset({"free"})))
    assert planner.ownership.take_erase_orders() == {1: REASON_SALT_CHANGED, 2: REASON_SALT_CHANGED}
    planner.apply_table(engine_table({"vip": "c" * 64}))
    assert planner.ownership.take_erase_orders() == {3: REASON_TENANT_REMOVED}
    assert planner.ownership.erase_when_freed == set()
