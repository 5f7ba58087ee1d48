"""Tenants' API-key Secrets, watched: an in-memory view of their key hashes, kept current.

The operator never reads a key Secret per event. For each namespace that some TenantSLA's
`spec.apiKeySecretRef` names (and the operator may read: `--key-secret-namespaces`, the chart's
rbac.secretNamespaces), it lists the namespace's Secrets once and then watches them (informer.py).
A changed Secret calls `on_change(namespace, name)` at once, so a rotated key reaches the tenant
tables within seconds; a namespace whose first listing completes, or whose listing fails for a
new reason, calls `on_synced(namespace)` (its tenants' status can say so).
Nothing here waits for a listing: a namespace not listed yet (or that the operator may not
list) is a problem the tenant's status names, never a wait. Only hashes are kept (HMAC-SHA256
under the key-hash key, slaq.api.table); the keys themselves are dropped on arrival, and a key
too weak to be one is refused by name of its data entry.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from slaq.api.common import GROUP
from slaq.operator.client import KubeClient
from slaq.operator.informer import Informer

TENANT_LABEL = f"{GROUP}/tenant"  # on a key Secret: the one TenantSLA whose keys it holds
MIN_KEY_CHARS = 24
MIN_KEY_DISTINCT_CHARS = 12


@dataclass(frozen=True)
class KeySet:
    """One Secret's API keys as hashes, the tenant it is labelled for, and the reason it gives
    none or fewer than it holds (`problem`, with the condition `reason`)."""

    hashes: tuple[str, ...] = ()
    tenant: str | None = None  # the Secret's TENANT_LABEL
    problem: str | None = None
    reason: str = "KeysMissing"


def key_weakness(key: str) -> str | None:
    """Why `key` is too weak to be an API key (None: strong enough). A floor against typed
    passwords and placeholders, not a measure of randomness: generate keys (operator/README.md)."""
    if len(key) < MIN_KEY_CHARS:
        return f"shorter than {MIN_KEY_CHARS} characters"
    if len(set(key)) < MIN_KEY_DISTINCT_CHARS:
        return f"fewer than {MIN_KEY_DISTINCT_CHARS} distinct characters"
    return None


def key_set(namespace: str, name: str, data: Mapping[str, str] | None, hash_key: Callable[[str], str],
            labels: Mapping[str, str] | None = None) -> KeySet:
    """Every data entry of the Secret is one key (base64 UTF-8); blank entries are skipped, and
    entries that are not base64 UTF-8 or too weak are refused by name."""
    where = f"Secret {namespace}/{name}"
    if data is None:
        return KeySet(problem=f"{where} (spec.apiKeySecretRef) not found")
    hashes, refused, reason = set(), [], "KeysMissing"
    for entry, value in sorted(data.items()):
        try:
            key = base64.b64decode(value, validate=True).decode("utf-8").strip()
        except (binascii.Error, ValueError):
            refused.append(f"data.{entry} is not base64 UTF-8")
            continue
        if not key:
            continue
        if (weakness := key_weakness(key)) is not None:
            refused.append(f"data.{entry} is {weakness}")
            reason = "WeakKey"
            continue
        hashes.add(hash_key(key))
    tenant = (labels or {}).get(TENANT_LABEL)
    if refused:
        return KeySet(tuple(sorted(hashes)), tenant, f"{where}: {'; '.join(refused)} (refused; use random keys of "
                      f"{MIN_KEY_CHARS}+ characters, e.g. `openssl rand -base64 32`)", reason)
    if not hashes:
        return KeySet((), tenant, f"{where} holds no API keys")
    return KeySet(tuple(sorted(hashes)), tenant)


OnChange = Callable[[str, str], Awaitable[None]]
OnSynced = Callable[[str], Awaitable[None]]


class KeyWatch:
    """Key hashes of every Secret in the watched namespaces, by (namespace, name): one informer
    (informer.py) per namespace, keeping only the hashes. `hash_key` hashes one key."""

    def __init__(self, api: KubeClient, on_change: OnChange, hash_key: Callable[[str], str],
                 on_synced: OnSynced | None = None) -> None:
        self._api = api
        self._on_change = on_change
        self._on_synced = on_synced
        self._hash_key = hash_key
        self._informers: dict[str, Informer[KeySet]] = {}

    def get(self, namespace: str, name: str) -> KeySet:
        """The Secret's keys; a namespace not listed yet gives a KeysUnavailable problem that says why."""
        informer = self._informers.get(namespace)
        if informer is None or not informer.synced.is_set():
            error = informer.last_error if informer is not None else None
            return KeySet(problem=f"the Secrets of namespace {namespace} are not listed yet"
                          + (f" ({error}): the operator needs list and watch on Secrets there (chart: rbac.secretNamespaces)" if error else ""),
                          reason="KeysUnavailable")
        found = informer.store.get(f"{namespace}/{name}")
        return found or key_set(namespace, name, None, self._hash_key)

    def start(self, namespace: str) -> Informer[KeySet]:
        """Start watching `namespace` (once); returns its informer without waiting for the listing."""
        if namespace not in self._informers:
            self._informers[namespace] = Informer(
                self._api, "secrets", lambda body: key_set(namespace, body["metadata"]["name"], body.get("data") or {}, self._hash_key,
                                                           (body.get("metadata") or {}).get("labels")),
                namespace=namespace, on_change=self._changed, on_synced=self._synced, on_error=self._synced)
            self._informers[namespace].start()
        return self._informers[namespace]

    async def start_and_wait(self, namespaces: Iterable[str], timeout_s: float) -> None:
        """Start watching `namespaces`, and wait until each has been listed once or failed to be
        (or `timeout_s` passed): what cannot be listed is then a problem to report, not a wait."""
        tried = [asyncio.ensure_future(self.start(namespace).tried.wait()) for namespace in namespaces]
        if tried:
            await asyncio.wait(tried, timeout=timeout_s)

    def watching(self, namespace: str) -> bool:
        """Whether `namespace` is watched (listed, or still trying to list)."""
        return namespace in self._informers

    async def _changed(self, key: str, new: KeySet | None, old: KeySet | None) -> None:
        namespace, name = key.split("/", 1)
        await self._on_change(namespace, name)

    async def _synced(self, namespace: str | None) -> None:
        if self._on_synced is not None and namespace is not None:
            await self._on_synced(namespace)

    async def close(self) -> None:
        for informer in self._informers.values():
            await informer.close()
