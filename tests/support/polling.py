"""Waiting for a state with a deadline (tests poll; they never sleep a fixed time)."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, TypeVar

import httpx

T = TypeVar("T")
# What a check may raise while the state it waits for is not there yet (it is retried).
NOT_YET = (AssertionError, KeyError, TypeError, IndexError, httpx.HTTPError)


def wait_for(check: Callable[[], T | None], timeout_s: float = 10.0, what: str = "condition", poll_s: float = 0.05) -> T:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout_s`
    (blocking: for test code outside an event loop)."""
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
        time.sleep(poll_s)


async def eventually(check: Callable[[], T], timeout: float = 15.0, what: str = "condition") -> T:
    """Poll `check` until it returns something truthy without raising; fail after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except NOT_YET as exc:
            last = exc
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {last!r}")
        await asyncio.sleep(0.05)
