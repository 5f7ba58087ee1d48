"""SwapOrRecompute: per victim, swap its KV out and back only when that costs less than recomputing it."""

from __future__ import annotations

from slaq.engine.kv_security.ownership import HeldBlocks
from slaq.engine.kv_security.swap import CHEAPER_TO_RECOMPUTE, NO_ROOM, SaveOrder, SwapLedger, SwapOrRecompute

BS = 4


def _rule(transfer_per_token: float, recompute_per_token: float, recompute_fixed: float = 0.0) -> SwapOrRecompute:
    return SwapOrRecompute(transfer_seconds=lambda n: n * transfer_per_token,
                           recompute_seconds=lambda n: recompute_fixed + n * recompute_per_token)


def test_the_rule_counts_the_transfer_both_ways_against_the_recompute() -> None:
    # 1 s one way per token: 2 s out and back against 3 s (swap) or 1.5 s (recompute) per token
    assert _rule(1.0, 3.0).swaps(8)
    assert not _rule(1.0, 1.5).swaps(8)
    # out and back exactly as dear as recomputing: no gain from swapping, so recompute
    assert not _rule(1.0, 2.0).swaps(8)
    # a fixed recompute cost makes short victims worth recomputing and long ones worth swapping
    rule = SwapOrRecompute(transfer_seconds=lambda n: 1.0 * n, recompute_seconds=lambda n: 0.01 * n * n)
    assert not rule.swaps(100) and rule.swaps(400)


def test_the_ledger_swaps_a_victim_only_when_the_rule_says_so_and_keeps_no_copy_otherwise() -> None:
    cheap = SwapLedger(capacity_blocks=8, block_size=BS, choice=_rule(1.0, 3.0))
    order = cheap.preempted("r1", HeldBlocks("acme", [5, 6, 7], 12))
    assert isinstance(order, SaveOrder) and order.block_ids == (5, 6, 7) and cheap.used_blocks == 3
    dear = SwapLedger(capacity_blocks=8, block_size=BS, choice=_rule(1.0, 1.5))
    assert dear.preempted("r1", HeldBlocks("acme", [5, 6, 7], 12)) == CHEAPER_TO_RECOMPUTE
    assert dear.used_blocks == 0 and not dear.has_copy("r1") and dear.matched_tokens("r1", 0, 13) == 0
    assert dear.refusals == {CHEAPER_TO_RECOMPUTE: 1} and cheap.refusals == {}


def test_the_rule_is_asked_about_the_full_blocks_only() -> None:
    asked: list[int] = []
    rule = SwapOrRecompute(transfer_seconds=lambda n: asked.append(n) or 0.0, recompute_seconds=lambda n: 1.0)
    SwapLedger(capacity_blocks=8, block_size=BS, choice=rule).preempted("r1", HeldBlocks("acme", [1, 2, 3], 10))
    assert asked == [8]  # 10 tokens: two full blocks of 4, the tail is recomputed anyway


def test_a_full_host_cache_means_recompute_however_cheap_the_transfer() -> None:
    ledger = SwapLedger(capacity_blocks=4, block_size=BS, choice=_rule(0.0, 1.0))
    assert isinstance(ledger.preempted("r1", HeldBlocks("acme", [1, 2, 3], 12)), SaveOrder)
    assert ledger.preempted("r2", HeldBlocks("bolt", [4, 5], 8)) == NO_ROOM  # 3 + 2 > 4
    assert ledger.refusals == {NO_ROOM: 1}
    assert ledger.forget("r1")  # r1 finished: its room is free again
    assert isinstance(ledger.preempted("r2", HeldBlocks("bolt", [4, 5], 8)), SaveOrder)
