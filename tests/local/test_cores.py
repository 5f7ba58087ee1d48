"""The demo's CPU layout (slaq.local.cores): found from real processes' /proc entries and affinities."""

from __future__ import annotations

import json
import os
import signal
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


# An engine of our own: a process whose children name themselves as `engine_tree`'s caller asks, so
# what is searched under its pid is only these (this test process has other descendants in a full
# run: the session's real engine, whose engine core a search from os.getpid() would find and move).
TREE = """
import json, os, subprocess, sys, time
pids = []
for name, cores in json.loads(sys.argv[1]):
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], name])
    if cores is not None:
        os.sched_setaffinity(child.pid, cores)
    pids.append(child.pid)
print(json.dumps(pids), flush=True)
time.sleep(60)
"""


@contextmanager
def engine_tree(*children: tuple[str, set[int] | None]) -> Iterator[tuple[int, list[int]]]:
    """(the root's pid, its children's pids); the whole group is stopped by its process group id."""
    spec = json.dumps([(name, sorted(cores) if cores is not None else None) for name, cores in children])
    root = subprocess.Popen([sys.executable, "-c", TREE, spec, SLEEPER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pids = json.loads(root.stdout.readline())
        deadline = time.monotonic() + 10
        for pid, (name, _) in zip(pids, children):
            while open(f"/proc/{pid}/comm").read().strip() != name[:15] and time.monotonic() < deadline:
                time.sleep(0.02)
        yield root.pid, pids
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


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
    with engine_tree((WORKER_NAME, worker), ("VLLM::EngineCore", set(allowed)), ("python-other", set(allowed))) as (engine, (_, core, other)):
        assert engine_cores(engine) == [core] and ENGINE_CORE_NAME == "VLLM::EngineCore"[:15]
        assert pin_engine_cores([engine]) == {core: worker}
        assert os.sched_getaffinity(core) == worker
        assert os.sched_getaffinity(other) == set(allowed)


def test_without_a_worker_the_engine_core_is_not_moved() -> None:
    allowed = set(os.sched_getaffinity(0))
    with engine_tree(("VLLM::EngineCore", allowed)) as (engine, (core,)):
        assert pin_engine_cores([engine]) == {}
        assert os.sched_getaffinity(core) == allowed
