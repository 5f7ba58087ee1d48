"""BlockOwnership and SwapLedger: which blocks are zeroed, sealed and restored, without vLLM."""

from __future__ import annotations

from slaq.engine.kv_security.ownership import (
    REASON_FREE,
    REASON_REUSE,
    REASON_SALT_CHANGED,
    REASON_TENANT_REMOVED,
    BlockOwnership,
    HeldBlocks,
)
from slaq.engine.kv_security.swap import NO_ROOM, SaveOrder, SwapLedger, SwapOrRecompute
from slaq.engine.tpot_budget import StepTimeModel

BS = 4

SWAP_EVERY_VICTIM = SwapOrRecompute(StepTimeModel(), bytes_per_token=1.0, seal_seconds_per_byte=1.0, always=True)


def test_a_block_handed_to_another_tenant_is_erased_and_one_handed_back_to_its_writer_is_not() -> None:
    own = BlockOwnership(10, BS)
    own.scheduled("a1", "acme", [1, 2, 3], 0, 12, replaces=True)
    assert own.take_erase_orders() == {}  # never written before: nothing to erase
    own.released("a1")
    own.scheduled("b1", "bolt", [3, 4], 0, 8, replaces=True)  # 3 held acme's data
    own.scheduled("a2", "acme", [2], 0, 4, replaces=True)  # 2 goes back to acme
    assert own.take_erase_orders() == {3: REASON_REUSE}
    assert [(r.block_id, r.previous_tenant, r.tenant) for r in own.take_reassignments()] == [(3, "acme", "bolt")]
    assert own.owner(3) == "bolt" and own.owner(2) == "acme"
    assert own.take_erase_orders() == {}  # orders are taken once


def test_prefix_hits_are_read_not_written_so_never_erased() -> None:
    own = BlockOwnership(10, BS)
    own.scheduled("a1", "acme", [1, 2], 0, 8, replaces=True)
    # a tenant of the same prefix-cache group hits block 1 (4 computed tokens) and writes block 5
    own.scheduled("g1", "group-mate", [1, 5], 4, 4, replaces=True)
    assert own.take_erase_orders() == {}
    assert own.owner(1) == "acme"
    # a hit ending inside a block (6 tokens: blocks 1 and 2 hold computed tokens) reads both
    own.scheduled("g2", "group-mate", [1, 2, 6], 6, 4, replaces=True)
    assert own.take_erase_orders() == {}


def test_appended_blocks_are_written_and_the_computed_count_follows_the_steps() -> None:
    own = BlockOwnership(10, BS)
    own.scheduled("b1", "bolt", [7], 0, 4, replaces=True)
    own.released("b1")
    own.scheduled("a1", "acme", [1], 0, 4, replaces=True)
    own.scheduled("a1", "acme", [7], 4, 1, replaces=False)
    assert own.take_erase_orders() == {7: REASON_REUSE}
    assert own.held("a1") == HeldBlocks("acme", [1, 7], 5)


def test_negative_control_switch_records_reassignments_but_orders_no_erase() -> None:
    own = BlockOwnership(10, BS, erase_on_reuse=False)
    own.scheduled("a1", "acme", [3], 0, 4, replaces=True)
    own.released("a1")
    own.scheduled("b1", "bolt", [3], 0, 4, replaces=True)
    assert own.take_erase_orders() == {}
    assert len(own.take_reassignments()) == 1


def test_on_free_tenant_blocks_are_erased_and_evicted_when_their_last_holder_frees_them() -> None:
    own = BlockOwnership(10, BS)
    own.erase_when_freed = {"vault-co"}
    own.scheduled("v1", "vault-co", [1, 2], 0, 8, replaces=True)
    own.scheduled("v2", "vault-co", [1, 3], 4, 4, replaces=True)  # shares block 1
    own.released("v1")
    assert own.take_erase_orders() == {2: REASON_FREE}  # block 1 is still read by v2
    own.released("v2")
    assert own.take_erase_orders() == {1: REASON_FREE, 3: REASON_FREE}
    assert own.take_evictions() == {1, 2, 3}
    assert own.owner(1) is None  # nothing left to protect: the next tenant needs no second erase
    own.scheduled("b1", "bolt", [1], 0, 4, replaces=True)
    assert own.take_erase_orders() == {}


def test_each_request_is_told_the_blocks_erased_for_it() -> None:
    """The counts the engine's audit line carries (request_log.py): reuse when it is scheduled onto
    another tenant's blocks, free when an onFree tenant's request lets its blocks go."""
    own = BlockOwnership(10, BS)
    own.erase_when_freed = {"vault-co"}
    assert own.scheduled("v1", "vault-co", [1, 2], 0, 8, replaces=True) == 0
    assert own.released("v1").erased == {REASON_FREE: 2}
    assert own.scheduled("a1", "acme", [3, 4], 0, 8, replaces=True) == 0
    assert own.released("a1").erased == {}  # an onReuse tenant's release erases nothing
    assert own.scheduled("b1", "bolt", [3], 0, 4, replaces=True) == 1  # acme's block
    assert own.scheduled("b1", "bolt", [4], 4, 1, replaces=False) == 1
    assert own.scheduled("b2", "bolt", [1], 0, 4, replaces=True) == 0  # zeroed when vault-co freed it: no second erase
    assert own.take_erase_orders() == {1: REASON_FREE, 2: REASON_FREE, 3: REASON_REUSE, 4: REASON_REUSE}


def test_retiring_a_tenant_erases_free_blocks_now_and_held_ones_when_freed() -> None:
    own = BlockOwnership(10, BS)
    own.scheduled("a1", "acme", [1, 2], 0, 8, replaces=True)
    own.released("a1")
    own.scheduled("a2", "acme", [4], 0, 4, replaces=True)
    assert own.retire("acme", REASON_TENANT_REMOVED) == 3
    assert own.take_erase_orders() == {1: REASON_TENANT_REMOVED, 2: REASON_TENANT_REMOVED}
    assert own.take_evictions() == {1, 2, 4}  # block 4 leaves the prefix cache at once, even while held
    own.released("a2")
    assert own.take_erase_orders() == {4: REASON_TENANT_REMOVED}
    own.scheduled("c1", "corp", [5], 0, 4, replaces=True)
    own.released("c1")
    own.retire("corp", REASON_SALT_CHANGED)
    assert own.take_erase_orders() == {5: REASON_SALT_CHANGED}


def test_swap_ledger_saves_full_blocks_restores_once_and_respects_capacity() -> None:
    ledger = SwapLedger(capacity_blocks=4, block_size=BS, choice=SWAP_EVERY_VICTIM)
    order = ledger.preempted("r1", HeldBlocks("acme", [5, 6, 7], 10))  # 10 tokens: 2 full blocks
    assert isinstance(order, SaveOrder) and order.block_ids == (5, 6) and ledger.used_blocks == 2
    assert ledger.preempted("r2", HeldBlocks("bolt", [1, 2, 3], 12)) == NO_ROOM  # 2 + 3 > 4: recompute
    # readmitted with 13 tokens, 4 of them a local prefix hit: the copy supplies tokens 4..7
    assert ledger.matched_tokens("r1", 4, 13) == 4
    load = ledger.allocated("r1", [9, 8, 3], 4)
    assert load is not None and (load.tenant, load.first_index, load.block_ids) == ("acme", 1, (8,))
    assert ledger.used_blocks == 0 and not ledger.has_copy("r1")
    assert ledger.matched_tokens("r1", 0, 13) == 0  # used once


def test_swap_ledger_always_leaves_a_token_to_compute_and_forgets_finished_requests() -> None:
    ledger = SwapLedger(capacity_blocks=8, block_size=BS, choice=SWAP_EVERY_VICTIM)
    ledger.preempted("r1", HeldBlocks("acme", [1, 2], 8))
    assert ledger.matched_tokens("r1", 0, 8) == 4  # 8 tokens in all: the last block is recomputed
    assert ledger.forget("r1") and ledger.used_blocks == 0
    assert not ledger.forget("r1")
