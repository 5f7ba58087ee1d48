"""One kind's objects in memory, kept current by a list and then a watch from the list's version.

The operator's view of pools, tenants and key Secrets (view.py, keys.py) is built from these:
one LIST when the operator starts (or after a watch fails), then only watch events, so nothing
is listed per event or per timer tick. `synced` is set once the first listing is stored: whoever
plans from the view waits for it, so a restarted operator never writes a table from a partial
picture of the cluster (a listing that fails is retried, and `last_error` says why). Every stored change calls `on_change(key, new, old)` (new None: gone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from slaq.operator.client import KubeClient

log = logging.getLogger("slaq.operator.informer")
RETRY_S = 2.0
# A watch that the server ends with 410 Gone (its resourceVersion compacted away) is restarted by
# lightkube from the current state, which replays what exists but not what was deleted meanwhile:
# listing again this often drops such leftovers (a LIST per half hour per kind, never per event).
RELIST_S = 1800.0

Value = TypeVar("Value")
OnChange = Callable[[str, "Value | None", "Value | None"], Awaitable[None]]
OnSynced = Callable[[str | None], Awaitable[None]]


def object_key(body: dict[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


class Informer(Generic[Value]):
    """`store[key]`: `transform(body)` of every object of `plural` (in `namespace`, or all)."""

    def __init__(self, api: KubeClient, plural: str, transform: Callable[[dict[str, Any]], Value], *,
                 namespace: str | None = None, on_change: OnChange[Value] | None = None,
                 on_synced: OnSynced | None = None, on_error: OnSynced | None = None) -> None:
        self._api = api
        self.plural, self.namespace = plural, namespace
        self._transform = transform
        self._on_change = on_change
        self._on_synced = on_synced  # called with the namespace once the first listing is stored
        self._on_error = on_error  # called with the namespace when the listing or watch fails for a new reason
        self.last_error: str | None = None  # why the last listing or watch failed (None: it did not)
        self.relist_s = RELIST_S
        self.store: dict[str, Value] = {}
        self.synced = asyncio.Event()
        self.tried = asyncio.Event()  # set once the first listing succeeded or failed: nothing waits longer
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._follow(), name=f"slaq-informer-{self.plural}-{self.namespace or 'all'}")

    async def _changed(self, key: str, new: Value | None) -> None:
        old = self.store.get(key)
        if new == old:
            return
        if new is None:
            self.store.pop(key, None)
        else:
            self.store[key] = new
        if self._on_change is not None and self.synced.is_set():
            await self._on_change(key, new, old)

    async def _follow(self) -> None:
        while True:
            try:
                items, version = await self._api.list_versioned(self.plural, self.namespace)
                listed = {object_key(body): body for body in items}
                for key in [k for k in self.store if k not in listed]:
                    await self._changed(key, None)
                for key, body in listed.items():
                    await self._changed(key, self._transform(body))
                self.last_error = None
                self.tried.set()
                if not self.synced.is_set():
                    self.synced.set()
                    if self._on_synced is not None:
                        await self._on_synced(self.namespace)
                async with asyncio.timeout(self.relist_s):
                    async for event, body in self._api.watch(self.plural, self.namespace, resource_version=version):
                        await self._changed(object_key(body), None if event == "DELETED" else self._transform(body))
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                continue  # time to list again (see RELIST_S)
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any one failure
                error, self.last_error = self.last_error, str(exc)
                self.tried.set()
                if self._on_error is not None and self.last_error != error:
                    await self._on_error(self.namespace)  # what reads last_error can say why now
                log.warning("watching %s in %s: %s; listing again in %.0f s", self.plural, self.namespace or "all namespaces", exc, RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
