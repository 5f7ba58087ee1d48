"""Binding and table planning (pure): who is in which table, with which salt, keys and shares."""

from __future__ import annotations

from pathlib import Path

import yaml

from slaq.api.pool import InferencePool
from slaq.api.common import KvErase
from slaq.api.runtime import TenantUsage
from slaq.api.table import derive_cache_salt
from slaq.api.tenant import TenantSLA
from slaq.operator.tables import binds, plan_tables

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"
SALT_KEY = b"k" * 32


def tenants() -> list[TenantSLA]:
    return [TenantSLA.model_validate(d) for d in yaml.safe_load_all((EXAMPLES / "tenants.yaml").read_text()) if d]


def pools() -> list[InferencePool]:
    return [InferencePool.model_validate(yaml.safe_load((EXAMPLES / f).read_text())) for f in ("pool-gpu.yaml", "pool-cpu.yaml")]


def test_selectors_on_both_sides_decide_binding() -> None:
    vip, standard, free = tenants()
    gpu, cpu = pools()
    assert binds(vip, gpu) and binds(free, cpu)
    vip.spec.pool_selector.match_labels = {"slaq.dev/model": "llama3-8b"}
    assert binds(vip, gpu) and not binds(vip, cpu)
    gpu.spec.tenant_selector.match_labels = {"slaq.dev/tier": "critical"}
    assert binds(vip, gpu) and not binds(standard, gpu)


def test_plan_splits_across_pools_and_keeps_the_sum() -> None:
    usage = {"inference/llama3-8b": {"vip": TenantUsage(requests_per_minute=100.0, refused_per_minute=50.0)}}
    plan = plan_tables(pools(), tenants(), {"vip": ["sha256:" + "a" * 64]}, SALT_KEY,
                       {"inference/llama3-8b": 2, "default/tiny-cpu": 1}, usage)
    gpu = {t.name: t for t in plan.tables["inference/llama3-8b"].tenants}
    cpu = {t.name: t for t in plan.tables["default/tiny-cpu"].tenants}
    rpm = 2 * gpu["vip"].share.requests_per_minute + cpu["vip"].share.requests_per_minute
    assert rpm <= 600 and cpu["vip"].share.requests_per_minute >= 600 * 0.1 / 3 - 0.001
    assert gpu["vip"].share.requests_per_minute > cpu["vip"].share.requests_per_minute
    conc = 2 * gpu["free"].share.max_concurrency + cpu["free"].share.max_concurrency
    assert conc <= 8 and min(gpu["free"].share.max_concurrency, cpu["free"].share.max_concurrency) >= 1
    assert gpu["vip"].key_hashes == ["sha256:" + "a" * 64] and gpu["free"].key_hashes == []
    assert [p.pool for p in plan.tenant_pools["vip"]] == ["inference/llama3-8b", "default/tiny-cpu"]
    assert plan.tables["inference/llama3-8b"].revision and plan.tables["inference/llama3-8b"].revision != plan.tables["default/tiny-cpu"].revision


def test_salts_are_per_tenant_unless_a_prefix_cache_group_is_shared() -> None:
    group = tenants()
    group[1].spec.prefix_cache_group = "shared"
    group[2].spec.prefix_cache_group = "shared"
    plan = plan_tables(pools()[:1], group, {}, SALT_KEY, {}, {})
    salts = {t.name: t.cache_salt for t in plan.tables["inference/llama3-8b"].tenants}
    assert salts["standard"] == salts["free"] == derive_cache_salt(SALT_KEY, "group:shared")
    assert salts["vip"] == derive_cache_salt(SALT_KEY, "tenant:vip") != salts["free"]
    other = plan_tables(pools()[:1], group, {}, b"x" * 32, {}, {})
    assert {t.cache_salt for t in other.tables["inference/llama3-8b"].tenants}.isdisjoint(salts.values())


def test_each_tenants_kv_erase_mode_reaches_the_engines_table() -> None:
    group = tenants()
    group[2].spec.kv_erase = KvErase.ON_FREE
    plan = plan_tables(pools()[:1], group, {}, SALT_KEY, {}, {})
    modes = {t.name: t.kv_erase for t in plan.tables["inference/llama3-8b"].tenants}
    assert modes == {"vip": KvErase.ON_REUSE, "standard": KvErase.ON_REUSE, "free": KvErase.ON_FREE}


def test_unlimited_quotas_stay_unlimited() -> None:
    tenant = tenants()[0]
    tenant.spec.quotas.requests_per_minute = None
    plan = plan_tables(pools()[:1], [tenant], {}, SALT_KEY, {}, {})
    share = plan.tables["inference/llama3-8b"].tenants[0].share
    assert share.requests_per_minute is None and share.max_concurrency == 32


def test_same_inputs_give_the_same_revision() -> None:
    a = plan_tables(pools(), tenants(), {}, SALT_KEY, {}, {})
    b = plan_tables(pools(), tenants(), {}, SALT_KEY, {}, {})
    assert a.tables == b.tables


def test_a_table_over_one_secret_is_split_into_parts_that_fit_and_stay_put() -> None:
    from slaq.api.table import TenantEntry
    from slaq.operator.tables import SECRET_DATA_LIMIT, data_bytes, part_of, split_table

    entries = [TenantEntry(name=f"t{i:05d}", tier="standard", cache_salt="s" * 64, key_hashes=["sha256:" + "a" * 64] * 3)
               for i in range(4000)]
    parts = split_table("ns/p", entries)
    assert len(parts) > 1 and len(parts) & (len(parts) - 1) == 0  # a power of two
    assert all(data_bytes(texts) <= SECRET_DATA_LIMIT for _, texts in parts)
    assert [t.part for t, _ in parts] == list(range(len(parts))) and {t.parts for t, _ in parts} == {len(parts)}
    assert sorted(e.name for t, _ in parts for e in t.tenants) == [e.name for e in entries]
    # Each tenant's part depends only on its name and the count: one tenant's change rewrites one part.
    assert all(part_of(e.name, len(parts)) == t.part for t, _ in parts for e in t.tenants)
    small = split_table("ns/p", entries[:10])
    assert len(small) == 1 and small[0][0].part is None and small[0][0].parts is None


def test_the_renderer_writes_exactly_what_the_models_serialise() -> None:
    from slaq.api.table import TenantEntry
    from slaq.operator.tables import TableRenderer, assemble_table, table_texts

    entries = [TenantEntry(name=n, tier="critical", cache_salt="s" * 64, ttft_ms=50.0, key_hashes=["sha256:" + "b" * 64])
               for n in ("zeta", "alpha", "mu")]
    renderer = TableRenderer()
    for part, parts in ((0, 1), (1, 4)):
        table, texts = renderer.render("ns/pool-ä", entries, part, parts)
        expected = assemble_table("ns/pool-ä", entries, part, parts)
        assert table == expected and texts == table_texts(expected)
    renderer.keep_only(entries[:1])
    assert renderer.render("ns/p", entries)[1] == table_texts(assemble_table("ns/p", entries))
