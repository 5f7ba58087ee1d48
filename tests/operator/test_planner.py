"""Table planning without an API (planner.py): which tenants are planned again, which tables and
parts change, in which order they are written; and what the writer (writer.py) then asks of the
client (a stub: tests/operator/planning.py)."""

from __future__ import annotations

import pytest

from slaq.bench.scale_objects import KEY_NAMESPACE, OPEN_NAMESPACES, POOL_NAMESPACE, key_secret, pool_body, pool_name, tenant_body, tenant_name
from slaq.operator import tables as tables_module
from slaq.operator.tables import plan_tables
from tests.operator.planning import SALT_KEY, Harness, pool_key_of

POOL = [f"{POOL_NAMESPACE}/{pool_name(p)}" for p in range(3)]


def tenants_of(harness: Harness, key: str) -> list[str]:
    return sorted(name for name in harness.books.pools.entries(key))


async def test_the_first_refresh_plans_every_tenant_and_writes_every_table_whole() -> None:
    harness = Harness()
    refreshed = await harness.refresh(everything=True)
    assert refreshed.replanned == {tenant_name(j) for j in range(9)} and refreshed.not_served == []
    assert sorted(refreshed.writes.parts) == POOL and refreshed.writes.lowered == set()
    for p, key in enumerate(POOL):
        (table, _), = refreshed.writes.parts[key]
        assert [t.name for t in table.tenants] == [tenant_name(j) for j in range(p, 9, 3)]
    assert sorted(c for c in harness.api.calls if c[0] != "patch_status") == sorted(
        ("create", "secrets", f"{pool_name(p)}-tenants") for p in range(3))
    assert harness.books.pools.dirty() == {}


async def test_the_tables_planned_one_change_at_a_time_equal_the_tables_planned_at_once() -> None:
    harness = Harness()
    await harness.refresh(everything=True)
    harness.put_tenant(tenant_body(4, 3, requests_per_minute=300))
    harness.put_tenant(tenant_body(9, 3))  # a new tenant of pool 0
    harness.keys.put(key_secret(9))
    refreshed = await harness.refresh(tenants=[tenant_name(4), tenant_name(9)])
    assert refreshed.replanned == {tenant_name(4), tenant_name(9)}
    assert sorted(refreshed.writes.parts) == [POOL[0], POOL[1]]

    tenants = [found.model for found in harness.tenant_store.values()]
    hashes = {name: list(harness.keys.get(KEY_NAMESPACE, f"{name}-keys").hashes) for name in harness.tenant_store}
    pools = [found.model for found in harness.pool_store.values()]
    scratch = plan_tables(pools, tenants, hashes, SALT_KEY, {key: 1 for key in POOL}, {}, open_namespaces=frozenset(OPEN_NAMESPACES))
    for p, key in enumerate(POOL):
        applied = harness.api.table(pool_name(p))
        assert applied is not None and applied.tenants == scratch.tables[key].tenants
        assert applied.revision == scratch.tables[key].revision


async def test_a_tenant_whose_inputs_did_not_change_is_not_planned_nor_written() -> None:
    harness = Harness()
    await harness.refresh(everything=True)
    before = len(harness.api.calls)
    refreshed = await harness.refresh(tenants=[tenant_name(0)])
    assert (refreshed.replanned, refreshed.writes.parts, len(harness.api.calls)) == (set(), {}, before)
    forced = await harness.refresh(tenants=[tenant_name(0)], force=True)  # replicas or demand moved: planned, same entries
    assert forced.replanned == {tenant_name(0)} and forced.writes.parts == {}


async def test_a_lowered_share_is_written_in_the_first_wave_and_a_raised_one_after() -> None:
    harness = Harness()
    await harness.refresh(everything=True)
    harness.put_tenant(tenant_body(1, 3, requests_per_minute=300))
    harness.put_tenant(tenant_body(2, 3, requests_per_minute=900))
    refreshed = await harness.refresh(tenants=[tenant_name(1), tenant_name(2)])
    assert refreshed.writes.waves() == [[POOL[1]], [POOL[2]]]


async def test_a_pool_whose_selector_labels_change_moves_its_tenants_and_is_written_whole() -> None:
    harness = Harness()
    await harness.refresh(everything=True)
    moved = pool_body(0, 3)
    moved["metadata"]["labels"]["slaq.dev/model"] = "m1"
    harness.put_pool(moved)
    refreshed = await harness.refresh(pools=[POOL[0]])
    assert refreshed.replanned == {tenant_name(j) for j in (0, 3, 6, 1, 4, 7)}
    assert tenants_of(harness, POOL[0]) == tenants_of(harness, POOL[1]) == [tenant_name(j) for j in (1, 4, 7)]
    assert sorted(refreshed.writes.parts) == [POOL[0], POOL[1]]  # pool 1's shares halve: the quota is split over two pools
    plan = harness.books.tenants.record(tenant_name(0)).plan
    assert plan is not None and plan.pools == []


async def test_a_split_table_rewrites_only_the_part_holding_the_changed_tenant(monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 4000  # bytes: 9 tenants of one pool take a few parts
    monkeypatch.setattr(tables_module, "SECRET_DATA_LIMIT", limit)
    harness = Harness(pools=1, tenants=9, models=1)
    first = await harness.refresh(everything=True)
    parts = first.writes.parts[POOL[0]]
    assert len(parts) > 1 and sorted(t.name for table, _ in parts for t in table.tenants) == [tenant_name(j) for j in range(9)]
    harness.put_tenant(tenant_body(5, 1, requests_per_minute=300))
    again = await harness.refresh(tenants=[tenant_name(5)])
    (table, _), = again.writes.parts[POOL[0]]
    assert tenant_name(5) in [t.name for t in table.tenants] and table.parts == len(parts)


async def test_a_table_too_large_is_left_as_written_and_its_tenants_told(monkeypatch: pytest.MonkeyPatch) -> None:
    harness = Harness(pools=1, tenants=3, models=1)
    await harness.refresh(everything=True)
    monkeypatch.setattr(tables_module, "SECRET_DATA_LIMIT", 100)
    harness.put_tenant(tenant_body(1, 1, requests_per_minute=300))
    calls = len(harness.api.calls)
    blocked = await harness.refresh(tenants=[tenant_name(1)])
    record = harness.books.pools.record(POOL[0])
    assert blocked.writes.parts == {} and len(harness.api.calls) == calls
    assert record.table_problem is not None and "do not fit" in record.table_problem
    assert record.blocked == {tenant_name(1)} and blocked.statuses == {tenant_name(1)}
    assert harness.books.pools.blocking(tenant_name(1)) == {POOL[0]: ("TableTooLarge", record.table_problem)}
    monkeypatch.undo()
    healed = await harness.refresh(pools=[POOL[0]], tenants=[tenant_name(1)], force=True)
    assert record.table_problem is None and tenant_name(1) in healed.statuses and list(healed.writes.parts) == [POOL[0]]


async def test_a_key_two_tenants_hold_is_refused_for_both() -> None:
    harness = Harness()
    await harness.refresh(everything=True)
    stolen = key_secret(0)
    stolen["metadata"] = {**stolen["metadata"], "name": f"{tenant_name(3)}-keys", "labels": {"slaq.dev/tenant": tenant_name(3)}}
    harness.keys.put(stolen)
    refreshed = await harness.refresh(tenants=[tenant_name(3)])
    assert refreshed.replanned == {tenant_name(3)} and harness.marks.tenants == {tenant_name(0): True}
    problem = harness.books.tenants.record(tenant_name(3)).key_problem
    assert problem is not None and problem[0] == "DuplicateKey" and tenant_name(0) in problem[1]
    again = await harness.refresh()  # what the reconciler's next pass does with the mark
    assert again.replanned == {tenant_name(0)}
    for j in (0, 3):
        assert harness.books.pools.entries(pool_key_of(j))[tenant_name(j)].key_hashes == []


async def test_a_key_secret_outside_the_allowed_namespaces_gives_no_keys() -> None:
    harness = Harness()
    body = tenant_body(2, 3)
    body["spec"]["apiKeySecretRef"]["namespace"] = "elsewhere"
    harness.put_tenant(body)
    await harness.refresh(everything=True)
    problem = harness.books.tenants.record(tenant_name(2)).key_problem
    assert problem is not None and problem[0] == "KeySecretNotAllowed"
    assert harness.planner.unwatched_key_namespaces([tenant_name(2), tenant_name(1)]) == []  # watching: Keys says all are


async def test_an_invalid_tenant_is_forgotten_and_reported_not_served() -> None:
    harness = Harness()
    await harness.refresh(everything=True)
    broken = tenant_body(4, 3)
    broken["spec"]["quotas"]["requestsPerMinute"] = -1
    harness.put_tenant(broken)
    refreshed = await harness.refresh(tenants=[tenant_name(4)])
    assert refreshed.not_served == [tenant_name(4)] and tenant_name(4) not in harness.books.tenants
    assert tenant_name(4) not in tenants_of(harness, pool_key_of(4)) and list(refreshed.writes.parts) == [pool_key_of(4)]


async def test_a_pool_that_leaves_the_view_has_its_table_dropped_and_rewritten_when_it_returns() -> None:
    harness = Harness()
    await harness.refresh(everything=True)
    harness.books.pools.record(POOL[2]).observed_replicas = 2
    gone = harness.pool_store.pop(POOL[2])
    await harness.refresh(pools=[POOL[2]])
    record = harness.books.pools.record(POOL[2])
    assert record.table.entries == {} and record.table.written is None and record.observed_replicas == 2
    harness.pool_store[POOL[2]] = gone
    back = await harness.refresh(pools=[POOL[2]])
    assert list(back.writes.parts) == [POOL[2]] and tenants_of(harness, POOL[2]) == [tenant_name(j) for j in (2, 5, 8)]
    assert harness.api.calls[-1] == ("patch_status", "inferencepools", pool_name(2))  # status.tenants written again


async def test_the_writer_deletes_the_parts_beyond_a_table_that_shrank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tables_module, "SECRET_DATA_LIMIT", 4000)
    harness = Harness(pools=1, tenants=9, models=1)
    first = await harness.refresh(everything=True)
    count = len(first.writes.parts[POOL[0]])
    assert count > 1
    monkeypatch.undo()
    harness.books.pools.touch(POOL[0])  # all of it: a new split, as few parts as fit
    harness.api.calls.clear()
    await harness.refresh()
    deleted = [c for c in harness.api.calls if c[0] == "delete"]
    assert deleted == [("delete", "secrets", f"{pool_name(0)}-tenants-{part}") for part in range(1, count)]
    assert harness.books.pools.record(POOL[0]).table.written is not None
    assert sorted(harness.books.pools.record(POOL[0]).table.written) == [0]
