"""The vault seals KV pages with AES-GCM per tenant and refuses anything tampered or misplaced;
KVBlockPages reads, writes and zeroes one scheduler block across layers."""

from __future__ import annotations

import pytest
import torch

from slaq.engine.kv_security.vault import SealBroken, Vault
from slaq.engine.kv_security.worker import KVBlockPages

PAGE = bytes(range(256)) * 8


def test_a_sealed_page_opens_to_the_same_bytes_and_is_not_stored_in_clear() -> None:
    vault = Vault()
    vault.seal("acme", "r1", 0, PAGE)
    stored = bytes(vault.sealed("r1")[0].ciphertext)
    assert PAGE[:64] not in stored and len(stored) == len(PAGE) + 16  # ciphertext plus the GCM tag
    assert vault.open("acme", "r1", 0) == PAGE


def test_a_flipped_byte_breaks_the_seal() -> None:
    vault = Vault()
    vault.seal("acme", "r1", 0, PAGE)
    vault.sealed("r1")[0].ciphertext[100] ^= 0x01
    with pytest.raises(SealBroken, match="failed authentication"):
        vault.open("acme", "r1", 0)


def test_a_page_opens_only_for_its_tenant_request_and_position() -> None:
    vault = Vault()
    vault.seal("acme", "r1", 0, PAGE)
    vault.seal("acme", "r1", 1, PAGE[::-1])
    with pytest.raises(SealBroken):
        vault.open("bolt", "r1", 0)  # another tenant
    # moving a ciphertext to another position fails its binding, not only its content check
    blocks = vault.sealed("r1")
    blocks[0], blocks[1] = blocks[1], blocks[0]
    with pytest.raises(SealBroken):
        vault.open("acme", "r1", 0)


def test_tenants_have_their_own_keys_and_a_forgotten_key_opens_nothing() -> None:
    vault = Vault()
    assert vault.keys.cipher("acme") is not vault.keys.cipher("bolt")
    vault.seal("acme", "r1", 0, PAGE)
    vault.keys.forget("acme")
    with pytest.raises(SealBroken):
        vault.open("acme", "r1", 0)


def test_dropped_copies_are_gone() -> None:
    vault = Vault()
    vault.seal("acme", "r1", 0, PAGE)
    assert len(vault) == 1
    vault.drop("r1")
    assert len(vault) == 0
    with pytest.raises(SealBroken, match="no sealed block"):
        vault.open("acme", "r1", 0)


def test_block_pages_span_kernel_rows_and_every_layer() -> None:
    # 4 scheduler blocks, 2 kernel rows each (the attention backend's block is half the scheduler's)
    layers = {f"layer{i}": torch.randn(8, 2, 16, 8) for i in range(2)}
    pages = KVBlockPages(layers, num_blocks=4)
    assert pages.rows == [2, 2]
    page = pages.read(1)
    assert pages.nonzero(1) == 2 * 2 * 2 * 16 * 8
    pages.erase([1])
    assert pages.nonzero(1) == 0
    assert all(torch.count_nonzero(t[2:4]) == 0 and torch.count_nonzero(t[0:2]) > 0 and torch.count_nonzero(t[4:]) > 0 for t in layers.values())
    pages.write(3, page)
    assert pages.read(3) == page


def test_block_pages_refuse_a_tensor_that_does_not_split_into_blocks() -> None:
    with pytest.raises(ValueError, match="does not split into 4 blocks"):
        KVBlockPages({"l": torch.zeros(6, 4)}, num_blocks=4)
