"""`TenantTurns`: one worker thread that runs its jobs a tenant at a time, in turn.

Each tenant's jobs wait in a line of their own, first in, first out; the worker takes the head of
the next tenant's line in turn (round robin over the tenants with jobs waiting; the tenant whose
job just ran goes after every tenant that came while it ran), so a tenant that submits many jobs
at once waits behind its own, and another tenant's job waits for at most one job of each tenant
ahead of it. The sidecar counts prompts admitted on their bound with it
(`SidecarCore._check_in_on_bound`): a tenant's burst of long prompts, each tens of milliseconds
of tokenizing, would otherwise keep every other tenant's settlement at its bound for as long.

The worker starts with the first job and is a daemon thread: a job left when the process ends
(a count nobody waits for) is dropped with it.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable


class TenantTurns:
    def __init__(self, thread_name: str, initializer: Callable[[], None] | None = None) -> None:
        self._thread_name = thread_name
        self._initializer = initializer
        self._lines: dict[str, deque[tuple[Future, Callable[..., Any], tuple]]] = {}  # tenants with jobs waiting
        self._turns: deque[str] = deque()  # those tenants, the next one first (the running job's tenant is not here)
        self._running: str | None = None
        self._changed = threading.Condition()
        self._worker: threading.Thread | None = None

    def submit(self, tenant: str, fn: Callable[..., Any], *args: Any) -> Future:
        """Run `fn(*args)` in `tenant`'s turn; its future has the result (or the exception)."""
        future: Future = Future()
        with self._changed:
            line = self._lines.get(tenant)
            if line is None:
                line = self._lines[tenant] = deque()
                if tenant != self._running:
                    self._turns.append(tenant)
            line.append((future, fn, args))
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name=self._thread_name, daemon=True)
                self._worker.start()
            self._changed.notify()
        return future

    def waiting(self, tenant: str) -> int:
        """Jobs of `tenant` not started yet."""
        with self._changed:
            return len(self._lines.get(tenant, ()))

    def _next(self) -> tuple[Future, Callable[..., Any], tuple]:
        with self._changed:
            while not self._turns:
                self._changed.wait()
            tenant = self._running = self._turns.popleft()
            line = self._lines[tenant]
            job = line.popleft()
            if not line:
                del self._lines[tenant]
            return job

    def _done(self) -> None:
        """The running job's tenant takes its next turn after every tenant that came meanwhile."""
        with self._changed:
            tenant, self._running = self._running, None
            if tenant in self._lines:
                self._turns.append(tenant)

    def _work(self) -> None:
        if self._initializer is not None:
            self._initializer()
        while True:
            future, fn, args = self._next()
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = fn(*args)
                    except BaseException as exc:  # the caller's to see, as an executor would hand it over
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                self._done()
