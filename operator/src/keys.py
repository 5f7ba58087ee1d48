"""Tenants' API-key Secrets, watched: an in-memory view of their key hashes, kept current.

The operator never reads a key Secret per event. For each namespace that some TenantSLA's
`spec.apiKeySecretRef` names, it lists the namespace's Secrets once and then watches them
(`list` + `watch` on Secrets in that namespace, informer.py: what rbac.secretNamespaces confines). A changed
Secret calls `on_change(namespace, name)` at once, so a rotated key reaches the tenant tables
within seconds. Only hashes are kept; the keys themselves are dropped on arrival.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from slaq.api.table import hash_api_key
from slaq.operator.client import KubeClient
from slaq.operator.informer import Informer


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
    """Key hashes of every Secret in the watched namespaces, by (namespace, name): one informer
    (informer.py) per namespace, keeping only the hashes."""

    def __init__(self, api: KubeClient, on_change: OnChange) -> None:
        self._api = api
        self._on_change = on_change
        self._informers: dict[str, Informer[KeySet]] = {}

    def get(self, namespace: str, name: str) -> KeySet:
        informer = self._informers.get(namespace)
        found = informer.store.get(f"{namespace}/{name}") if informer is not None else None
        return found or key_set(namespace, name, None)

    async def ensure(self, namespace: str) -> None:
        """Start watching `namespace` (once) and return when its Secrets have been listed."""
        if namespace not in self._informers:
            self._informers[namespace] = Informer(
                self._api, "secrets", lambda body: key_set(namespace, body["metadata"]["name"], body.get("data") or {}),
                namespace=namespace, on_change=self._changed)
            self._informers[namespace].start()
        await self._informers[namespace].synced.wait()

    async def _changed(self, key: str, new: KeySet | None, old: KeySet | None) -> None:
        namespace, name = key.split("/", 1)
        await self._on_change(namespace, name)

    async def close(self) -> None:
        for informer in self._informers.values():
            await informer.close()
