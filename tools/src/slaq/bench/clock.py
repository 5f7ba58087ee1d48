"""Simulated time for code that reads the clock through `time.time()` / `time.monotonic()`.

The schedulers under test (stock vLLM and slaq's) read the clock only through those two
functions (docs/DESIGN.md, request contract), so the simulator swaps them for the simulated
clock while a scheduler method runs, and puts the real ones back afterwards: the progress bar,
logging and the overhead measurement keep real time.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

# The simulated clock starts at the Azure conversation trace's first request
# (2023-11-16 18:15:46 UTC), so `slaq_arrival` values look like real epoch seconds.
SIM_EPOCH = 1700158546.0


class SimClock:
    """Seconds since the start of the simulation, and the epoch they are offset by."""

    def __init__(self, epoch: float = SIM_EPOCH) -> None:
        self.epoch = epoch
        self.now = 0.0

    def wall(self) -> float:
        return self.epoch + self.now

    def advance_to(self, t: float) -> None:
        if t < self.now:
            raise ValueError(f"simulated time cannot go back ({t} < {self.now})")
        self.now = t

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Within the block, time.time() and time.monotonic() read this clock."""
        real_time, real_monotonic = time.time, time.monotonic
        time.time = self.wall
        time.monotonic = self.wall
        try:
            yield
        finally:
            time.time, time.monotonic = real_time, real_monotonic
