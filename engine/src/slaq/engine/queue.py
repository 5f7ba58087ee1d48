"""The waiting queue the SLA scheduler installs in place of vLLM's priority heap.

vLLM's `PriorityRequestQueue` orders by `Request.__lt__` (priority, arrival, id) and is corrupted
when a queued request's priority changes. This queue never reads or writes `Request.priority`: it
hosts the pod's queue discipline (`slaq.policy.discipline.TieredQueue`: one heap per tier keyed by
the ranking's static within-tier key, missed heaps, the cross-tier choice with the starving share),
the same object the sidecar's queue hosts, fed the engine's facts: the request's `RequestView`
(`WaitingOrder.view`, with its tenant's current VTC share), the step's load and clock
(`begin_step`), and the scheduler's first-token lead (the step in flight and the request's prefill
steps at the measured mean step time, `first_token_lead`). Preempted requests go back ahead of
their tier (band 0); everything else waits in band 1. The discipline's rationale (why missed
requests leave the way, why starving ones get a share and not precedence) is in its module doc.

It implements vLLM's `RequestQueue` interface, so `Scheduler.schedule()` uses it unchanged:
`peek_request`/`pop_request` give the discipline's choice at the time set by `begin_step`.

Backfill (the report's formula 2: batch utility under memory) is the engine's own: vLLM's waiting
loop stops at the first request whose allocation fails, so one refused head would hold every
admission behind it for the step. While a step runs (`begin_step` .. `end_step`) and an admission
check is set, the queue asks it about its choice before offering it, and passes over for the rest
of the step:
- a request refused for a reason of its own (its tenant's KV cap);
- a request that does not fit in the free KV cache, or in what the critical headroom leaves of
  it, while it is in the first `queue.backfillSlack` of its horizon (TTFT objective, or aging
  bound): smaller requests behind it that fit go first; after that it blocks the loop again, as in
  vLLM, so the blocks that free up are its own and it starts before its deadline or aging bound (a
  big request passed over for the headroom for good would lose every freed block to small ones);
- a request of a lower tier than one passed over for want of blocks, unless it fits beside what
  that one needs or is done before running requests finishing free that room (EASY backfilling,
  `SLABlockManager.held_for`): a stream of small batch requests would otherwise take every block
  a standard request waits for, one at a time, until its backfill slack is spent. A request of
  its own tier or a higher one is not held back.
At most `queue.maxPassedOver` requests are passed over per step (the loop's extra work is
bounded); they are back in their heaps when the step ends.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

from slaq.api.common import Tier
from slaq.engine.blocks import REFUSED_TENANT_CAP
from slaq.engine.ordering import WaitingOrder
from slaq.engine.sla import RequestInfo
from slaq.engine import vllm_compat as vc
from slaq.engine.vllm_compat import Request, RequestQueue, is_preempted
from slaq.policy.discipline import TIERS, Choice, LeadTime, TieredQueue

AdmissionCheck = Callable[[Request], "str | None"]  # why the request would be refused now, or None
HeldCheck = Callable[[Request, list[Request]], bool]  # whether admitting it would delay those passed over


class SLARequestQueue(RequestQueue):
    def __init__(self, order: WaitingOrder, info_of: Callable[[Request], RequestInfo]) -> None:
        self._order = order
        self._info_of = info_of
        self._tiers: TieredQueue[Request] = TieredQueue(order.policy.ranking, order.policy.discipline,
                                                        lambda request: order.view(info_of(request)), vc.request_id)
        self._tiers.begin(time.time(), order.pool)
        queue_spec = order.spec.queue
        self._backfill_slack = queue_spec.backfill_slack
        self._max_passed_over = queue_spec.max_passed_over
        self._choice: Choice[Request] | None = None
        self.admission: AdmissionCheck | None = None
        self.held: HeldCheck | None = None
        self._short_of_blocks: list[tuple[int, Request]] = []  # (tier rank, request) passed over for blocks this step
        self._checking = False

    @property
    def lead(self) -> LeadTime | None:
        return self._tiers.lead

    @lead.setter
    def lead(self, lead: LeadTime | None) -> None:
        self._tiers.lead = lead

    @property
    def tiers(self) -> TieredQueue[Request]:
        return self._tiers

    # -- the scheduler's per-step hook ------------------------------------------------------
    def begin_step(self, now: float) -> None:
        """Fix the clock and load for this step's choices and refresh the fairness credit of each tier's head."""
        self._restore_passed()
        self._checking = self.admission is not None
        self._tiers.begin(now, self._order.pool, self._order.key_tokens())

    def admits_nothing(self) -> None:
        """vLLM's waiting loop will try no request this step (the batch is full, `vc.batch_full`): it
        only asks whether the queue is empty, so no choice is made and no admission is checked."""
        self._checking = False

    def end_step(self) -> None:
        """The waiting loop is over: what it passed over goes back to its heap."""
        self._checking = False
        self._restore_passed()

    def _restore_passed(self) -> None:
        self._tiers.restore_passed()
        self._short_of_blocks.clear()
        self._choice = None

    @property
    def order(self) -> WaitingOrder:
        return self._order

    def depth_by_tier(self) -> dict[Tier, int]:
        return {tier: self._tiers.depth(index) for index, tier in enumerate(TIERS)}

    def depth_by_rank(self) -> tuple[int, ...]:
        """Waiting requests per tier, indexed by tier rank."""
        return self._tiers.depth_by_rank()

    def urgent_heads(self, limit: int) -> list[Request]:
        """Up to `limit` waiting requests with a TTFT objective, from the first `limit` of each tier
        that has a lower tier to preempt, best first within each tier: those that can still make
        their deadline, tiers in order, then missed ones (the planner preempts only the lowest
        tier for those, `may_preempt_for`).

        Costs O(limit log n) (`TieredQueue.peek_heads`).
        """
        info_of = self._info_of
        return self._tiers.peek_heads(limit, lambda request: info_of(request).ttft_s is not None)

    # -- vLLM's RequestQueue interface ------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if is_preempted(request):
            self._tiers.put_back_ahead(request)
        else:
            self._tiers.push(request)
        self._choice = None

    def pop_request(self) -> Request:
        request = self._tiers.take(self._chosen())
        self._choice = None
        return request

    def peek_request(self) -> Request:
        return self._chosen().item

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: Request) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            if self._tiers.discard(request):
                self._choice = None

    def __bool__(self) -> bool:
        """Whether the waiting loop has a request to try: passed-over ones do not count, and while a
        step checks admissions the choice is made here (and kept for the peek that follows), so a
        loop whose every remaining request is passed over ends. Only vLLM's waiting loop asks this
        during a step; the scheduler's own checks use len()."""
        if len(self._tiers) <= self._tiers.passed_over:
            return False
        if self._checking:
            try:
                self._chosen()
            except IndexError:
                return False
        return True

    def __len__(self) -> int:
        return len(self._tiers)

    def __iter__(self) -> Iterator[Request]:
        """Live requests, tier by tier in heap order (a snapshot; O(n log n), not for the hot path)."""
        return self._tiers.items()

    # -- internals ----------------------------------------------------------------------------
    def _chosen(self) -> Choice[Request]:
        """The discipline's choice, less what this step passes over (see the module doc)."""
        if self._choice is not None:
            return self._choice
        while True:
            choice = self._tiers.choose()
            if choice is None:
                raise IndexError("peek from an empty queue")
            # Passing over the last request ends the loop as its refused allocation would, so it
            # is checked only when it may be held for one passed over before it.
            tiers = self._tiers
            others_left = len(tiers) - tiers.passed_over > 1 or bool(self._short_of_blocks)
            if not (self._checking and others_left and tiers.passes < self._max_passed_over and self._pass_over(choice.item)):
                self._choice = choice
                return choice
            tiers.pass_over(choice)

    def _pass_over(self, request: Request) -> bool:
        """Skip `request` for this step: refused by its tenant's KV cap, refused for want of free
        blocks (too big for the free KV cache, or for what the critical headroom leaves) while it
        still has `backfill_slack` of its horizon left, or held for a higher-tier request passed
        over for blocks (see the module doc)."""
        reason = self.admission(request)  # type: ignore[misc]
        if reason is None and not self._short_of_blocks:
            return False  # the common case, first: admissible, and no one passed over for blocks
        info = self._info_of(request)
        if reason is None:
            ahead = [r for rank, r in self._short_of_blocks if rank < info.tier_rank]
            return bool(ahead) and self.held is not None and self.held(request, ahead)
        if reason == REFUSED_TENANT_CAP:
            return True
        horizon = info.ttft_s if info.ttft_s is not None else self._order.spec.aging_bound_seconds
        if self._tiers.now < info.arrival + self._backfill_slack * horizon:
            self._short_of_blocks.append((info.tier_rank, request))
            return True
        return False
