"""How long processes waited for a CPU, as Linux counts it, and whether the demo's front end was saturated.

Each thread's run-queue wait is the second field of `/proc/PID/task/TID/schedstat` (nanoseconds
spent runnable but not running). `WaitMeter` sums it over some processes' threads (and their
descendants') between two reads, per second of wall time: 500 ms/s means those processes were
ready to run, and waiting for a core, half of the time. A thread that ends between the reads takes
its count with it, so the figure is a lower bound.

On the demo's 2 cores the front end (vLLM's API server, slaq's sidecar, the load client) shares a
core; when it is saturated the loaded run measures the machine, not the scheduling (issue 39: the
sidecar waited 274–651 ms/s for CPU in runs where the VIP met its objective in 31–97 % of
requests). `front_end_problems` says so, from the client's lateness and the front end's wait.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from slaq.local.cores import PROC, descendants

# Over these the front end is saturated. The load client sends late against its plan when its core
# is busy: 50 ms is a third of a typical calibrated VIP objective (3 × its unloaded p90, ~120 ms).
# A front-end process waiting for a CPU a quarter of the time delays every request it handles.
LATE_P99_MS = 50.0
WAIT_MS_PER_S = 250.0


def run_queue_wait_s(pids: Iterable[int]) -> float | None:
    """Seconds the threads of `pids` have spent waiting for a CPU so far; None where Linux does not say."""
    total, seen = 0.0, False
    for pid in pids:
        try:
            tasks = list((PROC / str(pid) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                fields = (task / "schedstat").read_text().split()
            except OSError:
                continue  # a thread that ended meanwhile
            if len(fields) >= 2:
                total += int(fields[1]) / 1e9
                seen = True
    return total if seen else None


@dataclass
class WaitMeter:
    """The run-queue wait of some processes (with their descendants) from `start` to `per_second_ms`."""

    pids: Sequence[int]
    with_descendants: bool = True
    _start: float | None = field(default=None, repr=False)
    _t0: float = field(default=0.0, repr=False)

    def _all(self) -> list[int]:
        return [p for pid in self.pids for p in ([pid, *descendants(pid)] if self.with_descendants else [pid])]

    def start(self) -> "WaitMeter":
        self._start, self._t0 = run_queue_wait_s(self._all()), time.monotonic()
        return self

    def per_second_ms(self) -> float | None:
        """Milliseconds of waiting for a CPU per second since `start`; None where it cannot be read."""
        now, elapsed = run_queue_wait_s(self._all()), time.monotonic() - self._t0
        if self._start is None or now is None or elapsed <= 0:
            return None
        return max(0.0, now - self._start) / elapsed * 1000.0


def front_end_problems(late_p99_ms: float | None, waits_ms_per_s: dict[str, float | None]) -> list[str]:
    """Why a system's loaded run measured a saturated front end (empty: it did not): the client's
    p99 lateness against its plan, and each front-end process's wait for a CPU (by name)."""
    problems = []
    if late_p99_ms is not None and late_p99_ms > LATE_P99_MS:
        problems.append(f"the load client sent its requests late (p99 {late_p99_ms:.0f} ms > {LATE_P99_MS:.0f} ms)")
    for name, wait in waits_ms_per_s.items():
        if wait is not None and wait > WAIT_MS_PER_S:
            problems.append(f"{name} waited {wait:.0f} ms/s for a CPU (> {WAIT_MS_PER_S:.0f})")
    return problems


def describe_wait(waits_ms_per_s: dict[str, float | None]) -> str:
    return ", ".join(f"{name} {'?' if wait is None else f'{wait:.0f}'} ms/s" for name, wait in waits_ms_per_s.items())
