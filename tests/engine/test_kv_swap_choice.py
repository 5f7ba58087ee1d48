"""SwapOrRecompute: per victim, seal its KV to host memory and open it again only when that costs
less than recomputing it, priced by the scheduler's own step-time model (that the engine and the
simulator install the same rule: tests/bench/test_kv_swap.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from slaq.engine.kv_security.ownership import HeldBlocks
from slaq.engine.kv_security.swap import BY_COST, CHEAPER_TO_RECOMPUTE, NO_ROOM, SWAP_ALWAYS, SaveOrder, SwapLedger, SwapOrRecompute

BS = 4


@dataclass
class Model:
    per_token_s: float
    per_pair_s: float = 0.0


def _rule(seal_s_per_token: float, recompute_per_token: float, always: bool = False) -> SwapOrRecompute:
    return SwapOrRecompute(Model(recompute_per_token), bytes_per_token=1.0, seal_seconds_per_byte=seal_s_per_token, always=always)


def test_the_rule_counts_the_seal_and_the_open_against_the_recompute() -> None:
    # 1 s each way per token: 2 s out and back against 3 s (swap) or 1.5 s (recompute) per token
    assert _rule(1.0, 3.0).swaps(8)
    assert not _rule(1.0, 1.5).swaps(8)
    # out and back exactly as dear as recomputing: no gain from swapping, so recompute
    assert not _rule(1.0, 2.0).swaps(8)
    rule = SwapOrRecompute(Model(40e-6), bytes_per_token=131072, seal_seconds_per_byte=1 / 55e9)
    assert rule.transfer_seconds(1000) == pytest.approx(1000 * 131072 / 55e9) and rule.recompute_seconds(1000) == pytest.approx(0.04)
    assert rule.swaps(1000) and rule.reason == BY_COST
    # the measured H200 case: sealing at 1.26 GB/s against ~28 us of recompute per token
    assert not SwapOrRecompute(Model(28e-6), bytes_per_token=131072, seal_seconds_per_byte=1 / 1.26e9).swaps(1000)


def test_a_long_contexts_attention_makes_its_recompute_dearer_than_its_swap() -> None:
    # Sealing at 55 GB/s (no AES): 2.4 us per token each way. Per token alone recomputing is dearer only
    # above 4.8 us; with the attention pairs (1 ns each) a 100k context's recompute is 5 s more.
    linear = SwapOrRecompute(Model(4e-6), bytes_per_token=131072, seal_seconds_per_byte=1 / 55e9)
    assert not linear.swaps(100_000)
    with_pairs = SwapOrRecompute(Model(4e-6, 1e-9), bytes_per_token=131072, seal_seconds_per_byte=1 / 55e9)
    assert with_pairs.recompute_seconds(100_000) == pytest.approx(0.4 + 5.0)
    assert with_pairs.swaps(100_000) and not with_pairs.swaps(16)  # a short context's pairs change nothing


def test_the_rule_reads_the_step_model_as_it_learns() -> None:
    model = Model(3.0)
    rule = SwapOrRecompute(model, 1.0, 1.0)
    assert rule.swaps(8)
    model.per_token_s = 1.0  # the engine learned that tokens are cheaper than it thought
    assert not rule.swaps(8)


def test_always_swaps_whatever_the_costs_and_says_so() -> None:
    rule = _rule(1.0, 0.001, always=True)
    assert rule.swaps(8) and rule.reason == SWAP_ALWAYS


def test_the_ledger_swaps_a_victim_only_when_the_rule_says_so_and_keeps_no_copy_otherwise() -> None:
    cheap = SwapLedger(capacity_blocks=8, block_size=BS, choice=_rule(1.0, 3.0))
    order = cheap.preempted("r1", HeldBlocks("acme", [5, 6, 7], 12))
    assert isinstance(order, SaveOrder) and order.block_ids == (5, 6, 7) and cheap.used_blocks == 3
    dear = SwapLedger(capacity_blocks=8, block_size=BS, choice=_rule(1.0, 1.5))
    assert dear.preempted("r1", HeldBlocks("acme", [5, 6, 7], 12)) == CHEAPER_TO_RECOMPUTE
    assert dear.used_blocks == 0 and not dear.has_copy("r1") and dear.matched_tokens("r1", 0, 13) == 0
    assert dear.refusals == {CHEAPER_TO_RECOMPUTE: 1} and cheap.refusals == {}


def test_a_ledger_without_a_rule_recomputes() -> None:
    ledger = SwapLedger(capacity_blocks=8, block_size=BS)
    assert ledger.preempted("r1", HeldBlocks("acme", [5, 6, 7], 12)) == CHEAPER_TO_RECOMPUTE and ledger.used_blocks == 0


def test_the_rule_is_asked_about_the_full_blocks_only() -> None:
    asked: list[int] = []

    class Asking(SwapOrRecompute):
        def swaps(self, tokens: int) -> bool:
            asked.append(tokens)
            return True

    SwapLedger(capacity_blocks=8, block_size=BS, choice=Asking(Model(1.0), 1.0, 1.0)).preempted("r1", HeldBlocks("acme", [1, 2, 3], 10))
    assert asked == [8]  # 10 tokens: two full blocks of 4, the tail is recomputed anyway


def test_a_full_host_cache_means_recompute_however_cheap_the_transfer() -> None:
    ledger = SwapLedger(capacity_blocks=4, block_size=BS, choice=_rule(0.0, 1.0))
    assert isinstance(ledger.preempted("r1", HeldBlocks("acme", [1, 2, 3], 12)), SaveOrder)
    assert ledger.preempted("r2", HeldBlocks("bolt", [4, 5], 8)) == NO_ROOM  # 3 + 2 > 4
    assert ledger.refusals == {NO_ROOM: 1}
    assert ledger.forget("r1")  # r1 finished: its room is free again
    assert isinstance(ledger.preempted("r2", HeldBlocks("bolt", [4, 5], 8)), SaveOrder)
