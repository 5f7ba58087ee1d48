"""The bounded priority queue in front of the engine, and the dispatcher that releases from it.

Order is the pod's ranking (`slaq.policy.ranking`, the engine ranks with the same object: class
order, then formula 1 with load-adaptive weights). Ranks change with time and load, so the best entry is
found from a ranking snapshot rebuilt at most every 20 ms (see RequestQueue), so a release
costs O(new arrivals) between rebuilds and O(depth log depth) per rebuild. A request that finds the queue empty and the release gate open skips the
queue altogether (the common, unloaded case costs no scoring at all).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

from slaq.api.common import Tier
from slaq.policy.ranking import MISSED_CLASS, STARVING_CLASS, DeadlineClassRanking
from slaq.policy.views import PoolView, RequestView
from slaq.sidecar.release import ReleaseGate

Key = tuple[int, float, float]  # rank class, rank value, seq (equal ranks keep arrival order)


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


class RequestQueue:
    """Plain container: the policy is the ranking passed to `best`/`pop_best`/`ahead_of`.

    Scoring every entry on every release would cost O(depth) Python per release (~5 ms at a
    depth of 1000). Instead the queue keeps a ranking snapshot: all entries scored and sorted at
    most once per `snapshot_ttl_s`; entries pushed since are scored on their own and compared with
    the snapshot's head. The order is exact up to `snapshot_ttl_s` of score drift (the waiting
    term moves by ttl / aging bound, 0.03 % at the defaults).
    """

    def __init__(self, snapshot_ttl_s: float = 0.02) -> None:
        self.snapshot_ttl_s = snapshot_ttl_s
        self._entries: dict[int, QueuedRequest] = {}
        self._seq = itertools.count()
        self.depth_by_tier: dict[Tier, int] = {t: 0 for t in Tier}
        self._ranked_keys: list[Key] = []
        self._ranked_at = -math.inf
        self._head = 0
        self._fresh: dict[int, QueuedRequest] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, entry: QueuedRequest) -> None:
        entry.seq = next(self._seq)
        entry.queued = True
        self._entries[entry.seq] = entry
        self._fresh[entry.seq] = entry
        self.depth_by_tier[entry.view.tier] += 1

    def remove(self, entry: QueuedRequest) -> bool:
        if self._entries.pop(entry.seq, None) is None:
            return False
        self._fresh.pop(entry.seq, None)
        entry.queued = False
        self.depth_by_tier[entry.view.tier] -= 1
        return True

    @staticmethod
    def _key(entry: QueuedRequest, ranking: DeadlineClassRanking, now: float, pool: PoolView) -> Key:
        rank_class, value = ranking.rank(entry.view, now, pool)
        return (rank_class, value, entry.seq)

    def _refresh(self, ranking: DeadlineClassRanking, now: float, pool: PoolView) -> None:
        if 0.0 <= now - self._ranked_at <= self.snapshot_ttl_s:
            return
        self._ranked_keys = sorted(self._key(e, ranking, now, pool) for e in self._entries.values())
        self._ranked_at = now
        self._head = 0
        self._fresh.clear()

    def best(self, ranking: DeadlineClassRanking, now: float, pool: PoolView) -> QueuedRequest | None:
        if not self._entries:
            return None
        self._refresh(ranking, now, pool)
        keys = self._ranked_keys
        while self._head < len(keys) and keys[self._head][2] not in self._entries:
            self._head += 1
        best_key = keys[self._head] if self._head < len(keys) else None
        for entry in self._fresh.values():
            key = self._key(entry, ranking, now, pool)
            if best_key is None or key < best_key:
                best_key = key
        return None if best_key is None else self._entries[best_key[2]]

    def pop_best(self, ranking: DeadlineClassRanking, now: float, pool: PoolView) -> QueuedRequest | None:
        entry = self.best(ranking, now, pool)
        if entry is not None:
            self.remove(entry)
        return entry

    def ahead_of(self, view: RequestView, ranking: DeadlineClassRanking, now: float, pool: PoolView) -> int:
        """How many queued requests would be released before a new request with `view` (an
        estimate: entries cancelled from the middle of the snapshot still count until it is rebuilt)."""
        if not self._entries:
            return 0
        self._refresh(ranking, now, pool)
        mine = ranking.rank(view, now, pool)
        mine_key = (mine[0], mine[1], math.inf)
        ahead = max(0, bisect.bisect_right(self._ranked_keys, mine_key) - self._head)
        ahead += sum(1 for e in self._fresh.values() if ranking.rank(e.view, now, pool) <= mine)
        return min(ahead, len(self._entries))

    def views(self) -> list[RequestView]:
        return [e.view for e in self._entries.values()]


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
    """Releases queued requests in rank order while the release gate lets the best one go."""

    def __init__(
        self,
        queue: RequestQueue,
        gate: ReleaseGate,
        ranking: DeadlineClassRanking,
        pool_view: Callable[[], PoolView],
        clock: Callable[[], float],
    ) -> None:
        self.queue = queue
        self.gate = gate
        self.ranking = ranking
        self.pool_view = pool_view
        self.clock = clock
        self.pace = ReleasePace()
        # Called with every entry released (at once or from the queue): how a host without an
        # event loop (the simulator) learns what went to the engine; the server awaits `waiter`.
        self.on_release: Callable[[QueuedRequest], None] | None = None

    def may_release(self, view: RequestView, now: float, pool: PoolView) -> bool:
        """The gate's answer for this request: an attainable request of a protected tier counts only
        the engine-side requests of its tier and above (the engine passes over the rest for it)."""
        rank_class = self.ranking.rank_class(view, now, pool)
        protected = STARVING_CLASS < rank_class < MISSED_CLASS
        return self.gate.can_release(view.tier.rank if protected else None)

    def predicted_wait_s(self, view: RequestView) -> float:
        """Queue wait a new request with `view` would see: 0 when it would go straight through,
        as `try_release` lets it (nothing queued outranks it and the gate lets it go), even with
        lower-ranked work queued behind it."""
        now, pool = self.clock(), self.pool_view()
        ahead = self.queue.ahead_of(view, self.ranking, now, pool) if self.queue else 0
        if ahead == 0 and self.may_release(view, now, pool):
            return 0.0
        return (ahead + 1) * self.pace.interval_s

    def try_release(self, entry: QueuedRequest) -> bool:
        """Release `entry` at once when nothing queued outranks it and the gate lets it go
        (no event loop needed); otherwise it must queue (`wait_turn`)."""
        now, pool = self.clock(), self.pool_view()
        if self.queue:
            best = self.queue.best(self.ranking, now, pool)
            if best is not None and self.ranking.rank(best.view, now, pool) <= self.ranking.rank(entry.view, now, pool):
                return False
        if not self.may_release(entry.view, now, pool):
            return False
        self._release(entry, from_queue=False)
        return True

    def enqueue(self, entry: QueuedRequest) -> None:
        entry.queued_at = self.clock()
        self.queue.push(entry)

    async def wait_turn(self, entry: QueuedRequest) -> None:
        """Return once `entry` is released to the engine; on cancellation it leaves the queue."""
        if self.try_release(entry):
            return
        entry.waiter = asyncio.get_running_loop().create_future()
        self.enqueue(entry)
        try:
            await entry.waiter
        except asyncio.CancelledError:
            self.queue.remove(entry)
            raise

    def _release(self, entry: QueuedRequest, *, from_queue: bool) -> None:
        now = self.clock()
        self.gate.on_release(entry.view.tier.rank)
        self.pace.released(now, from_queue)
        entry.released = True
        entry.release_time = now
        if self.on_release is not None:
            self.on_release(entry)

    def pump(self) -> int:
        """Release as many queued requests as the gate allows; returns how many."""
        released = 0
        while self.queue:
            now, pool = self.clock(), self.pool_view()
            entry = self.queue.best(self.ranking, now, pool)
            if entry is None or not self.may_release(entry.view, now, pool):
                break  # the best waits: nothing ranked below it may overtake it
            self.queue.remove(entry)
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
