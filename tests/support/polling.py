"""Waiting for a state with a deadline (tests poll; they never sleep a fixed time)."""

from __future__ import annotations

import asyncio
from typing import Callable, TypeVar

T = TypeVar("T")


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
        except (AssertionError, KeyError, TypeError, IndexError) as exc:
            last = exc
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {last!r}")
        await asyncio.sleep(0.05)
