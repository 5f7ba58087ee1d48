"""KV block budget: headroom for the critical tier, per-tenant caps, lower tiers' prefixes evicted first.

`SLABlockManager` is vLLM's `KVCacheManager` with its block pool and coordinator (adopted in
place, see `vllm_compat.adopt_block_manager`), plus a `BlockBudgetRule` consulted before every
allocation. It overrides no vLLM method itself: `vllm_compat.kv_cache_manager.BudgetedKVCacheManager`
does, in vLLM's signatures, and calls the hooks here (`slaq_allocate_slots`, `slaq_free`,
`slaq_pop_blocks_for_free`), which reach vLLM's own allocation and release through it.

- Headroom: `critical_kv_headroom` of all blocks is the critical tier's reserve. A request below
  the critical tier may not take blocks that would leave free less of it than the critical tier
  is not already using (`headroom_left`: the reserve less the blocks critical requests hold; a
  free reserve on top of what critical requests hold would keep twice the reserve from the other
  tiers) when it is admitted: its whole prompt (every token it has still to compute, not just the
  step's first chunk) must fit beside the reserve. Once admitted, its later prefill chunks and its
  decodes may grow into the headroom (one block per `block_size` tokens): refusing a running
  request's chunk makes vLLM's running loop preempt, and the victim (the latest arrival, often the
  request itself) loses every chunk it computed, to be admitted again as soon as the reserve is
  whole, where the next chunk is refused again. Holding chunks to the reserve ran KV-bound pods
  (4,000-token prompts in budget-sized chunks, one tier: `slaq bench cluster --workload wva-ramp
  --signals static`) into that loop, and eight slaq pods served less of the ramp than eight stock
  vLLM pods (docs/decisions/0026-a-prompt-is-admitted-whole.md); pricing the whole prompt at
  admission keeps what a lower tier can take from the reserve to its decodes' growth and the
  chunks of prompts already admitted. A critical arrival that then finds the headroom short
  preempts a lower tier for it (engine/src/slaq/engine/preemption.py), or waits when blocks free
  up in time.
- Tenant caps: a tenant whose KV share is below 1 is admitted only while the blocks reserved for
  its running requests (prompt + max_tokens each, capped at max_model_len) fit in its share, so
  growth can never exceed the cap and no other tenant is preempted to make it fit. A single
  request larger than the cap runs when the tenant holds nothing else.
- Eviction: cached prefix blocks freed by batch-tier requests are evicted before any other tier's
  cached prefixes, and not before eviction is needed. While the pool has at least a step's worth
  of free blocks that cache nothing (`vllm_compat.cached_free_floor`, a lower bound), they stay in
  vLLM's LRU order and are only noted; once it has less, the noted ones still cached move to the
  front of the free queue (`promote_evict_first`, once per step), and from then on batch-tier
  prefixes go to the front as they are freed. Moving them at once would throw away the batch
  tier's prefix cache while blocks that cache nothing are still free.
- Prefix reuse is counted per tenant and tier when a request is admitted.

`admission_refusal` answers, before vLLM's waiting loop tries a request, whether its allocation
would be refused and why; the waiting queue uses it to skip a request refused for a reason of its
own (tenant cap, headroom) and to backfill past one that does not fit (see engine/src/slaq/engine/queue.py).
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Callable, Iterator, Mapping, Sequence

from slaq.api.common import Tier
from slaq.engine.sla import TIER_NAMES, RequestInfo
from slaq.engine import vllm_compat as vc
from slaq.engine.finishers import SoonestFinishers
from slaq.engine.vllm_compat import Request
from slaq.engine.vllm_compat.kv_cache_manager import BudgetedKVCacheManager, VllmArgs

TIERS = tuple(Tier)
REFUSED_TENANT_CAP, REFUSED_HEADROOM, REFUSED_KV_FULL = "tenant_cap", "headroom", "kv_full"
EVICT_FIRST_RANK = Tier.BATCH.rank


OutputLeft = Callable[[Request], int]  # decode steps a running request is planned to have left


def max_tokens_left(request: Request) -> int:
    return max(1, vc.max_tokens(request) - vc.output_tokens(request))


_PLANNED_OUTPUT = operator.attrgetter("planned_output")


class PlannedOutputLeft:
    """Steps left on the scheduler's plan (`RequestInfo.planned_output`, see output_plan.py), at least 1."""

    def __init__(self, info_of: Callable[[Request], RequestInfo]) -> None:
        self._info_of = info_of

    def __call__(self, request: Request) -> int:
        return max(1, self.unfloored_one(request))

    def unfloored_one(self, request: Request) -> int:
        """The request's planned output less what it delivered, before the floor of 1 (`SoonestFinishers` keys on it)."""
        return self._info_of(request).planned_output - vc.output_tokens(request)

    def unfloored(self, running: Sequence[Request]) -> Iterator[int]:
        """Each request's planned output less what it delivered, before the floor of 1, for a whole
        batch in C-speed maps (no Python frame per request: `RoomForecast` reads every running request)."""
        return map(operator.sub, map(_PLANNED_OUTPUT, map(self._info_of, running)), vc.output_token_counts(running))


def steps_until_room(running: Sequence[Request], block_size: int, need_blocks: int, free_blocks: int,
                     free_slots: int = 1, output_left: OutputLeft = max_tokens_left) -> float:
    """Steps until running requests finishing on their own, soonest first, leave a slot and
    `need_blocks` blocks free (inf: never). Their steps are `output_left` (by default `max_tokens`
    left, an upper bound; the scheduler's plan, `PlannedOutputLeft`)."""
    return RoomForecast(running, block_size, output_left).steps_until(need_blocks, free_blocks, free_slots)


class RoomForecast:
    """`steps_until_room` for several questions about one running batch. Each request's steps left
    are read once, when a question first needs them; the batch is sorted by when its requests
    finish (O(batch) Python) only for a question short of blocks: one short of slots alone (a full
    batch, blocks to spare: every step of a backlog with an urgent request waiting) is answered by
    the soonest finishers' steps, sorted in C, or, given `soonest` (the k-th smallest steps left
    before the floor of 1, None when fewer than k run: `SoonestFinishers.kth_steps_left`, kept
    across steps for the same plan as `output_left`), without reading the batch at all."""

    def __init__(self, running: Sequence[Request], block_size: int, output_left: OutputLeft = max_tokens_left,
                 soonest: Callable[[int], int | None] | None = None) -> None:
        self._running, self._block_size, self._output_left, self._kth = running, block_size, output_left, soonest
        self._steps: list[int] | None = None  # steps left, in batch order (before the floor of 1)
        self._soonest: list[int] | None = None  # the same, soonest first
        self._finishing: list[tuple[int, int]] | None = None  # (steps left, blocks held), soonest first

    def steps_until(self, need_blocks: int, free_blocks: int, free_slots: int = 1) -> float:
        if free_slots >= 1 and free_blocks >= need_blocks:
            return 0
        if free_blocks >= need_blocks and self._kth is not None:  # only slots are short, and the soonest finishers are kept
            steps = self._kth(1 - free_slots)
            return math.inf if steps is None else max(1, steps)
        if self._steps is None:
            output_left = self._output_left
            # The plan's steps before their floor of 1, which is applied on the way out: the requests
            # at 1 or below come first either way, so every answer is the same.
            self._steps = list(output_left.unfloored(self._running) if isinstance(output_left, PlannedOutputLeft)
                               else map(output_left, self._running))
        if free_blocks >= need_blocks:  # only slots are short: the answer is the k-th soonest finisher's steps
            if self._soonest is None:
                self._soonest = sorted(self._steps)  # ints, in C: a microsecond for a batch of 256
            wanted = 1 - free_slots
            return max(1, self._soonest[wanted - 1]) if wanted <= len(self._soonest) else math.inf
        if self._finishing is None:
            running, size = self._running, self._block_size
            blocks = map(operator.floordiv, map(operator.add, map(vc.computed_tokens, running), repeat(size - 1)), repeat(size))  # blocks held
            self._finishing = sorted(zip(self._steps, blocks))
        for steps, blocks in self._finishing:
            free_slots, free_blocks = free_slots + 1, free_blocks + blocks
            if free_slots >= 1 and free_blocks >= need_blocks:
                return max(1, steps)
        return math.inf


@dataclass(frozen=True)
class BlockBudgetRule:
    usable_blocks: int
    headroom_blocks: int
    tenant_cap_blocks: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_shares(cls, usable_blocks: int, critical_headroom: float, tenant_kv_share: Mapping[str, float]) -> "BlockBudgetRule":
        caps = {tenant: max(1, math.floor(share * usable_blocks)) for tenant, share in tenant_kv_share.items() if share < 1.0}
        return cls(usable_blocks, math.ceil(critical_headroom * usable_blocks), caps)

    def leaves_headroom(self, tier_rank: int, free_blocks: int, new_blocks: int, critical_blocks: int = 0) -> bool:
        return tier_rank == 0 or free_blocks - new_blocks >= self.headroom_left(critical_blocks)

    def headroom_left(self, critical_blocks: int) -> int:
        """Blocks lower tiers must leave free while the critical tier holds `critical_blocks`."""
        return max(0, self.headroom_blocks - critical_blocks)

    def within_tenant_cap(self, tenant: str, reserved: int, footprint: int) -> bool:
        cap = self.tenant_cap_blocks.get(tenant)
        return cap is None or reserved == 0 or reserved + footprint <= cap


@dataclass(slots=True)
class _Holding:
    tier_rank: int
    tenant: str
    blocks: int  # blocks the request holds (tokens allocated / block size)
    reserved: int  # blocks reserved against its tenant's cap
    tpot_s: float | None  # its TPOT objective


@dataclass
class BlockLedger:
    """Who holds what, by tier and tenant; O(1) per allocation."""

    holdings: dict[str, _Holding] = field(default_factory=dict)
    blocks_by_tier: list[int] = field(default_factory=lambda: [0] * len(TIERS))
    requests_by_tier: list[int] = field(default_factory=lambda: [0] * len(TIERS))  # requests holding blocks
    running_by_tenant: dict[tuple[int, str], int] = field(default_factory=lambda: defaultdict(int))  # (tier rank, tenant)
    running_by_tpot: dict[float, int] = field(default_factory=lambda: defaultdict(int))  # TPOT objective -> requests

    def tightest_tpot_s(self) -> float | None:
        return min(self.running_by_tpot) if self.running_by_tpot else None

    def blocks_held(self) -> int:
        """Blocks held by running requests, all tiers (O(tiers))."""
        return sum(self.blocks_by_tier)
    reserved_by_tenant: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    prefix_hit_tokens: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    prefix_query_tokens: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))


class SLABlockManager(BudgetedKVCacheManager):
    """Never constructed directly: `SLABlockManager.adopt` converts the scheduler's manager."""

    _slaq_rule: BlockBudgetRule
    _slaq_ledger: BlockLedger
    _slaq_holdings: dict[str, _Holding]  # the ledger's holdings, one attribute lookup nearer (hot path)
    slaq_decode_room: dict[str, int]  # request id -> tokens its blocks hold: its decodes within them skip the hook
    _slaq_info_of: Callable[[Request], RequestInfo]
    _slaq_on_allocated: Callable[[int, str, int], None]
    _slaq_block_size: int
    _slaq_max_model_len: int
    _slaq_low_water: int  # free uncached blocks below which eviction is near: a step's worth of allocation
    _slaq_noted: dict[int, tuple[Any, Any]]  # block id -> (block, its cache key when freed): batch-tier prefixes not yet moved
    finishers: SoonestFinishers  # the requests holding blocks (the running ones), by when their plans end

    @classmethod
    def adopt(
        cls,
        scheduler: vc.AsyncScheduler,
        rule: BlockBudgetRule,
        info_of: Callable[[Request], RequestInfo],
        on_allocated: Callable[[int, str, int], None] = lambda tier_rank, tenant, tokens: None,
    ) -> "SLABlockManager":
        """`on_allocated(tier_rank, tenant, tokens)` hears of successful allocations of more than one
        token (admissions and prefill chunks): the tokens the request is scheduled for."""
        manager = vc.adopt_block_manager(scheduler, cls)
        assert isinstance(manager, SLABlockManager)
        manager._slaq_rule = rule
        manager._slaq_ledger = BlockLedger()
        manager._slaq_holdings = manager._slaq_ledger.holdings
        manager.slaq_decode_room = {}
        manager._slaq_info_of = info_of
        manager._slaq_on_allocated = on_allocated
        manager._slaq_block_size = vc.block_size(scheduler)
        manager._slaq_max_model_len = vc.max_model_len(scheduler)
        # A step allocates at most its token budget in new blocks plus one block per running request.
        manager._slaq_low_water = -(-vc.step_token_limit(scheduler) // manager._slaq_block_size) + vc.active_request_limit(scheduler)
        manager._slaq_noted = {}
        manager.finishers = SoonestFinishers(PlannedOutputLeft(info_of).unfloored_one)
        return manager

    def admission_refusal(self, request: Request, scheduler: Any) -> str | None:
        """Why admitting waiting `request` now would be refused: REFUSED_TENANT_CAP, REFUSED_KV_FULL
        (vLLM's own test: what `allocate_slots` wants exceeds the free blocks), REFUSED_HEADROOM;
        None when it would be admitted. Prefix-cache hits are not counted, so a request they would
        let in may be judged too big: it is then passed over, never admitted wrongly."""
        info = self._slaq_info_of(request)
        if self._slaq_rule.tenant_cap_blocks and vc.request_id(request) not in self._slaq_holdings:
            footprint = -(-min(self._slaq_max_model_len, vc.prompt_tokens(request) + vc.max_tokens(request)) // self._slaq_block_size)
            if not self._slaq_rule.within_tenant_cap(info.tenant, self._slaq_ledger.reserved_by_tenant.get(info.tenant, 0), footprint):
                return REFUSED_TENANT_CAP
        free = vc.free_blocks(self)
        if vc.admission_blocks(scheduler, request) > free:
            return REFUSED_KV_FULL
        if info.tier_rank and not self._slaq_rule.leaves_headroom(info.tier_rank, free, self._prompt_blocks(request), self._slaq_ledger.blocks_by_tier[0]):
            return REFUSED_HEADROOM
        return None

    def _prompt_blocks(self, request: Request) -> int:
        """New blocks waiting `request` takes for every token it has still to compute (its whole prompt,
        or all it had computed before a preemption), not just the step's first chunk; prefix hits not counted."""
        return -(-vc.total_tokens(request) // self._slaq_block_size) - -(-vc.computed_tokens(request) // self._slaq_block_size)

    def blocks_to_admit(self, request: Request, scheduler: Any) -> int:
        """Free blocks waiting `request` needs to be admitted now: what vLLM's `allocate_slots` wants
        and, below the critical tier, its whole prompt's blocks with the headroom left after them."""
        wanted = vc.admission_blocks(scheduler, request)
        if not self._slaq_info_of(request).tier_rank:
            return wanted
        return max(wanted, self._prompt_blocks(request) + self.headroom_left())

    def headroom_left(self) -> int:
        """Blocks lower tiers must leave free now: the critical reserve less what critical requests hold."""
        return self._slaq_rule.headroom_left(self._slaq_ledger.blocks_by_tier[0])

    def held_for(self, request: Request, scheduler: Any, ahead: Sequence[Request]) -> bool:
        """Whether admitting `request` would delay `ahead`: higher-tier requests passed over this step
        for want of blocks, whose blocks come from running requests as they finish (EASY backfilling).
        It may go when it fits beside what they need, or when it is done (its prefill and
        `max_tokens` steps, an upper bound) before those finishing requests free their room."""
        need = sum(self.blocks_to_admit(r, scheduler) for r in ahead)
        mine = vc.admission_blocks(scheduler, request)
        free = vc.free_blocks(self)
        if free - mine >= need:
            return False
        prefill_steps = -(-(vc.total_tokens(request) - vc.computed_tokens(request)) // max(1, vc.step_token_limit(scheduler)))
        output_left = PlannedOutputLeft(self._slaq_info_of)
        done_in = prefill_steps + output_left(request)
        return done_in > steps_until_room(vc.running_requests(scheduler), self._slaq_block_size, need, free, output_left=output_left)

    @property
    def rule(self) -> BlockBudgetRule:
        return self._slaq_rule

    def set_rule(self, rule: BlockBudgetRule) -> None:
        """New tenant caps (a changed tenant table). Blocks already reserved stay reserved; a tenant
        now over its cap admits nothing more until it is under."""
        self._slaq_rule = rule

    @property
    def ledger(self) -> BlockLedger:
        return self._slaq_ledger

    def free_block_count(self) -> int:
        return vc.free_blocks(self)

    def slaq_allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int,
                            num_lookahead_tokens: int, passed: VllmArgs):
        # A decode that stays within the blocks its request holds (all but one step in block_size)
        # has nothing to check or record: the seam gives it to vLLM without calling here
        # (`slaq_decode_room`, kept in `_hold` and `_release`). Running requests take the first branch.
        holding = self._slaq_holdings.get(vc.request_id(request))
        size = self._slaq_block_size
        if holding is not None and not num_new_computed_tokens:
            wanted = -(-(vc.computed_tokens(request) + num_new_tokens + num_lookahead_tokens) // size)
            growth = wanted - holding.blocks
            # A running request's later chunks and decodes may grow into the headroom: its admission priced its whole prompt.
            result = self.vllm_allocate_slots(request, num_new_tokens, 0, num_lookahead_tokens, passed)
            if result is not None:
                if growth > 0:
                    self._hold(request, holding, wanted)
                if num_new_tokens > 1:  # prefill chunks; decodes are charged per step in bulk
                    self._slaq_on_allocated(holding.tier_rank, holding.tenant, num_new_tokens)
            return result
        ledger = self._slaq_ledger
        info = self._slaq_info_of(request)
        wanted = -(-(vc.computed_tokens(request) + num_new_computed_tokens + num_new_tokens + num_lookahead_tokens) // size)
        if info.tier_rank:
            new_blocks = wanted - (holding.blocks if holding is not None else 0) - num_new_computed_tokens // size
            if new_blocks > 0 and not self._slaq_rule.leaves_headroom(info.tier_rank, vc.free_blocks(self), new_blocks, ledger.blocks_by_tier[0]):
                return None
        footprint = 0
        if holding is None:
            footprint = -(-min(self._slaq_max_model_len, vc.prompt_tokens(request) + vc.max_tokens(request)) // size)
            if self._slaq_rule.tenant_cap_blocks and not self._slaq_rule.within_tenant_cap(info.tenant, ledger.reserved_by_tenant.get(info.tenant, 0), footprint):
                return None
        result = self.vllm_allocate_slots(request, num_new_tokens, num_new_computed_tokens, num_lookahead_tokens, passed)
        if result is None:
            return None
        if holding is None:
            holding = _Holding(info.tier_rank, info.tenant, 0, footprint, info.tpot_s)
            if info.tpot_s is not None:
                ledger.running_by_tpot[info.tpot_s] += 1
            ledger.holdings[vc.request_id(request)] = holding
            self.finishers.admitted(request)
            ledger.requests_by_tier[info.tier_rank] += 1
            ledger.running_by_tenant[(info.tier_rank, info.tenant)] += 1
            ledger.reserved_by_tenant[info.tenant] += footprint
            key = (TIER_NAMES[info.tier_rank], info.tenant)
            ledger.prefix_query_tokens[key] += vc.total_tokens(request)
            ledger.prefix_hit_tokens[key] += num_new_computed_tokens
        self._hold(request, holding, wanted)
        self._slaq_on_allocated(holding.tier_rank, holding.tenant, num_new_tokens)
        return result

    def _hold(self, request: Request, holding: _Holding, blocks: int) -> None:
        """`request` now holds `blocks` blocks (its tier's count follows), and its decodes within them skip the hook."""
        self._slaq_ledger.blocks_by_tier[holding.tier_rank] += blocks - holding.blocks
        holding.blocks = blocks
        self.slaq_decode_room[vc.request_id(request)] = blocks * self._slaq_block_size

    def slaq_free(self, request: Request) -> None:
        evict_first = self._release(request) and vc.attached_info(request) is not None
        blocks = vc.request_blocks(self, vc.request_id(request)) if evict_first and self._slaq_info_of(request).tier_rank >= EVICT_FIRST_RANK else None
        self.vllm_free(request)
        if not blocks:
            return
        if self.eviction_near():
            vc.evict_first(self, blocks)
            return
        noted = self._slaq_noted
        for block in blocks:
            key = vc.cached_hash(block)
            if key is not None:
                noted[vc.block_id(block)] = (block, key)

    def eviction_near(self) -> bool:
        return vc.cached_free_floor(self) < self._slaq_low_water

    def promote_evict_first(self) -> int:
        """Once per step: when eviction is near, move the noted batch-tier prefixes that are still
        free and still hold what they cached to the front of the free queue. Returns how many moved."""
        if not self._slaq_noted or not self.eviction_near():
            return 0
        still = [block for block, key in self._slaq_noted.values() if vc.cached_hash(block) is key]
        self._slaq_noted.clear()
        return vc.evict_first(self, still)

    @property
    def noted_blocks(self) -> int:
        return len(self._slaq_noted)

    def slaq_pop_blocks_for_free(self, request: Request):
        self._release(request)
        return self.vllm_pop_blocks_for_free(request)

    def _release(self, request: Request) -> bool:
        request_id = vc.request_id(request)
        holding = self._slaq_ledger.holdings.pop(request_id, None)
        if holding is None:
            return False
        del self.slaq_decode_room[request_id]
        self.finishers.released(request_id)
        ledger = self._slaq_ledger
        ledger.blocks_by_tier[holding.tier_rank] -= holding.blocks
        ledger.requests_by_tier[holding.tier_rank] -= 1
        key = (holding.tier_rank, holding.tenant)
        ledger.running_by_tenant[key] -= 1
        if ledger.running_by_tenant[key] <= 0:
            del ledger.running_by_tenant[key]
        if holding.tpot_s is not None:
            ledger.running_by_tpot[holding.tpot_s] -= 1
            if ledger.running_by_tpot[holding.tpot_s] <= 0:
                del ledger.running_by_tpot[holding.tpot_s]
        ledger.reserved_by_tenant[holding.tenant] -= holding.reserved
        if ledger.reserved_by_tenant[holding.tenant] <= 0:
            del ledger.reserved_by_tenant[holding.tenant]
        return True
