"""Waiting for a state with a deadline (tests poll; they never sleep a fixed time)."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Generator, TypeVar

import httpx

T = TypeVar("T")
# What a check may raise while the state it waits for is not there yet (it is retried).
NOT_YET = (AssertionError, KeyError, TypeError, IndexError, httpx.HTTPError)


def _attempts(check: Callable[[], T | None], timeout_s: float, what: str) -> Generator[None, None, T]:
    """The polling policy both waits share: call `check` until it returns something truthy,
    retrying what NOT_YET lists; yields between attempts (the caller sleeps) and returns the
    result, or fails naming `what` and the last error once `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except NOT_YET as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last error: {last!r})")
        yield


def wait_for(check: Callable[[], T | None], timeout_s: float = 10.0, what: str = "condition", poll_s: float = 0.05) -> T:
    """Poll `check` until it returns something truthy (blocking: for test code outside an event loop)."""
    attempts = _attempts(check, timeout_s, what)
    while True:
        try:
            next(attempts)
        except StopIteration as done:
            return done.value
        time.sleep(poll_s)


async def eventually(check: Callable[[], T], timeout: float = 15.0, what: str = "condition") -> T:
    """Poll `check` until it returns something truthy without raising (inside an event loop)."""
    attempts = _attempts(check, timeout, what)
    while True:
        try:
            next(attempts)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(0.05)
