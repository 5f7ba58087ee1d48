"""The front end's wait for a CPU (slaq.local.cpu_wait) and the demo's verdict on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from slaq.local.cpu_wait import LATE_P99_MS, WAIT_MS_PER_S, WaitMeter, front_end_problems, run_queue_wait_s

SPIN = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass"


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux only")
def test_two_spinners_on_one_core_wait_for_it_about_half_the_time_and_an_idle_process_not_at_all() -> None:
    core = {sorted(os.sched_getaffinity(0))[0]}
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    try:
        for process in spinners:
            os.sched_setaffinity(process.pid, core)
        time.sleep(0.2)  # the interpreters are up
        busy, quiet = WaitMeter([p.pid for p in spinners]).start(), WaitMeter([idle.pid]).start()
        time.sleep(0.8)
        busy_ms, quiet_ms = busy.per_second_ms(), quiet.per_second_ms()
    finally:
        for process in (*spinners, idle):
            process.kill()
            process.wait()
    # Two runnable processes, one core: together they wait ~1000 ms per second (each half the time);
    # other helpers on this shared machine may add to it, never take from it.
    assert busy_ms is not None and busy_ms > 600
    assert quiet_ms is not None and quiet_ms < 100


def test_a_process_that_is_gone_reads_as_unknown() -> None:
    assert run_queue_wait_s([2 ** 22 + 12345]) is None
    assert WaitMeter([2 ** 22 + 12345]).start().per_second_ms() is None


def test_the_verdict_names_what_is_over_its_bound_and_nothing_else() -> None:
    assert front_end_problems(LATE_P99_MS - 1, {"sidecar": WAIT_MS_PER_S - 1, "API server": None}) == []
    problems = front_end_problems(LATE_P99_MS + 60, {"sidecar": WAIT_MS_PER_S + 150, "API server": 10.0})
    assert len(problems) == 2
    assert "late (p99 110 ms > 50 ms)" in problems[0] and problems[1].startswith("sidecar waited 400 ms/s")
