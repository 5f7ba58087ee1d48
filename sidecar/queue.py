"""The bounded priority queue in front of the engine, and the dispatcher that releases from it.

Order is `slaq.scoring.ScoreProfile.rank_key` (the report's formula 1 with load-adaptive weights;
requests past the aging bound first). Scores change with time and load, so the best entry is
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
from slaq.scoring import PoolView, RequestView, ScoreProfile
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


class RequestQueue:
    """Plain container: the policy is the profile passed to `best`/`pop_best`/`ahead_of`.

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
        self._ranked_keys: list[tuple[int, float, int]] = []
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
    def _key(entry: QueuedRequest, profile: ScoreProfile, now: float, pool: PoolView) -> tuple[int, float, int]:
        starving, neg_score = profile.rank_key(entry.view, now, pool)
        return (starving, neg_score, entry.seq)  # seq: equal scores keep arrival order

    def _refresh(self, profile: ScoreProfile, now: float, pool: PoolView) -> None:
        if 0.0 <= now - self._ranked_at <= self.snapshot_ttl_s:
            return
        self._ranked_keys = sorted(self._key(e, profile, now, pool) for e in self._entries.values())
        self._ranked_at = now
        self._head = 0
        self._fresh.clear()

    def best(self, profile: ScoreProfile, now: float, pool: PoolView) -> QueuedRequest | None:
        if not self._entries:
            return None
        self._refresh(profile, now, pool)
        keys = self._ranked_keys
        while self._head < len(keys) and keys[self._head][2] not in self._entries:
            self._head += 1
        best_key = keys[self._head] if self._head < len(keys) else None
        for entry in self._fresh.values():
            key = self._key(entry, profile, now, pool)
            if best_key is None or key < best_key:
                best_key = key
        return None if best_key is None else self._entries[best_key[2]]

    def pop_best(self, profile: ScoreProfile, now: float, pool: PoolView) -> QueuedRequest | None:
        entry = self.best(profile, now, pool)
        if entry is not None:
            self.remove(entry)
        return entry

    def ahead_of(self, view: RequestView, profile: ScoreProfile, now: float, pool: PoolView) -> int:
        """How many queued requests would be released before a new request with `view` (an
        estimate: entries cancelled from the middle of the snapshot still count until it is rebuilt)."""
        if not self._entries:
            return 0
        self._refresh(profile, now, pool)
        mine = profile.rank_key(view, now, pool)
        mine_key = (mine[0], mine[1], math.inf)
        ahead = max(0, bisect.bisect_right(self._ranked_keys, mine_key) - self._head)
        ahead += sum(1 for e in self._fresh.values() if profile.rank_key(e.view, now, pool) <= mine)
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
    """Holds requests until the release gate opens, then releases the best-ranked one."""

    def __init__(
        self,
        queue: RequestQueue,
        gate: ReleaseGate,
        profile: ScoreProfile,
        pool_view: Callable[[], PoolView],
        clock: Callable[[], float],
    ) -> None:
        self.queue = queue
        self.gate = gate
        self.profile = profile
        self.pool_view = pool_view
        self.clock = clock
        self.pace = ReleasePace()

    def predicted_wait_s(self, view: RequestView) -> float:
        """Queue wait a new request with `view` would see: 0 when it would go straight through."""
        if not self.queue and self.gate.can_release():
            return 0.0
        ahead = self.queue.ahead_of(view, self.profile, self.clock(), self.pool_view())
        return (ahead + 1) * self.pace.interval_s

    async def wait_turn(self, entry: QueuedRequest) -> None:
        """Return once `entry` is released to the engine; on cancellation it leaves the queue."""
        if not self.queue and self.gate.can_release():
            self._release(entry, from_queue=False)
            return
        entry.waiter = asyncio.get_running_loop().create_future()
        entry.queued_at = self.clock()
        self.queue.push(entry)
        try:
            await entry.waiter
        except asyncio.CancelledError:
            self.queue.remove(entry)
            raise

    def _release(self, entry: QueuedRequest, *, from_queue: bool) -> None:
        now = self.clock()
        self.gate.on_release()
        self.pace.released(now, from_queue)
        entry.released = True
        entry.release_time = now

    def pump(self) -> int:
        """Release as many queued requests as the gate allows; returns how many."""
        released = 0
        while self.queue and self.gate.can_release():
            entry = self.queue.pop_best(self.profile, self.clock(), self.pool_view())
            if entry is None:
                break
            if entry.waiter is not None and entry.waiter.done():
                continue  # its client went away; already cancelled
            self._release(entry, from_queue=True)
            if entry.waiter is not None:
                entry.waiter.set_result(None)
            released += 1
        return released

    def first_byte(self, entry: QueuedRequest) -> None:
        self.gate.on_first_byte()
        self.pump()

    def finished(self, entry: QueuedRequest, started: bool) -> None:
        if entry.released:
            self.gate.on_finish(started)
            entry.released = False
        self.pump()
