"""The operator's books (pure): forgetting a pool or a tenant leaves no trace of it anywhere."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from slaq.api.runtime import TenantUsage
from slaq.operator.books import Books, GatewayOutcome, Marks, PoolBook, PoolRecord, TenantBook
from slaq.bench.scale_objects import POOL_NAMESPACE
from tests.operator.planning import Harness, pool_key_of, tenant_name


# What the cluster holds (a table part as applied, a pool's status.tenants as written) until the
# table is written again: a record of the cluster, not of the tenant.
CLUSTER = frozenset({"written", "names"})


def traces(obj: Any, needle: str, path: str = "books", skip: frozenset[str] = frozenset()) -> Iterator[str]:
    """Every place under `obj` (attributes, dataclass fields, dict keys and values, items of
    sets, lists and tuples, pydantic fields) where the string `needle` occurs."""
    if isinstance(obj, str):
        if obj == needle:
            yield path
        return
    if isinstance(obj, (bytes, int, float, bool)) or obj is None:
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from traces(key, needle, f"{path}[key {key!r}]", skip)
            yield from traces(value, needle, f"{path}[{key!r}]", skip)
        return
    if isinstance(obj, (list, tuple, set, frozenset, deque)):
        for i, item in enumerate(obj):
            yield from traces(item, needle, f"{path}[{i}]", skip)
        return
    if isinstance(obj, BaseModel):
        for name in type(obj).model_fields:
            yield from traces(getattr(obj, name), needle, f"{path}.{name}", skip)
        return
    if dataclasses.is_dataclass(obj):
        fields = [f.name for f in dataclasses.fields(obj)]
    else:
        fields = list(vars(obj))
    for name in fields:
        if name not in skip:
            yield from traces(getattr(obj, name), needle, f"{path}.{name}", skip)


async def test_forgetting_a_tenant_removes_it_from_every_book_and_its_key_hashes_too() -> None:
    harness = Harness()
    await harness.refresh(everything=True)
    gone = tenant_name(4)
    hashes = list(harness.books.tenants.record(gone).claimed)
    assert hashes and list(traces(harness.books, gone, skip=CLUSTER))  # negative control: it is there
    harness.books.pools.record(pool_key_of(4)).blocked.add(gone)

    pools, others = harness.books.forget_tenant(gone)

    assert pools == {pool_key_of(4)} and others == set()
    assert list(traces(harness.books, gone, skip=CLUSTER)) == []
    assert [p for h in hashes for p in traces(harness.books, h, skip=CLUSTER)] == []
    assert list(traces(harness.books, tenant_name(5), skip=CLUSTER))  # the others stay


async def test_a_forgotten_tenant_leaves_the_written_tables_once_its_part_is_rewritten() -> None:
    harness = Harness()
    await harness.refresh(everything=True)
    gone = tenant_name(4)
    del harness.tenant_store[gone]
    assert gone in [t.name for t in harness.api.table("pool-001").tenants]
    refreshed = await harness.refresh(tenants=[gone])
    assert refreshed.not_served == [gone] and set(refreshed.writes.parts) == {pool_key_of(4)}
    assert list(traces(harness.books, gone)) == []  # CLUSTER included: its part was rewritten
    assert gone not in [t.name for t in harness.api.table("pool-001").tenants]


async def test_forgetting_a_pool_removes_its_record_whole_owned_objects_included() -> None:
    harness = Harness()
    await harness.refresh(everything=True)
    key = pool_key_of(0)
    record = harness.books.pools.record(key)
    record.owned.add(("deployments", "inference", "pool-000", "uid-0"))
    record.usage = {tenant_name(0): TenantUsage(requests_per_minute=5.0)}
    record.gateway = GatewayOutcome(False, "ApiNotServed", "no CRD")
    record.foreign.append("Service inference/pool-000")
    assert list(traces(harness.books, key))  # negative control

    held = harness.books.pools.forget(key)

    assert held == {tenant_name(j) for j in (0, 3, 6)}  # their plans name the pool until they are planned again (next test)
    assert list(traces(harness.books.pools, key)) == [] and key not in harness.books.pools
    assert list(traces(harness.books, "uid-0")) == [] and list(traces(harness.books, "Service inference/pool-000")) == []
    assert harness.books.pools.get(pool_key_of(1)) is not None  # the other pools stay


async def test_a_deleted_pool_is_forgotten_and_its_tenants_planned_again_without_it() -> None:
    harness = Harness(pools=4, models=2)  # tenants of model m0 bind pools 0 and 2
    await harness.refresh(everything=True)
    shares = {s.pool: s.requests_per_minute for s in harness.books.tenants.record(tenant_name(0)).plan.pools}
    key = pool_key_of(2)
    del harness.pool_store[key]
    for tenant in harness.books.pools.forget(key):  # what Reconciler.forget_pool does
        harness.marks.tenant(tenant, True)
    result = await harness.refresh(pools=[key])
    assert key not in harness.books.pools and list(traces(harness.books, key)) == []
    plan = harness.books.tenants.record(tenant_name(0)).plan
    assert [s.pool for s in plan.pools] == [pool_key_of(0)]
    assert plan.pools[0].requests_per_minute > shares[pool_key_of(0)]  # re-split over the pool that remains
    assert set(result.writes.parts) == {pool_key_of(0)}


def test_dropping_a_table_keeps_what_was_observed_and_owned_and_removes_an_empty_record() -> None:
    book = PoolBook()
    book.record("ns/a").observed_replicas = 3
    book.record("ns/a").owned.add(("services", "ns", "a", "uid"))
    book.touch("ns/a", "t")
    book.touch("ns/b")
    book.drop_table("ns/a")
    book.drop_table("ns/b")
    assert book.record("ns/a").table.dirty is False and book.record("ns/a").observed_replicas == 3
    assert book.record("ns/a").owned == {("services", "ns", "a", "uid")}
    assert "ns/b" not in book and book.keys() == ["ns/a"]


def test_touching_marks_a_part_or_the_whole_table() -> None:
    book = PoolBook()
    book.touch("ns/a", "t1")
    book.touch("ns/a", "t2")
    book.touch("ns/b", "t1")
    book.touch("ns/b")
    book.touch("ns/b", "t3")
    assert book.dirty() == {"ns/a": {"t1", "t2"}, "ns/b": None}
    book.record("ns/a").table.written_clean()
    assert book.dirty() == {"ns/b": None}


def test_shared_key_hashes_are_reported_and_released_when_one_tenant_goes() -> None:
    book = TenantBook()
    assert book.claim("a", frozenset({"h1", "h2"})) == (set(), set())
    assert book.claim("b", frozenset({"h2"})) == ({"h2"}, {"a"})
    book.refer("a", ("keys", "a"))
    book.refer("b", ("keys", "a"))
    assert book.users_of(("keys", "a")) == {"a", "b"} and book.users_in("keys") == {"a", "b"}
    assert book.forget("b") == {"a"}  # a's shared key changes: it must be planned again
    assert book.owners_of("h2") == {"a"} and book.users_of(("keys", "a")) == {"a"}
    assert book.forget("a") == set()
    assert (book.names(), book.owners_of("h1"), book.users_in("keys")) == ([], set(), set())
    assert list(traces(book, "a")) == [] and list(traces(book, "h1")) == []


def test_a_tenant_moving_its_key_secret_leaves_the_old_one() -> None:
    book = TenantBook()
    book.refer("a", ("keys", "old"))
    book.refer("a", ("keys", "new"))
    assert book.users_of(("keys", "old")) == set() and list(traces(book, "old")) == []


def test_marks_are_taken_whole_and_put_back_after_a_failure() -> None:
    marks = Marks()
    marks.tenant("a")
    marks.tenant("b", True)
    marks.pools.add("ns/p")
    taken = marks.take()
    assert not marks and taken.tenants == {"a": False, "b": True}
    marks.tenant("a", True)  # marked while the refresh ran
    marks.put_back(taken)
    assert marks.tenants == {"a": True, "b": True} and marks.pools == {"ns/p"}


def test_an_empty_record_equals_a_new_one() -> None:
    assert PoolRecord() == PoolRecord() and Books().pools.keys() == []


async def test_the_reconciler_forgets_a_deleted_pool_whole_and_marks_its_tenants_to_be_planned_again() -> None:
    from slaq.operator.reconciler import Reconciler
    from tests.operator.planning import StubApi

    harness = Harness()
    await harness.refresh(everything=True)
    reconciler = Reconciler(StubApi(), usage_source=None, namespace="slaq-system")  # type: ignore[arg-type]
    reconciler.books = harness.books  # what a first refresh left
    reconciler.books.pools.record(pool_key_of(0)).owned.add(("services", "inference", "pool-000", "uid-pool-000"))
    reconciler.attainment.record(pool_key_of(0), [], 0.0)
    assert list(traces(reconciler.attainment, pool_key_of(0)))  # negative control
    reconciler.forget_pool(POOL_NAMESPACE, "pool-000")
    assert pool_key_of(0) not in reconciler.books.pools and list(traces(reconciler.books.pools, "uid-pool-000")) == []
    assert reconciler.marks.tenants == {tenant_name(j): True for j in (0, 3, 6)}
    assert list(traces(reconciler.attainment, pool_key_of(0))) == []
