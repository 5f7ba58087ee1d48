"""The bounded priority queue in front of the engine, and the dispatcher that releases from it.

The queue hosts the pod's queue discipline (`slaq.policy.discipline.TieredQueue`), the same object
the engine's waiting queue hosts, fed the sidecar's facts: each request's view with its tenant's
current VTC share, the sidecar's load (`slaq.policy.load`), and a first-token lead at the engine's
step time as the sidecar observes it (its streams' token intervals, `SidecarCore.step_s`). Where
the release gate lets every request go, the sidecar releases in the order the engine admits
(tests/policy/test_discipline.py). A release costs O(log depth) and a release round a bounded
refresh of the tier heads, whatever the depth. A request that finds the queue empty and the
release gate open skips the queue altogether (the common, unloaded case costs no scoring at all).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

from slaq.api.common import Tier
from slaq.policy.discipline import Choice, Discipline, TieredQueue
from slaq.policy.ranking import LOWEST_RANK, MISSED_CLASS, STARVING_CLASS, DeadlineClassRanking
from slaq.policy.views import PoolView, RequestView
from slaq.sidecar.errors import DeadlineUnreachable, SidecarError
from slaq.sidecar.release import ReleaseGate


@dataclass(slots=True, eq=False)
class QueuedRequest:
    view: RequestView
    seq: int = 0
    waiter: asyncio.Future | None = None
    queued: bool = False
    released: bool = False
    release_time: float | None = None
    queued_at: float | None = None  # None: released without queueing
    pipe_ahead: int | None = None  # released requests without a first byte yet when this one was released (the pipe to the engine)

    @property
    def queue_wait_s(self) -> float:
        if self.queued_at is None or self.release_time is None:
            return 0.0
        return max(0.0, self.release_time - self.queued_at)


ViewOf = Callable[[QueuedRequest], RequestView]


class RequestQueue:
    """The sidecar's host of the discipline: queued requests, by identity."""

    def __init__(self, ranking: DeadlineClassRanking, discipline: Discipline, view_of: ViewOf | None = None) -> None:
        self.tiers: TieredQueue[QueuedRequest] = TieredQueue(ranking, discipline, view_of or (lambda entry: entry.view), lambda entry: entry)
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self.tiers)

    @property
    def depth_by_tier(self) -> dict[Tier, int]:
        return {tier: self.tiers.depth(tier.rank) for tier in Tier}

    def push(self, entry: QueuedRequest) -> None:
        entry.seq = next(self._seq)
        entry.queued = True
        self.tiers.push(entry)

    def remove(self, entry: QueuedRequest) -> bool:
        if not self.tiers.discard(entry):
            return False
        entry.queued = False
        return True

    def begin(self, now: float, pool: PoolView) -> None:
        self.tiers.begin(now, pool)

    def choose(self) -> Choice[QueuedRequest] | None:
        return self.tiers.choose()

    def take(self, choice: Choice[QueuedRequest]) -> QueuedRequest:
        entry = self.tiers.take(choice)
        entry.queued = False
        return entry

    def pop_best(self, now: float, pool: PoolView) -> QueuedRequest | None:
        """The discipline's next choice at `now`, taken out (the gate not consulted)."""
        self.begin(now, pool)
        choice = self.choose()
        return None if choice is None else self.take(choice)

    def ahead_of(self, view: RequestView) -> int:
        """About how many queued requests go before a new one with `view` (`TieredQueue.ahead_of`),
        at the clock of the last `begin`."""
        return self.tiers.ahead_of(view) if self.tiers else 0

    def views(self) -> list[RequestView]:
        return [self.tiers.view_of(entry) for entry in self.tiers.items()]


@dataclass
class ReleasePace:
    """How fast the queue drains: releases out of a non-empty queue, counted with exponential decay
    (time constant `window_s`) and divided by the decayed time they span (so the first seconds are
    not read against a default), as an interval. A release round lets several requests go at one
    instant; an average of the intervals between releases would count those as zero-second
    intervals and predict a queue draining many times faster than it does."""

    interval_s: float = 0.05  # until releases out of the queue span some time
    window_s: float = 10.0
    _count: float = field(default=0.0, repr=False)
    _since: float | None = field(default=None, repr=False)
    _last: float | None = field(default=None, repr=False)

    def released(self, now: float, queue_was_waiting: bool) -> None:
        if queue_was_waiting and self._last is not None:
            if self._since is None:
                self._since = self._last
            self._count = self._count * math.exp(-max(0.0, now - self._last) / self.window_s) + 1.0
            span = self.window_s * (1.0 - math.exp(-max(0.0, now - self._since) / self.window_s))
            if span > 0.0:
                self.interval_s = span / self._count
        self._last = now


class Dispatcher:
    """Releases queued requests in the discipline's order while the release gate lets them go.

    The gate counts, for an attainable request of a protected tier, only the engine-side requests
    of its tier and above (the engine admits it ahead of the rest), and for any other request all
    of them. When the discipline's choice is held, the best head of a strictly higher tier that the
    gate lets go goes instead: the engine would admit it ahead of the held one anyway, so an
    attainable higher-tier request never waits behind a lower-tier one here, and a lower or equal
    tier never overtakes a held request.

    Shedding what cannot be served in time: a queued request of the lowest tier whose TTFT deadline
    passes while it waits here leaves the queue with a `DeadlineUnreachable` refusal (503 with a
    Retry-After of its tier's drain time) instead of going to the engine late. Served, it would miss
    anyway and, past the aging bound, take the starving share of admissions from higher tiers; the
    door check (`predicted_wait_s`) refuses most such work on arrival, this catches what the
    prediction let in when the overload outlasted it."""

    def __init__(
        self,
        queue: RequestQueue,
        gate: ReleaseGate,
        pool_view: Callable[[], PoolView],
        clock: Callable[[], float],
    ) -> None:
        self.queue = queue
        self.gate = gate
        self.pool_view = pool_view
        self.clock = clock
        self.pace = ReleasePace()
        self.tier_paces = [ReleasePace() for _ in Tier]  # how fast each tier drains (the lowest gets what the others leave)
        # Called with every entry released (at once or from the queue): how a host without an
        # event loop (the simulator) learns what went to the engine; the server awaits `waiter`.
        self.on_release: Callable[[QueuedRequest], None] | None = None
        # Called with every entry shed from the queue and its refusal (the server's waiter gets it raised).
        self.on_shed: Callable[[QueuedRequest, SidecarError], None] | None = None

    @property
    def ranking(self) -> DeadlineClassRanking:
        return self.queue.tiers.ranking

    def _begin(self) -> tuple[float, PoolView]:
        now, pool = self.clock(), self.pool_view()
        self.queue.begin(now, pool)
        return now, pool

    def _gate_lets(self, tier_rank: int, rank_class: int) -> bool:
        protected = STARVING_CLASS < rank_class < MISSED_CLASS
        return self.gate.can_release(tier_rank if protected else None) and self.gate.handover_open(tier_rank)

    def may_release(self, view: RequestView, now: float, pool: PoolView) -> bool:
        """The gate's answer for a request with `view` (see the class doc)."""
        return self._gate_lets(view.tier.rank, self.ranking.rank_class(view, now, pool))

    def predicted_wait_s(self, view: RequestView) -> float:
        """Queue wait a new request with `view` would see: 0 when it would go straight through
        (nothing queued goes before it and the gate lets it go), even with lower-ranked work
        queued behind it; else those chosen before it (`TieredQueue.ahead_of`) at the queue's
        release pace. (A lowest-tier estimate from its own tier's pace refused batch work on a
        75 s overload that the pod then served in time: its clients' retries stretched the run to
        0.73x fcfs throughput. Work that waits past its objective is shed in the queue instead.)"""
        now, pool = self._begin()
        rank_class = self.ranking.rank_class(view, now, pool)
        ahead = self.queue.ahead_of(view)
        if ahead == 0 and self._gate_lets(view.tier.rank, rank_class):
            return 0.0
        return (ahead + 1) * self.pace.interval_s

    def offer(self, entry: QueuedRequest) -> bool:
        """A new request: released at once when the queue is empty and the gate lets it go (no
        scoring at all); otherwise queued and a release round run. True when it went to the engine."""
        if not self.queue:
            now, pool = self.clock(), self.pool_view()
            if self.may_release(entry.view, now, pool):
                self._release(entry, from_queue=False)
                return True
        self.enqueue(entry)
        self.pump()
        return entry.released

    def enqueue(self, entry: QueuedRequest) -> None:
        entry.queued_at = self.clock()
        self.queue.push(entry)

    async def wait_turn(self, entry: QueuedRequest) -> None:
        """Return once `entry` is released to the engine; on cancellation it leaves the queue."""
        entry.waiter = asyncio.get_running_loop().create_future()
        if self.offer(entry):
            return
        try:
            await entry.waiter
        except asyncio.CancelledError:
            self.queue.remove(entry)
            raise

    def _release(self, entry: QueuedRequest, *, from_queue: bool) -> None:
        now = self.clock()
        entry.pipe_ahead = self.gate.not_started
        self.gate.on_release(entry.view.tier.rank)
        self.pace.released(now, from_queue)
        self.tier_paces[entry.view.tier.rank].released(now, from_queue)
        entry.released = True
        entry.release_time = now
        if self.on_release is not None:
            self.on_release(entry)

    def _next(self) -> Choice[QueuedRequest] | None:
        """The discipline's choice if the gate lets it go, else the best head of a higher tier it lets go."""
        tiers = self.queue.tiers
        heads = tiers.heads()
        choice = tiers.choose(heads)
        if choice is None or self._gate_lets(choice.tier_rank, choice.rank_class):
            return choice
        above = sorted((head for head in heads if head.tier_rank < choice.tier_rank), key=lambda head: (head.rank_class, tiers.full_rank(head)))
        return next((head for head in above if self._gate_lets(head.tier_rank, head.rank_class)), None)

    def _shed_expired(self, now: float) -> None:
        """Refuse the lowest tier's queued requests whose TTFT deadline has passed (see the class doc)."""
        tiers = self.queue.tiers
        while (entry := tiers.expired_head(LOWEST_RANK, now)) is not None:
            view = tiers.view_of(entry)
            self.queue.remove(entry)
            retry_after = max(1.0, (tiers.depth(LOWEST_RANK) + 1) * self.tier_paces[LOWEST_RANK].interval_s)
            error = DeadlineUnreachable(f"waited {now - view.arrival:.1f} s in the queue, past its {view.ttft_ms:g} ms objective; "
                                        f"the {view.tier.value} tier is shed", retry_after_s=retry_after)
            if entry.waiter is not None and not entry.waiter.done():
                entry.waiter.set_exception(error)
            if self.on_shed is not None:
                self.on_shed(entry, error)

    def pump(self) -> int:
        """Shed what expired, then release as many queued requests as the gate allows; returns how many released."""
        if not self.queue:
            return 0
        now, _ = self._begin()
        self._shed_expired(now)
        released = 0
        while self.queue:
            choice = self._next()
            if choice is None:
                break
            entry = self.queue.take(choice)
            if entry.waiter is not None and entry.waiter.done():
                continue  # its client went away; already cancelled
            self._release(entry, from_queue=True)
            if entry.waiter is not None:
                entry.waiter.set_result(None)
            released += 1
        return released

    def first_byte(self, entry: QueuedRequest) -> None:
        self.gate.on_first_byte(entry.view.tier.rank)
        self.pump()

    def finished(self, entry: QueuedRequest, started: bool) -> None:
        if entry.released:
            self.gate.on_finish(started, entry.view.tier.rank)
            entry.released = False
        self.pump()
