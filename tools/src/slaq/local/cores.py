"""The demo's CPU layout: the engine's model worker on its cores with its engine core, everything else beside it.

On CPU, vLLM binds its model worker's OpenMP threads to cores of their own and leaves the rest
(`VLLM_CPU_NUM_OF_RESERVED_CPU`, one on a 2-core machine) to the engine's other processes. The
processes a demo starts besides (vLLM's API server, slaq's sidecar, the load client) are not
bound: the kernel balances them onto the worker's core too, and every millisecond one of them
runs there stalls the model step of both systems alike. `pin_beside_workers` moves them onto the
cores the workers leave free, where a GPU node's host processes would run beside its GPU.

vLLM's engine core process (`VLLM::EngineCore`, a child of the API server) is not bound by vLLM
either. It busy-polls for its worker's reply, and left to the kernel it ran on the front end's core
in 71–97 % of samples on the demo's 2 cores, taking 510–660 ms of every second there while the
sidecar waited 274–651 ms/s for CPU (issue 39). `pin_engine_cores` puts each engine's engine core
on its own model worker's cores: it waits while the worker computes, so the two take turns there,
and the front-end core is left to the API servers, the sidecar and the load client. Both systems
get the same layout.

Linux only (`/proc` and `sched_setaffinity`); elsewhere, or when the workers hold every core,
nothing is moved and the caller is told so (`None`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

WORKER_NAME = "VLLM::Worker"  # vLLM names its model worker processes so (their /proc comm)
ENGINE_CORE_NAME = "VLLM::EngineCor"  # and its engine core "VLLM::EngineCore", cut to the 15 characters of a comm
PROC = Path("/proc")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in (PROC / str(pid) / "task").iterdir():
            out += [int(child) for child in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def _name(pid: int) -> str:
    try:
        return (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def worker_cores(engine_pid: int) -> set[int]:
    """The cores the engine's model workers are bound to (empty: none found)."""
    cores: set[int] = set()
    for pid in descendants(engine_pid):
        if _name(pid).startswith(WORKER_NAME):
            try:
                cores |= os.sched_getaffinity(pid)
            except OSError:
                pass
    return cores


def engine_cores(engine_pid: int) -> list[int]:
    """The engine's engine core processes (vLLM's `EngineCore`, a child of its API server)."""
    return [pid for pid in descendants(engine_pid) if _name(pid).startswith(ENGINE_CORE_NAME)]


def free_cores(engine_pids: Iterable[int]) -> set[int] | None:
    """The cores no engine's model worker is bound to; None where there are none (or no workers
    were found, or this is not Linux)."""
    if not hasattr(os, "sched_getaffinity") or not PROC.is_dir():
        return None
    taken: set[int] = set()
    for pid in engine_pids:
        cores = worker_cores(pid)
        if not cores:
            return None
        taken |= cores
    free = os.sched_getaffinity(0) - taken
    return free or None


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of process `pid` onto `cores` (threads it starts later inherit the mask)."""
    try:
        tasks = [int(t) for t in os.listdir(PROC / str(pid) / "task")]
    except OSError:
        tasks = [pid]
    for tid in tasks:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:
            pass  # a thread that ended meanwhile


def pin_beside_workers(engine_pids: Iterable[int], others: Iterable[int]) -> set[int] | None:
    """Pin the engines' own processes (not their subprocesses), `others` and this process onto the
    cores the engines' model workers leave free; the cores used, or None when nothing was moved."""
    engine_pids = list(engine_pids)
    free = free_cores(engine_pids)
    if free is None:
        return None
    for pid in [*engine_pids, *others, os.getpid()]:
        pin(pid, free)
    return free


def pin_engine_cores(engine_pids: Iterable[int]) -> dict[int, set[int]]:
    """Pin each engine's engine core process onto the cores its own model workers are bound to;
    {engine core pid: cores} of those moved (none where no worker or no engine core was found, or
    this is not Linux)."""
    if not hasattr(os, "sched_setaffinity") or not PROC.is_dir():
        return {}
    moved: dict[int, set[int]] = {}
    for engine in engine_pids:
        cores = worker_cores(engine)
        if not cores:
            continue
        for core_pid in engine_cores(engine):
            pin(core_pid, cores)
            moved[core_pid] = cores
    return moved
