"""The cache-salt key: the secret every tenant's cache salt and every key hash derives from,
kept in a Secret of the operator's own namespace (made on first start)."""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
from typing import Any

from slaq.api.table import derive_key_hash_key, hash_api_key
from slaq.operator.client import KubeClient
from slaq.operator.errors import OperatorError, RetryableApiError
from slaq.operator.names import MANAGER, SALT_SECRET_KEY, SALT_SECRET_NAME

log = logging.getLogger("slaq.operator")
SALT_KEY_BYTES = 32


def render_salt_secret(namespace: str, key: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": SALT_SECRET_NAME, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "slaq", "app.kubernetes.io/managed-by": MANAGER}},
        "data": {SALT_SECRET_KEY: base64.b64encode(key).decode("ascii")},
    }


async def read_salt_key(api: KubeClient, namespace: str) -> bytes:
    """Read the key, or create it (another operator starting at once may win the race)."""
    secret = await api.get("secrets", SALT_SECRET_NAME, namespace)
    if secret is None:
        try:
            secret = await api.create(render_salt_secret(namespace, secrets.token_bytes(SALT_KEY_BYTES)))
            log.info("created the cache-salt key Secret %s/%s", namespace, SALT_SECRET_NAME)
        except RetryableApiError as exc:
            if exc.status != 409:
                raise
            secret = await api.get("secrets", SALT_SECRET_NAME, namespace)  # another start won the race
    try:
        key = base64.b64decode((secret or {}).get("data", {}).get(SALT_SECRET_KEY, ""), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) < 16:
        raise OperatorError(f"Secret {namespace}/{SALT_SECRET_NAME}: data.{SALT_SECRET_KEY} must hold at least "
                            "16 random bytes; delete the Secret to have a new key generated (cache salts will change)")
    return key


class SaltKey:
    """The cache-salt key once read, and the key-hash key derived from it (API keys are hashed with it)."""

    def __init__(self, api: KubeClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.key: bytes | None = None
        self.hash_key: bytes | None = None

    async def ensure(self) -> bytes:
        """The key: read (or created) on the first call."""
        if self.key is None:
            key = await read_salt_key(self.api, self.namespace)
            self.key, self.hash_key = key, derive_key_hash_key(key)
        return self.key

    def hash_api_key(self, key: str) -> str:
        if self.hash_key is None:
            raise OperatorError("API keys are hashed only once the cache-salt key is read (ensure_salt_key)")
        return hash_api_key(key, self.hash_key)
