"""The waiting queue the SLA scheduler installs in place of vLLM's priority heap.

vLLM's `PriorityRequestQueue` orders by `Request.__lt__` (priority, arrival, id) and is corrupted
when a queued request's priority changes. This queue never reads or writes `Request.priority`:
it keeps one heap per tier of `(band, key, seq, request)` entries whose keys are computed by
`WaitingOrder` when the entry is pushed and never mutated. Band 0 holds preempted requests, which
go back ahead of their tier; band 1 everything else. Removal is lazy (an entry is live while the
`_live` map points at it), so aborts cost O(1).

Missed requests leave the way of those that can still make it. A waiting request of a protected
tier that can no longer have its first token by its TTFT deadline moves from its tier's heap to the
tier's missed heap (when it reaches the head: `_settle_missed`): its deadline has passed, or, below
the critical tier, it is nearer than `lead` (the scheduler's estimate of the time from admission
to a first token: the step in flight and the request's prefill steps). Admitted that late it would
miss anyway and take the step from one that need not: under a sustained overload earliest-deadline
-first serves exactly the requests about to expire (first 1,500 of the conversation trace at load
3.0: standard 0.587 with the deadline alone, 0.658 with the lead). The critical tier is exempt: its
prompt goes into the next step by urgent prefill planning, and one demoted early waited behind
attainable standard requests (a 15 s wait in the simulator). The cross-tier choice then sees up
to two heads per tier: the earliest deadline that can still be met, ranked in its tier's class,
and the oldest missed one, ranked in MISSED_CLASS (formula 1). With one heap per tier a missed head hid every
attainable request of its tier behind it: under a burst of VIP arrivals the first one to miss
made the whole critical tier rank as missed, below every attainable standard request, and the
rest missed in turn. Preempted requests stay in their tier's heap (band 0), as before.

It implements vLLM's `RequestQueue` interface, so `Scheduler.schedule()` uses it unchanged:
`peek_request`/`pop_request` give the cross-tier choice of `WaitingOrder.rank` among the tier
heads at the time set by `begin_step`.

Backfill (the report's formula 2: batch utility under memory). vLLM's waiting loop stops at the
first request whose allocation fails, so one refused head would hold every admission behind it
for the step. While a step runs (`begin_step` .. `end_step`) and an admission check is set, the
queue asks it about its choice before offering it, and passes over for the rest of the step:
- a request refused for a reason of its own (its tenant's KV cap);
- a request that does not fit in the free KV cache, or in what the critical headroom leaves of
  it, while it is in the first BACKFILL_SLACK of its horizon (TTFT objective, or aging bound):
  smaller requests behind it that fit go first; after that it blocks the loop again, as in vLLM,
  so the blocks that free up are its own and it starts before its deadline or aging bound (a
  big request passed over for the headroom for good would lose every freed block to small ones);
- a request of a lower tier than one passed over for want of blocks, unless it fits beside what
  that one needs or is done before running requests finishing free that room (EASY backfilling,
  `SLABlockManager.held_for`): a stream of small batch requests would otherwise take every block
  a standard request waits for, one at a time, until its backfill slack is spent. A request of
  its own tier or a higher one is not held back.
At most MAX_PASSED_OVER requests are passed over per step (the loop's extra work is bounded);
they are back in their heaps when the step ends.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable, Iterable, Iterator

from slaq.api.common import Tier
from slaq.engine.blocks import REFUSED_TENANT_CAP
from slaq.engine.ordering import LOWEST_RANK, MISSED_CLASS, REKEY_HEAD, STARVING_CLASS, WaitingOrder
from slaq.engine.sla import RequestInfo
from slaq.engine.vllm_compat import Request, RequestQueue, is_preempted

Entry = tuple[int, float, int, Request]
Head = tuple[int, int, Entry, list[Entry]]  # (rank class, tier rank, entry, the heap it heads)
Choice = tuple[int, Entry, bool, list[Entry]]  # (tier rank, entry, starving, the heap it heads)
BAND_PREEMPTED, BAND_WAITING = 0, 1
TIERS = tuple(Tier)
# Starving requests (waited past the aging bound) are guaranteed at least this share of the
# admissions contested with a higher tier, not all of them: under a sustained overload the
# lower tier's backlog is always starving, and absolute precedence would make every
# higher-tier arrival wait out the aging bound behind it.
AGED_SHARE = 0.25
AGED_SHARE_ALPHA = 0.05  # weight of one admission in the running share (about the last 20)
MAX_PASSED_OVER = 16
BACKFILL_SLACK = 0.5

AdmissionCheck = Callable[[Request], "str | None"]  # why the request would be refused now, or None
HeldCheck = Callable[[Request, list[Request]], bool]  # whether admitting it would delay those passed over
LeadTime = Callable[[RequestInfo], float]  # seconds from its admission to its first token


class SLARequestQueue(RequestQueue):
    def __init__(self, order: WaitingOrder, info_of: Callable[[Request], RequestInfo]) -> None:
        self._order = order
        self._info_of = info_of
        self._heaps: list[list[Entry]] = [[] for _ in TIERS]
        self._missed: list[list[Entry]] = [[] for _ in TIERS]  # waiting requests that can no longer make their deadline (protected tiers)
        self._live: dict[str, Entry] = {}
        self._depth = [0] * len(TIERS)
        self._seq = itertools.count()
        self._now = time.time()
        self._choice: Choice | None = None
        self._aged_share = 0.0  # running share of admissions that went to starving requests
        self._ranks: dict[int, tuple[int, float]] = {}  # entry seq -> cross-tier rank, this step
        self._classes: dict[int, int] = {}  # entry seq -> rank class, this step
        self.admission: AdmissionCheck | None = None
        self.held: HeldCheck | None = None
        self.lead: LeadTime | None = None
        self._short_of_blocks: list[tuple[int, Request]] = []  # (tier rank, request) passed over for blocks this step
        self._checking = False
        self._passed: list[tuple[int, Entry]] = []  # (tier rank, entry) passed over this step (back to the tier's heap)
        self._passed_ids: set[str] = set()

    # -- the scheduler's per-step hook ------------------------------------------------------
    def begin_step(self, now: float) -> None:
        """Fix the clock for this step's choices and refresh the fairness credit of each tier's head."""
        self._now = now
        self._choice = None
        self._ranks.clear()
        self._classes.clear()
        self._restore_passed()
        self._checking = self.admission is not None
        for heap in (*self._heaps, *self._missed):
            self._rekey_head(heap)

    def end_step(self) -> None:
        """The waiting loop is over: what it passed over goes back to its heap."""
        self._checking = False
        self._restore_passed()

    def _restore_passed(self) -> None:
        for tier_rank, entry in self._passed:
            if self._live.get(entry[3].request_id) is entry:
                heapq.heappush(self._heaps[tier_rank], entry)
        self._passed.clear()
        self._passed_ids.clear()
        self._short_of_blocks.clear()
        self._choice = None

    @property
    def order(self) -> WaitingOrder:
        return self._order

    def depth_by_tier(self) -> dict[Tier, int]:
        return {tier: self._depth[index] for index, tier in enumerate(TIERS)}

    def depth_by_rank(self) -> list[int]:
        """Waiting requests per tier, indexed by tier rank (the live list: read, do not keep)."""
        return self._depth

    def urgent_heads(self, limit: int) -> list[Request]:
        """Up to `limit` waiting requests with a TTFT objective, from the first `limit` of each tier
        that has a lower tier to preempt, best first within each tier: those that can still make
        their deadline, tiers in order, then missed ones (the planner preempts only the lowest
        tier for those, `may_preempt_for`).

        Costs O(limit log n): entries are popped and pushed back unchanged.
        """
        found: list[Request] = []
        for tier_rank in range(LOWEST_RANK):
            self._settle_missed(tier_rank)
        for heap in (*self._heaps[:LOWEST_RANK], *self._missed[:LOWEST_RANK]):
            taken: list[Entry] = []
            while heap and len(taken) < limit and len(found) < limit:
                entry = heapq.heappop(heap)
                if self._live.get(entry[3].request_id) is not entry:
                    continue
                taken.append(entry)
                if self._info_of(entry[3]).ttft_s is not None:
                    found.append(entry[3])
            for entry in taken:
                heapq.heappush(heap, entry)
            if len(found) >= limit:
                break
        return found

    # -- vLLM's RequestQueue interface ------------------------------------------------------
    def add_request(self, request: Request) -> None:
        info = self._info_of(request)
        band = BAND_PREEMPTED if is_preempted(request) else BAND_WAITING
        entry: Entry = (band, self._order.tier_key(info), next(self._seq), request)
        previous = self._live.get(request.request_id)
        if previous is None:
            self._depth[info.tier_rank] += 1
        self._passed_ids.discard(request.request_id)
        self._live[request.request_id] = entry
        heapq.heappush(self._heaps[info.tier_rank], entry)
        self._choice = None

    def pop_request(self) -> Request:
        tier_rank, entry, starving, heap = self._chosen()
        self._aged_share += AGED_SHARE_ALPHA * ((1.0 if starving else 0.0) - self._aged_share)
        heapq.heappop(heap)
        del self._live[entry[3].request_id]
        self._depth[tier_rank] -= 1
        self._choice = None
        return entry[3]

    def peek_request(self) -> Request:
        return self._chosen()[1][3]

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: Request) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            entry = self._live.get(request.request_id)
            if entry is not None and entry[3] is request:
                del self._live[request.request_id]
                self._passed_ids.discard(request.request_id)
                self._depth[self._info_of(request).tier_rank] -= 1
                self._choice = None

    def __bool__(self) -> bool:
        """Whether the waiting loop has a request to try: passed-over ones do not count, and while a
        step checks admissions the choice is made here (and kept for the peek that follows), so a
        loop whose every remaining request is passed over ends. Only vLLM's waiting loop asks this
        during a step; the scheduler's own checks use len()."""
        if len(self._live) <= len(self._passed_ids):
            return False
        if self._checking:
            try:
                self._chosen()
            except IndexError:
                return False
        return True

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Request]:
        """Live requests, tier by tier in heap order (a snapshot; O(n log n), not for the hot path)."""
        for tier_rank, heap in enumerate(self._heaps):
            passed = [entry for rank, entry in self._passed if rank == tier_rank]
            for entry in sorted(heap + passed) + sorted(self._missed[tier_rank]):
                if self._live.get(entry[3].request_id) is entry:
                    yield entry[3]

    # -- internals ----------------------------------------------------------------------------
    def _head(self, heap: list[Entry]) -> Entry | None:
        while heap:
            entry = heap[0]
            if self._live.get(entry[3].request_id) is entry:
                return entry
            heapq.heappop(heap)  # stale: removed or re-added since it was pushed
        return None

    def _settle_missed(self, tier_rank: int) -> None:
        """Move the tier's waiting heads that can no longer make their TTFT deadline (passed, or nearer
        than `lead` below the critical tier) to its missed heap (see the module doc). The lowest tier
        has no attainable class, and a preempted head stops the move."""
        if tier_rank >= LOWEST_RANK:
            return
        heap = self._heaps[tier_rank]
        lead = self.lead if tier_rank else None
        while (entry := self._head(heap)) is not None and entry[0] == BAND_WAITING:
            info = self._info_of(entry[3])
            if info.ttft_s is None or self._now + (lead(info) if lead is not None else 0.0) < info.deadline:
                return
            heapq.heappush(self._missed[tier_rank], heapq.heappop(heap))

    def _chosen(self) -> Choice:
        """The cross-tier choice: the best-ranked tier head, except that a starving head yields to
        the best non-starving head of a higher tier while starving requests already have at least
        AGED_SHARE of recent admissions (so they still get that share: no starvation).

        A head's rank class is computed once per step (clock and load are fixed within it), and
        its full rank (formula 1 for classes 0 and MISSED_CLASS) only when it ties with another
        head's class: the choice is the one `WaitingOrder.rank` gives over the heads."""
        if self._choice is not None:
            return self._choice
        while True:
            choice = self._choose()
            # Passing over the last request ends the loop as its refused allocation would, so it
            # is checked only when it may be held for one passed over before it.
            others_left = len(self._live) - len(self._passed_ids) > 1 or bool(self._short_of_blocks)
            if not (self._checking and others_left and len(self._passed) < MAX_PASSED_OVER and self._pass_over(choice[1][3])):
                self._choice = choice
                return choice
            tier_rank, entry, _, heap = choice
            heapq.heappop(heap)  # the head of its heap (`_head` made sure)
            self._passed.append((tier_rank, entry))
            self._passed_ids.add(entry[3].request_id)

    def _pass_over(self, request: Request) -> bool:
        """Skip `request` for this step: refused by its tenant's KV cap, refused for want of free
        blocks (too big for the free KV cache, or for what the critical headroom leaves) while it
        still has BACKFILL_SLACK of its horizon left, or held for a higher-tier request passed over
        for blocks (see the module doc)."""
        reason = self.admission(request)  # type: ignore[misc]
        info = self._info_of(request)
        if reason is None:
            ahead = [r for rank, r in self._short_of_blocks if rank < info.tier_rank]
            return bool(ahead) and self.held is not None and self.held(request, ahead)
        if reason == REFUSED_TENANT_CAP:
            return True
        horizon = info.ttft_s if info.ttft_s is not None else self._order.spec.aging_bound_seconds
        if self._now < info.arrival + BACKFILL_SLACK * horizon:
            self._short_of_blocks.append((info.tier_rank, request))
            return True
        return False

    def _choose(self) -> Choice:
        heads: list[Head] = []
        for tier_rank in range(len(TIERS)):
            self._settle_missed(tier_rank)
            for heap in (self._heaps[tier_rank], self._missed[tier_rank]):
                entry = self._head(heap)
                if entry is None:
                    continue
                rank_class = self._classes.get(entry[2])
                if rank_class is None:
                    rank_class = self._order.rank_class(self._info_of(entry[3]), self._now)
                    if rank_class != STARVING_CLASS and heap is self._missed[tier_rank]:
                        rank_class = MISSED_CLASS  # moved for its lead, its deadline not yet passed
                    self._classes[entry[2]] = rank_class
                heads.append((rank_class, tier_rank, entry, heap))
        best = self._best(heads)
        if best is None:
            raise IndexError("peek from an empty queue")
        starving = best[0] == 0
        if starving and self._aged_share >= AGED_SHARE:
            fresh = self._best([head for head in heads if head[0]])  # the best non-starving head
            if fresh is not None and fresh[1] < best[1]:
                best, starving = fresh, False
        return (best[1], best[2], starving, best[3])

    def _best(self, heads: list[Head]) -> Head | None:
        """The head with the smallest rank (the first in tier order among equals), or None."""
        if not heads:
            return None
        lowest = min(head[0] for head in heads)
        tied = [head for head in heads if head[0] == lowest]
        if len(tied) == 1:
            return tied[0]
        return min(tied, key=self._full_rank)

    def _full_rank(self, head: Head) -> tuple[int, float]:
        entry = head[2]
        rank = self._ranks.get(entry[2])
        if rank is None:
            info = self._info_of(entry[3])
            rank = self._order.rank(info, self._now)
            if head[0] == MISSED_CLASS and rank[0] != MISSED_CLASS:
                rank = (MISSED_CLASS, -self._order.score(info, self._now))  # in the missed heap for its lead
            self._ranks[entry[2]] = rank
        return rank

    def _rekey_head(self, heap: list[Entry]) -> None:
        taken: list[Entry] = []
        while heap and len(taken) < REKEY_HEAD:
            entry = heapq.heappop(heap)
            if self._live.get(entry[3].request_id) is not entry:
                continue
            taken.append(entry)
        for band, _, seq, request in taken:
            fresh: Entry = (band, self._order.tier_key(self._info_of(request)), seq, request)
            self._live[request.request_id] = fresh
            heapq.heappush(heap, fresh)
