"""Host-memory copies of preempted requests' KV blocks, sealed with AES-GCM under per-tenant keys.

Each tenant's 256-bit key is drawn from the OS when the tenant's first block is sealed and lives
only in this process's memory (never written, logged or sent anywhere): a restart forgets every
key and with them every host copy, which is what a cache should do. Each block is sealed alone,
with a fresh 96-bit nonce, and the associated data binds it to its tenant, request and position
in the request, so a ciphertext moved to another tenant, request or position fails its tag just
as a flipped byte does. `open` raises `SealBroken` then; the caller recomputes the block.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE_BYTES = 12
KEY_BITS = 256


class SealBroken(Exception):
    """A sealed block failed authentication (tampered, or sealed under another key or binding)."""


@dataclass(slots=True)
class SealedBlock:
    nonce: bytes
    ciphertext: bytearray  # mutable so a test can flip a byte where an attacker would


class KeyRing:
    """One AES-GCM key per tenant, created on first use, held in this process only."""

    def __init__(self) -> None:
        self._keys: dict[str, AESGCM] = {}

    def cipher(self, tenant: str) -> AESGCM:
        cipher = self._keys.get(tenant)
        if cipher is None:
            cipher = self._keys[tenant] = AESGCM(AESGCM.generate_key(bit_length=KEY_BITS))
        return cipher

    def forget(self, tenant: str) -> None:
        """Drop a tenant's key: whatever was sealed under it can no longer be opened."""
        self._keys.pop(tenant, None)


def _binding(tenant: str, request_id: str, index: int) -> bytes:
    return f"slaq-kv/v1\0{tenant}\0{request_id}\0{index}".encode("utf-8")


class Vault:
    """Sealed KV pages of preempted requests: request id -> block index -> sealed page."""

    def __init__(self, keys: KeyRing | None = None) -> None:
        self.keys = keys or KeyRing()
        self._store: dict[str, tuple[str, dict[int, SealedBlock]]] = {}

    def seal(self, tenant: str, request_id: str, index: int, page: bytes) -> None:
        nonce = os.urandom(NONCE_BYTES)
        ciphertext = self.keys.cipher(tenant).encrypt(nonce, page, _binding(tenant, request_id, index))
        self._store.setdefault(request_id, (tenant, {}))[1][index] = SealedBlock(nonce, bytearray(ciphertext))

    def open(self, tenant: str, request_id: str, index: int) -> bytes:
        """The page sealed at `index` for the request; SealBroken if it is missing or fails its tag."""
        entry = self._store.get(request_id)
        if entry is None or entry[0] != tenant or index not in entry[1]:
            raise SealBroken(f"no sealed block {index} of request {request_id} for tenant {tenant}")
        sealed = entry[1][index]
        try:
            return self.keys.cipher(tenant).decrypt(sealed.nonce, bytes(sealed.ciphertext), _binding(tenant, request_id, index))
        except InvalidTag as exc:
            raise SealBroken(f"block {index} of request {request_id} failed authentication") from exc

    def sealed(self, request_id: str) -> dict[int, SealedBlock]:
        entry = self._store.get(request_id)
        return entry[1] if entry is not None else {}

    def drop(self, request_id: str) -> None:
        self._store.pop(request_id, None)

    def __len__(self) -> int:
        return sum(len(blocks) for _, blocks in self._store.values())
