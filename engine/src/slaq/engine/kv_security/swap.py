"""Scheduler side of swapping a preempted request's KV to host memory and back.

Pure bookkeeping: which requests have host copies (sealed by the worker, see vault.py), how many
blocks the host holds against its capacity, and, on readmission, which of the request's new
blocks the worker fills from the copy instead of recomputing them. Only full blocks are copied;
the tail of a partial block is recomputed. A copy is used once: loaded on readmission, or dropped
when the request finishes first. A request whose copy cannot be loaded (the worker finds it
missing or its tag broken) is recomputed by vLLM from the first block that failed
(`kv_load_failure_policy=recompute`).

Which victims are swapped: `SwapOrRecompute` decides, one rule for the engine and the benchmark's
simulator (both run the same connector and scheduler; the scheduler installs the rule at start,
`SLAScheduler._install_swap_rule` -> `SlaqKVConnector.use_step_model`). A victim is sealed only when sealing it and opening it again cost less than
computing its tokens again: seal and open at the measured host throughput (`seal_seconds_per_byte`:
the `hostSealGbS` setting, or measured with the worker's own `Vault` when the engine starts), against
the scheduler's own step-time model (`StepTimeModel.per_token_s`, learned online from the steps'
measured durations). A victim the host cache cannot hold is recomputed. `always=True` (the
`swapChoice: always` setting) swaps every victim that fits: for tests of the swap path on hardware
where the rule would recompute (an H200 behind a CPU that seals at ~1 GB/s).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from slaq.engine.kv_security.ownership import HeldBlocks
from slaq.engine.victim_price import recompute_seconds


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


class RecomputeModel(Protocol):
    """What the rule reads of the scheduler's step-time model (`tpot_budget.StepTimeModel`)."""

    per_token_s: float
    per_pair_s: float


@dataclass(frozen=True)
class SwapOrRecompute:
    """Swap a victim's KV when sealing it to host memory and opening it again costs less than
    recomputing it: 2 x tokens x `bytes_per_token` x `seal_seconds_per_byte` against recomputing them
    at the step-time model's per-token and attention-pair costs (`victim_price.recompute_seconds`, read
    at each decision: the model keeps learning)."""

    step_model: RecomputeModel
    bytes_per_token: float
    seal_seconds_per_byte: float  # one way (seal, or open), host link included where it was measured
    always: bool = False

    def transfer_seconds(self, tokens: int) -> float:
        return tokens * self.bytes_per_token * self.seal_seconds_per_byte

    def recompute_seconds(self, tokens: int) -> float:
        return recompute_seconds(self.step_model, tokens)

    def swaps(self, tokens: int) -> bool:
        return self.always or 2 * self.transfer_seconds(tokens) < self.recompute_seconds(tokens)

    @property
    def reason(self) -> str:
        return SWAP_ALWAYS if self.always else BY_COST


NO_ROOM = "refused"  # nothing to save, or the host cache cannot hold it
CHEAPER_TO_RECOMPUTE = "recompute"
# Why a victim was swapped or recomputed (slaq_engine_kv_swap_victims_total{reason}).
BY_COST = "cost"  # the rule compared the costs
SWAP_ALWAYS = "always"  # swapChoice: always
NO_RULE = "no_rule"  # no rule installed yet: recomputed (the scheduler installs one at start)
NO_HOST_CACHE = "no_host_cache"  # the connector runs for erase only (hostCacheBytes 0)


@dataclass
class SwapLedger:
    capacity_blocks: int
    block_size: int
    choice: SwapOrRecompute | None = None  # None: recompute every victim (NO_RULE)
    _copies: dict[str, tuple[str, int]] = field(default_factory=dict)  # request -> (tenant, full blocks copied)
    _queried: dict[str, int] = field(default_factory=dict)  # request -> local tokens it was asked about
    used_blocks: int = 0
    refusals: dict[str, int] = field(default_factory=dict)  # victims not swapped, by reason

    def preempted(self, request_id: str, held: HeldBlocks) -> SaveOrder | str:
        """A save order for the full blocks with KV, or why there is none (`NO_ROOM`: nothing to
        save or no room; `CHEAPER_TO_RECOMPUTE`: the rule prefers recomputing them, or there is no rule)."""
        blocks = min(held.computed_tokens // self.block_size, len(held.blocks))
        refusal = None
        if blocks <= 0 or self.used_blocks + blocks > self.capacity_blocks:
            refusal = NO_ROOM
        elif self.choice is None or not self.choice.swaps(blocks * self.block_size):
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
