"""Tenants' API-key Secrets, watched: an in-memory view of their key hashes, kept current.

The operator never reads a key Secret per event. For each namespace that some TenantSLA's
`spec.apiKeySecretRef` names, it lists the namespace's Secrets once and then watches them
(`list` + `watch` on Secrets in that namespace: what rbac.secretNamespaces confines). A changed
Secret calls `on_change(namespace, name)` at once, so a rotated key reaches the tenant tables
within seconds. Only hashes are kept; the keys themselves are dropped on arrival.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slaq.api.table import hash_api_key
from slaq.operator.client import KubeClient

log = logging.getLogger("slaq.operator.keys")
RETRY_S = 2.0


@dataclass(frozen=True)
class KeySet:
    """One Secret's API keys as hashes, or the reason it gives none (`problem`)."""

    hashes: tuple[str, ...] = ()
    problem: str | None = None


def key_set(namespace: str, name: str, data: Mapping[str, str] | None) -> KeySet:
    """Every data entry of the Secret is one key (base64 UTF-8); blank entries are skipped."""
    where = f"Secret {namespace}/{name}"
    if data is None:
        return KeySet(problem=f"{where} (spec.apiKeySecretRef) not found")
    hashes, problem = set(), None
    for entry, value in sorted(data.items()):
        try:
            key = base64.b64decode(value, validate=True).decode("utf-8").strip()
        except (binascii.Error, ValueError):
            problem = f"{where}: data.{entry} is not base64 UTF-8"
            continue
        if key:
            hashes.add(hash_api_key(key))
    if not hashes and problem is None:
        problem = f"{where} holds no API keys"
    return KeySet(tuple(sorted(hashes)), problem)


OnChange = Callable[[str, str], Awaitable[None]]


class KeyWatch:
    """Key hashes of every Secret in the watched namespaces, by (namespace, name)."""

    def __init__(self, api: KubeClient, on_change: OnChange) -> None:
        self._api = api
        self._on_change = on_change
        self._sets: dict[tuple[str, str], KeySet] = {}
        self._ready: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def get(self, namespace: str, name: str) -> KeySet:
        return self._sets.get((namespace, name)) or key_set(namespace, name, None)

    async def ensure(self, namespace: str) -> None:
        """Start watching `namespace` (once) and return when its Secrets have been listed."""
        if namespace not in self._ready:
            self._ready[namespace] = asyncio.Event()
            self._tasks[namespace] = asyncio.create_task(self._follow(namespace), name=f"slaq-keys-{namespace}")
        await self._ready[namespace].wait()

    def _store(self, namespace: str, body: dict[str, Any], deleted: bool = False) -> bool:
        name = body["metadata"]["name"]
        new = key_set(namespace, name, None if deleted else (body.get("data") or {}))
        if self._sets.get((namespace, name)) == new:
            return False
        if deleted:
            self._sets.pop((namespace, name), None)
        else:
            self._sets[(namespace, name)] = new
        return True

    async def _follow(self, namespace: str) -> None:
        while True:
            try:
                for body in await self._api.list("secrets", namespace):
                    if self._store(namespace, body) and self._ready[namespace].is_set():
                        await self._on_change(namespace, body["metadata"]["name"])
                self._ready[namespace].set()
                async for event, body in self._api.watch("secrets", namespace):
                    if self._store(namespace, body, deleted=event == "DELETED"):
                        await self._on_change(namespace, body["metadata"]["name"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any one failure
                log.warning("watching Secrets in %s: %s; again in %.0f s", namespace, exc, RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()
