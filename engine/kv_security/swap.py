"""Scheduler side of swapping a preempted request's KV to host memory and back.

Pure bookkeeping: which requests have host copies (sealed by the worker, see vault.py), how many
blocks the host holds against its capacity, and, on readmission, which of the request's new
blocks the worker fills from the copy instead of recomputing them. Only full blocks are copied;
the tail of a partial block is recomputed. A copy is used once: loaded on readmission, or dropped
when the request finishes first. A request whose copy cannot be loaded (the worker finds it
missing or its tag broken) is recomputed by vLLM from the first block that failed
(`kv_load_failure_policy=recompute`).

Which victims are swapped: every one whose full blocks fit in the host cache, or, with a
`SwapOrRecompute` rule, only those whose transfer out and back costs less than computing their
KV again (the benchmark's simulator gives it its step-time model; the engine has no cost model
for it yet and swaps whatever fits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from slaq.engine.kv_security.ownership import HeldBlocks


@dataclass(frozen=True, slots=True)
class SaveOrder:
    """Seal the request's blocks `block_ids[i]` (block i of the request) into host memory."""

    request_id: str
    tenant: str
    block_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LoadOrder:
    """Fill `block_ids[j]` with the sealed block `first_index + j` of the request."""

    request_id: str
    tenant: str
    first_index: int
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class SwapOrRecompute:
    """Swap a victim's KV when moving it to host memory and back is cheaper than recomputing it.

    `transfer_seconds(tokens)`: one direction over the host link; `recompute_seconds(tokens)`: the
    compute that positions 0..tokens cost again on readmission."""

    transfer_seconds: Callable[[int], float]
    recompute_seconds: Callable[[int], float]

    def swaps(self, tokens: int) -> bool:
        return 2 * self.transfer_seconds(tokens) < self.recompute_seconds(tokens)


NO_ROOM = "refused"  # nothing to save, or the host cache cannot hold it
CHEAPER_TO_RECOMPUTE = "recompute"


@dataclass
class SwapLedger:
    capacity_blocks: int
    block_size: int
    choice: SwapOrRecompute | None = None  # None: swap every victim that fits
    _copies: dict[str, tuple[str, int]] = field(default_factory=dict)  # request -> (tenant, full blocks copied)
    _queried: dict[str, int] = field(default_factory=dict)  # request -> local tokens it was asked about
    used_blocks: int = 0
    refusals: dict[str, int] = field(default_factory=dict)  # victims not swapped, by reason

    def preempted(self, request_id: str, held: HeldBlocks) -> SaveOrder | str:
        """A save order for the full blocks with KV, or why there is none (`NO_ROOM`: nothing to
        save or no room; `CHEAPER_TO_RECOMPUTE`: the choice rule prefers recomputing them)."""
        blocks = min(held.computed_tokens // self.block_size, len(held.blocks))
        refusal = None
        if blocks <= 0 or self.used_blocks + blocks > self.capacity_blocks:
            refusal = NO_ROOM
        elif self.choice is not None and not self.choice.swaps(blocks * self.block_size):
            refusal = CHEAPER_TO_RECOMPUTE
        if refusal is not None:
            self.refusals[refusal] = self.refusals.get(refusal, 0) + 1
            return refusal
        self.forget(request_id)
        self._copies[request_id] = (held.tenant, blocks)
        self.used_blocks += blocks
        return SaveOrder(request_id, held.tenant, tuple(held.blocks[:blocks]))

    def matched_tokens(self, request_id: str, num_computed: int, num_tokens: int) -> int:
        """Tokens past `num_computed` (block aligned) the host copy can provide; at least one token
        of the request is always left to compute."""
        copy = self._copies.get(request_id)
        if copy is None:
            return 0
        usable = min(copy[1], (num_tokens - 1) // self.block_size) * self.block_size
        if usable <= num_computed:
            return 0
        self._queried[request_id] = num_computed
        return usable - num_computed

    def allocated(self, request_id: str, block_ids: list[int], num_external: int) -> LoadOrder | None:
        """The load order once vLLM allocated the blocks for `num_external` tokens from the copy.
        The copy is consumed: whatever happens to the load, it is not offered again."""
        local = self._queried.pop(request_id, None)
        copy = self._copies.get(request_id)
        if local is None or copy is None or num_external <= 0:
            return None
        first = local // self.block_size
        last = (local + num_external) // self.block_size
        self._release(request_id)
        return LoadOrder(request_id, copy[0], first, tuple(block_ids[first:last]))

    def forget(self, request_id: str) -> bool:
        """The request no longer needs its copy (finished, or saved anew). True when it had one."""
        self._queried.pop(request_id, None)
        return self._release(request_id)

    def has_copy(self, request_id: str) -> bool:
        return request_id in self._copies

    def _release(self, request_id: str) -> bool:
        copy = self._copies.pop(request_id, None)
        if copy is None:
            return False
        self.used_blocks -= copy[1]
        return True
