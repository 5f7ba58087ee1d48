"""When a queued request may go to the engine.

The rule: keep the engine's own waiting queue at about `engine_queue_target` requests. Then the
engine always has work to admit the moment a batch slot frees (the batch stays full), while an
urgent arrival waits behind at most that many engine-side requests instead of a long FIFO tail
it cannot overtake; everything else waits here, where the dynamic score orders it.

The engine-side queue is estimated from two signals, and the smaller estimate is used (both
are upper bounds):
- requests released but without a first response byte yet (`not_started`): exact for streaming
  requests, an over-count for non-streaming ones, whose first byte is the whole answer;
- the engine's own gauges, scraped periodically: `vllm:num_requests_waiting` W and
  `vllm:num_requests_running` R at the scrape, plus the N requests released since it was sent,
  less the batch slots that were free: W + max(0, N - (C - R)). The batch capacity C is learned
  as the most requests seen running while the engine had a queue; until the engine has queued
  once, a scrape with nothing waiting means free slots to spare (the engine's batch limit has not
  been reached), so releases are not held back.

The rule agrees with the engine's ranking (`slaq.policy.ranking`): the engine admits an
attainable critical or standard request ahead of lower-tier work and preempts lower-tier decodes
for it, so such a request counts only the engine-side requests of its own tier and above
(`can_release(tier_rank)`); lower-tier requests the engine would pass over do not hold it here.
For that count the scrape's W is the engine's waiting requests of those tiers
(`slaq_engine_queue_depth{tier}`, when the engine exports it): with the total, a few batch requests
waiting in the engine would hold standard requests here while the standard ones the engine holds
are running their prefill chunks, and the engine, with nothing better waiting, admits the batch.
The handover: the engine's scheduler reorders its waiting queue by tier, but the path to it does
not. vLLM's API server tokenizes and sets up each request, one at a time in arrival order, before
the scheduler sees it: a critical request released behind many lower-tier ones waits for all of
them there (issue 39: 17–30 ms with 0–2 ahead, 55–148 ms with 12 or more, on the demo's 2 cores).
So the lowest tier may get a bound of its own on what it has released and not started (in that
pipe, or waiting in the engine, estimated as above): with `handover_target` N (`slaq sidecar
--batch-handover-target N`; off by default, decision 0023) a batch request goes only while fewer
than N batch requests are, so a critical or standard request never finds more than N of them ahead
of it on the way, and the engine still has N to admit when a slot frees. The
protected tiers keep the engine-queue rule alone: a bound counting standard requests too (8 for
standard and below) held standard requests behind batch requests waiting in the engine, the very
thing the per-tier count above undid (`slaq bench sim --pod`, 6,000 requests at load 2.0: standard
attainment 0.951 → 0.734). `slaq_handover_seconds{tier,ahead}` measures the handover.
The dispatcher (`queue.Dispatcher`) releases in the discipline's order; past a held choice only a
head of a strictly higher tier the gate lets go, so a lower or equal tier never overtakes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from slaq.api.common import Tier

LOWEST_TIER_RANK = len(Tier) - 1


class ReleaseGate:
    def __init__(self, *, engine_queue_target: int = 16, max_in_flight: int | None = None, handover_target: int | None = None) -> None:
        if engine_queue_target < 1:
            raise ValueError(f"engine_queue_target must be >= 1, got {engine_queue_target}")
        if handover_target is not None and handover_target < 1:
            raise ValueError(f"handover_target must be >= 1 (or None: no bound), got {handover_target}")
        self.engine_queue_target = engine_queue_target
        self.handover_target = handover_target
        self.max_in_flight = max_in_flight
        self.in_flight_by_rank = [0] * len(Tier)  # released and unfinished, by tier rank
        self.not_started_by_rank = [0] * len(Tier)  # released, no first byte yet, by tier rank
        self.engine_waiting: int | None = None
        self.engine_waiting_by_rank: tuple[int, ...] | None = None  # the engine's waiting requests per tier rank, when exported
        self.engine_running: int | None = None
        self.engine_capacity: int | None = None
        self.released_by_rank = [0] * len(Tier)
        self._released_at_scrape = 0
        self._released_by_rank_at_scrape = [0] * len(Tier)

    @property
    def in_flight(self) -> int:
        return sum(self.in_flight_by_rank)

    @property
    def not_started(self) -> int:
        return sum(self.not_started_by_rank)

    @property
    def released_total(self) -> int:
        return sum(self.released_by_rank)

    def engine_queue_estimate(self, tier_rank: int | None = None) -> int:
        """Requests waiting in the engine; with `tier_rank`, only those of that tier and above
        (what an attainable request of that tier queues behind at the engine)."""
        return self._waiting(slice(None) if tier_rank is None else slice(None, tier_rank + 1))

    def pipe_estimate(self, tier_rank: int) -> int:
        """Requests of tier `tier_rank` released and not yet started by the engine: in the pipe to its
        scheduler (the API server's) or waiting in it."""
        return self._waiting(slice(tier_rank, tier_rank + 1))

    def handover_bound(self, tier_rank: int) -> int | None:
        """The most requests of tier `tier_rank` that may be in the pipe to the engine (see the module
        doc): `handover_target` for the lowest tier; None for the others, or with no target."""
        if self.handover_target is None or tier_rank != LOWEST_TIER_RANK:
            return None
        return self.handover_target

    def _waiting(self, ranks: slice) -> int:
        """Released requests of the tiers `ranks` (by rank) the engine has not started: the smaller of
        the sidecar's count (no first byte yet) and the engine's gauges (module doc)."""
        counted = sum(self.not_started_by_rank[ranks])
        if self.engine_waiting is None:
            return counted
        since = self.released_total - self._released_at_scrape
        waiting = self.engine_waiting
        if ranks != slice(None) and self.engine_waiting_by_rank is not None:
            waiting = sum(self.engine_waiting_by_rank[ranks])
            since_here = sum(self.released_by_rank[ranks]) - sum(self._released_by_rank_at_scrape[ranks])
        else:
            since_here = since
        if self.engine_capacity is not None and self.engine_running is not None:
            free = max(0, self.engine_capacity - self.engine_running)
        elif self.engine_waiting == 0:
            free = since  # never seen queueing: the batch limit is still ahead
        else:
            free = 0
        return min(counted, waiting + max(0, since_here - free))

    def can_release(self, tier_rank: int | None = None) -> bool:
        """May one more request go to the engine? `tier_rank`: it is an attainable request of that
        protected tier, which the engine serves ahead of lower tiers (see the module doc)."""
        if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
            return False
        return self.engine_queue_estimate(tier_rank) < self.engine_queue_target

    def handover_open(self, tier_rank: int) -> bool:
        """May one more request of tier `tier_rank` enter the pipe to the engine (its handover bound)?"""
        bound = self.handover_bound(tier_rank)
        return bound is None or self.pipe_estimate(tier_rank) < bound

    def on_release(self, tier_rank: int) -> None:
        self.in_flight_by_rank[tier_rank] += 1
        self.not_started_by_rank[tier_rank] += 1
        self.released_by_rank[tier_rank] += 1

    def on_first_byte(self, tier_rank: int) -> None:
        self.not_started_by_rank[tier_rank] = max(0, self.not_started_by_rank[tier_rank] - 1)

    def on_finish(self, started: bool, tier_rank: int) -> None:
        self.in_flight_by_rank[tier_rank] = max(0, self.in_flight_by_rank[tier_rank] - 1)
        if not started:
            self.on_first_byte(tier_rank)

    def observe_engine(self, waiting: int | None, released_total_at_request: int | None = None, running: int | None = None,
                       waiting_by_rank: Sequence[int] | None = None,
                       released_by_rank_at_request: Sequence[int] | None = None) -> None:
        """A fresh engine scrape; None when the engine exports no such gauge.

        `released_total_at_request` (`released_by_rank_at_request`) is `released_total`
        (`released_by_rank`) when the scrape was sent: releases after that may be missing from the
        engine's answer, so they stay counted. `waiting_by_rank`: the engine's waiting requests per
        tier rank (None: not exported; the total stands in for every tier).
        """
        self.engine_waiting = waiting
        self.engine_running = running
        self.engine_waiting_by_rank = None if waiting is None or waiting_by_rank is None else tuple(waiting_by_rank)
        if waiting and running is not None:
            self.engine_capacity = max(self.engine_capacity or 0, running)
        self._released_at_scrape = self.released_total if released_total_at_request is None else released_total_at_request
        self._released_by_rank_at_scrape = list(self.released_by_rank if released_by_rank_at_request is None else released_by_rank_at_request)
