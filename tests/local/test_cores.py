"""The demo's CPU layout (slaq.local.cores): found from real processes' /proc entries and affinities."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from slaq.local.cores import ENGINE_CORE_NAME, WORKER_NAME, descendants, engine_cores, free_cores, pin, pin_beside_workers, pin_engine_cores, worker_cores

SLEEPER = "import sys, time; open('/proc/self/comm', 'w').write(sys.argv[1]); time.sleep(60)"


@contextmanager
def child(name: str, cores: set[int] | None = None) -> Iterator[subprocess.Popen]:
    """A child process that names itself `name` (its /proc comm), bound to `cores`; stopped by pid."""
    process = subprocess.Popen([sys.executable, "-c", SLEEPER, name])
    try:
        if cores is not None:
            os.sched_setaffinity(process.pid, cores)
        deadline = time.monotonic() + 10
        while open(f"/proc/{process.pid}/comm").read().strip() != name[:15] and time.monotonic() < deadline:
            time.sleep(0.02)
        yield process
    finally:
        process.kill()
        process.wait()


@contextmanager
def own_affinity_restored() -> Iterator[None]:
    saved = os.sched_getaffinity(0)
    try:
        yield
    finally:
        pin(os.getpid(), saved)  # every thread, as pin_beside_workers moved them


def test_a_workers_cores_are_found_among_the_engines_descendants_and_the_rest_are_free() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    worker = {allowed[0]}
    with child(WORKER_NAME, worker) as process, child("python-other"):
        assert process.pid in descendants(os.getpid())
        assert worker_cores(os.getpid()) == worker
        assert free_cores([os.getpid()]) == (set(allowed) - worker or None)


def test_without_a_worker_or_without_a_free_core_nothing_is_moved() -> None:
    with child("python-other") as other:
        assert worker_cores(other.pid) == set() and free_cores([other.pid]) is None
    with child(WORKER_NAME, set(os.sched_getaffinity(0))):
        assert free_cores([os.getpid()]) is None  # the worker holds every core


def test_the_engine_the_others_and_this_process_move_beside_the_worker_which_stays() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        with child(WORKER_NAME, {allowed[0]}):
            assert pin_beside_workers([os.getpid()], []) is None
        return
    worker = {allowed[0]}
    with own_affinity_restored(), child(WORKER_NAME, worker) as process, child("sidecar") as sidecar:
        free = pin_beside_workers([os.getpid()], [sidecar.pid])
        assert free == set(allowed) - worker
        assert os.sched_getaffinity(0) == free and os.sched_getaffinity(sidecar.pid) == free
        assert os.sched_getaffinity(process.pid) == worker


def test_the_engine_core_moves_onto_its_workers_cores_and_nothing_else_does() -> None:
    """vLLM's engine core (`VLLM::EngineCore`, a comm cut to 15 characters) goes beside its model
    worker, not onto the front end's cores; another process (the negative control) stays put."""
    allowed = sorted(os.sched_getaffinity(0))
    worker = {allowed[0]}
    with child(WORKER_NAME, worker), child("VLLM::EngineCore", set(allowed)) as core, child("python-other", set(allowed)) as other:
        assert engine_cores(os.getpid()) == [core.pid] and ENGINE_CORE_NAME == "VLLM::EngineCore"[:15]
        assert pin_engine_cores([os.getpid()]) == {core.pid: worker}
        assert os.sched_getaffinity(core.pid) == worker
        assert os.sched_getaffinity(other.pid) == set(allowed)


def test_without_a_worker_the_engine_core_is_not_moved() -> None:
    allowed = set(os.sched_getaffinity(0))
    with child("VLLM::EngineCore", allowed) as core:
        assert pin_engine_cores([os.getpid()]) == {}
        assert os.sched_getaffinity(core.pid) == allowed
