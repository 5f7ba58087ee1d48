"""A circuit breaker: stop calling a dependency that keeps failing, and probe it now and then.

    closed ──(failure_threshold failures in a row)──▶ open
    open ──(reset_after_s passed)──▶ half_open: one call goes through as a probe
    half_open ──probe succeeds──▶ closed;  ──probe fails──▶ open (for another reset_after_s)

The caller asks `allow()` before each call and reports `succeeded()` or `failed()` after it,
or `abandoned()` when the call ended with no outcome (its task was cancelled: a client that
disconnected); a refused call is the caller's cue to use its fallback. One event loop, no locks.
"""

from __future__ import annotations

import enum
import time
from typing import Callable


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, *, failure_threshold: int = 2, reset_after_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        if reset_after_s <= 0:
            raise ValueError(f"reset_after_s must be > 0, got {reset_after_s}")
        self.failure_threshold = failure_threshold
        self.reset_after_s = reset_after_s
        self.clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False
        self.openings = 0  # times it opened (closed or half-open → open)

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._probing or self.clock() - self._opened_at >= self.reset_after_s:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def allow(self) -> bool:
        """True: make the call (and report its outcome). In half-open, only one call at a time."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def succeeded(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._probing = False

    def abandoned(self) -> None:
        """The call allowed last ended with no outcome (cancelled). Nothing is counted; a probe's
        place is free again, so the next call probes: left taken, the breaker would stay
        half-open and refuse every call for good."""
        self._probing = False

    def failed(self) -> None:
        self._failures += 1
        if self._probing or (self._opened_at is None and self._failures >= self.failure_threshold):
            self.openings += 1
            self._opened_at = self.clock()
        self._probing = False
