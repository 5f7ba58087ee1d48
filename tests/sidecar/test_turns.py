"""`TenantTurns` (sidecar/src/slaq/sidecar/turns.py): a tenant's burst waits behind its own jobs, not
ahead of another tenant's."""

from __future__ import annotations

import threading

import pytest

from slaq.sidecar.turns import TenantTurns


def test_a_tenants_burst_does_not_hold_back_another_tenants_job() -> None:
    """`flood` submits six jobs, then `quiet` one: the quiet one runs second (after the flood's job
    already running), not seventh; the flood's jobs keep their own order."""
    turns = TenantTurns("test-turns")
    started, gate, ran = threading.Event(), threading.Event(), []

    def job(name: str) -> str:
        ran.append(name)
        if name == "flood-0":
            started.set()
            assert gate.wait(10)
        return name

    futures = [turns.submit("flood", job, f"flood-{i}") for i in range(6)]
    assert started.wait(10)  # the worker holds flood-0; the rest of the flood waits in its line
    quiet = turns.submit("quiet", job, "quiet-0")
    assert turns.waiting("flood") == 5 and turns.waiting("quiet") == 1
    gate.set()
    assert quiet.result(10) == "quiet-0" and [f.result(10) for f in futures] == [f"flood-{i}" for i in range(6)]
    assert ran == ["flood-0", "quiet-0", "flood-1", "flood-2", "flood-3", "flood-4", "flood-5"]
    assert turns.waiting("flood") == turns.waiting("quiet") == 0


def test_tenants_take_turns_one_job_each() -> None:
    """a's three jobs are submitted before b's and c's, while a's first job runs: they interleave,
    a's next one after b's and c's (first in, first out would run all of a's first)."""
    turns = TenantTurns("test-turns")
    gate, ran = threading.Event(), []
    hold = turns.submit("a", gate.wait, 10)  # keeps the worker busy while the lines fill
    futures = [turns.submit(tenant, ran.append, f"{tenant}{i}") for tenant in ("a", "b", "c") for i in range(3)]
    gate.set()
    for future in (hold, *futures):
        future.result(10)
    assert ran == ["b0", "c0", "a0", "b1", "c1", "a1", "b2", "c2", "a2"]


def test_a_failing_job_reaches_its_caller_and_the_worker_goes_on() -> None:
    turns = TenantTurns("test-turns")

    def boom() -> None:
        raise ValueError("bad prompt")

    failed = turns.submit("a", boom)
    with pytest.raises(ValueError, match="bad prompt"):
        failed.result(10)
    assert turns.submit("a", lambda: 7).result(10) == 7


def test_the_worker_is_one_named_thread_started_by_the_first_job_with_its_initializer() -> None:
    names: list[str] = []
    turns = TenantTurns("slaq-test-worker", initializer=lambda: names.append(threading.current_thread().name))
    assert not any(t.name == "slaq-test-worker" for t in threading.enumerate())
    threads = {turns.submit(t, lambda: threading.current_thread().name).result(10) for t in ("a", "b", "a")}
    assert threads == {"slaq-test-worker"} and names == ["slaq-test-worker"]
