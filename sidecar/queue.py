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
from dataclasses import dataclass, field
from typing import Callable

from slaq.api.common import Tier
from slaq.policy.discipline import Choice, Discipline, TieredQueue
from slaq.policy.ranking import MISSED_CLASS, STARVING_CLASS, DeadlineClassRanking
from slaq.policy.views import PoolView, RequestView
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
        return {tier: self.tiers.depth[tier.rank] for tier in Tier}

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
    """EWMA of the interval between releases out of a non-empty queue: how fast the queue drains."""

    interval_s: float = 0.05
    alpha: float = 0.2
    _last: float | None = field(default=None, repr=False)

    def released(self, now: float, queue_was_waiting: bool) -> None:
        if queue_was_waiting and self._last is not None:
            self.interval_s += self.alpha * (max(0.0, now - self._last) - self.interval_s)
        self._last = now


class Dispatcher:
    """Releases queued requests in the discipline's order while the release gate lets them go.

    The gate counts, for an attainable request of a protected tier, only the engine-side requests
    of its tier and above (the engine admits it ahead of the rest), and for any other request all
    of them. When the discipline's choice is held, the best head of a strictly higher tier that the
    gate lets go goes instead: the engine would admit it ahead of the held one anyway, so an
    attainable higher-tier request never waits behind a lower-tier one here, and a lower or equal
    tier never overtakes a held request."""

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

    @property
    def ranking(self) -> DeadlineClassRanking:
        return self.queue.tiers.ranking

    def _begin(self) -> tuple[float, PoolView]:
        now, pool = self.clock(), self.pool_view()
        self.queue.begin(now, pool)
        return now, pool

    def _gate_lets(self, tier_rank: int, rank_class: int) -> bool:
        protected = STARVING_CLASS < rank_class < MISSED_CLASS
        return self.gate.can_release(tier_rank if protected else None)

    def may_release(self, view: RequestView, now: float, pool: PoolView) -> bool:
        """The gate's answer for a request with `view` (see the class doc)."""
        return self._gate_lets(view.tier.rank, self.ranking.rank_class(view, now, pool))

    def predicted_wait_s(self, view: RequestView) -> float:
        """Queue wait a new request with `view` would see: 0 when it would go straight through
        (nothing queued goes before it and the gate lets it go), even with lower-ranked work
        queued behind it. An attainable request of a protected tier waits for those ahead of it at
        the queue's release pace; any other request goes behind its whole tier, which drains at
        that tier's own pace (under a sustained overload the lowest tier gets what the others leave,
        so its wait is its backlog over that share, not over the pod's whole release rate)."""
        now, pool = self._begin()
        rank_class = self.ranking.rank_class(view, now, pool)
        ahead = self.queue.ahead_of(view)
        if ahead == 0 and self._gate_lets(view.tier.rank, rank_class):
            return 0.0
        if STARVING_CLASS < rank_class < MISSED_CLASS:
            return (ahead + 1) * self.pace.interval_s
        tier_rank = view.tier.rank
        return (self.queue.tiers.depth[tier_rank] + 1) * self.tier_paces[tier_rank].interval_s

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

    def pump(self) -> int:
        """Release as many queued requests as the gate allows; returns how many."""
        if not self.queue:
            return 0
        self._begin()
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
