"""The queue discipline both queues host: which waiting request goes next.

The sidecar's queue (`slaq.sidecar.queue`) and the engine's waiting queue (`slaq.engine.queue`)
host the same `TieredQueue`, configured from the pool's `SchedulerSpec` by `Discipline.from_spec`;
each feeds it its own facts (a `RequestView` per request, the load, the clock, its estimate of the
time from admission to a first token). Given the same requests at the same time they choose the
same order (tests/policy/test_discipline.py checks the two hosts against each other).

- **One heap per tier**, keyed by the ranking's static `within_tier_key` (the deadline less a
  bounded tenant-fairness credit, refreshed for the first `rekey_head` of each heap when a host
  begins a step or a release round). Band 0 holds requests a host puts back ahead of their tier
  (the engine's preempted requests); band 1 everything else. Removal is lazy: an entry is live
  while the live map points at it, so a cancelled request costs O(1).
- **Missed requests leave the way of those that can still make it.** A waiting head of a protected
  tier that can no longer have its first token by its TTFT deadline moves to its tier's missed heap:
  its deadline has passed, or, below the first `lead_exempt_tiers` tiers, it is nearer than `lead`
  (the host's estimate of the time from admission to a first token, `first_token_lead`). Admitted
  that late it would miss anyway and take the step from one that need not. The critical tier is
  exempt from the lead: the engine puts its prompt into the next step (urgent prefill planning).
- **The choice across tiers** sees up to two heads per tier (the earliest attainable deadline,
  ranked in its tier's class, and the oldest missed one, ranked in MISSED_CLASS by formula 1) and
  takes the smallest rank of `slaq.policy.ranking`, except that a starving head (waited past the
  aging bound) yields to the best non-starving head of a higher tier while starving requests
  already have `aged_share` of recent choices (a running share, `aged_share_alpha` per choice):
  under a sustained overload the lower tier's backlog is always starving, and absolute precedence
  would make every higher-tier arrival wait out the aging bound behind it; the share keeps the
  backlog from starving outright.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Iterator, TypeVar

from slaq.api.common import Tier
from slaq.api.pool import QueueSpec, SchedulerSpec
from slaq.policy.ranking import LOWEST_RANK, MISSED_CLASS, STARVING_CLASS, DeadlineClassRanking, Rank, deadline
from slaq.policy.views import PoolView, RequestView

T = TypeVar("T")
Entry = tuple[int, float, int, T]  # (band, within-tier key, seq, item)
BAND_AHEAD, BAND_WAITING = 0, 1
TIERS = tuple(Tier)

LeadTime = Callable[[RequestView], float]  # seconds from its admission to its first token


_QUEUE = QueueSpec()  # the defaults, documented in the CRD


@dataclass(frozen=True)
class Discipline:
    """The discipline's constants, from the pool's `spec.scheduler.queue` (its defaults as defaults)."""

    aged_share: float = _QUEUE.aged_share
    aged_share_alpha: float = _QUEUE.aged_share_alpha
    rekey_head: int = _QUEUE.rekey_head
    lead_exempt_tiers: int = _QUEUE.lead_exempt_tiers

    @classmethod
    def from_spec(cls, spec: SchedulerSpec) -> "Discipline":
        queue = spec.queue
        return cls(aged_share=queue.aged_share, aged_share_alpha=queue.aged_share_alpha, rekey_head=queue.rekey_head,
                   lead_exempt_tiers=queue.lead_exempt_tiers)


def first_token_lead(step_s: float, prompt_tokens: int, step_tokens: int) -> float:
    """The lead-time rule: the step in flight and the request's prefill steps, at `step_s` each."""
    return step_s * (1 + math.ceil(prompt_tokens / max(1, step_tokens)))


@dataclass(frozen=True, slots=True)
class Choice(Generic[T]):
    rank_class: int
    tier_rank: int
    entry: Entry
    heap: list
    missed: bool

    @property
    def item(self) -> T:
        return self.entry[3]

    @property
    def starving(self) -> bool:
        return self.rank_class == STARVING_CLASS


class TieredQueue(Generic[T]):
    """Per-tier heaps, missed heaps and the cross-tier choice (see the module doc).

    A host calls `begin(now, pool)` before it chooses (the clock and load are fixed until the next
    call), `choose()` for the next item, and `take(choice)` when it admits or releases it. Between
    `begin` calls each head's rank is computed once."""

    def __init__(self, ranking: DeadlineClassRanking, discipline: Discipline, view_of: Callable[[T], RequestView],
                 id_of: Callable[[T], Hashable]) -> None:
        self.ranking = ranking
        self.discipline = discipline
        self.view_of = view_of
        self.id_of = id_of
        self.heaps: list[list[Entry]] = [[] for _ in TIERS]
        self.missed: list[list[Entry]] = [[] for _ in TIERS]
        self.live: dict[Hashable, Entry] = {}
        self.depth = [0] * len(TIERS)  # live items per tier rank
        self.missed_depth = [0] * len(TIERS)  # of which in the missed heap
        self._in_missed: set[int] = set()  # seqs of live entries in a missed heap
        self.aged_share = 0.0  # running share of choices that went to starving requests
        self.lead: LeadTime | None = None
        self.now = 0.0
        self.pool = PoolView(load=0.0, max_length_tokens=1, aging_bound_s=60.0)
        self._seq = itertools.count()
        self._classes: dict[int, int] = {}
        self._ranks: dict[int, Rank] = {}

    def __len__(self) -> int:
        return len(self.live)

    # -- contents ----------------------------------------------------------------------------
    def push(self, item: T, band: int = BAND_WAITING) -> Entry:
        view = self.view_of(item)
        entry: Entry = (band, self.ranking.within_tier_key(view, self.pool.aging_bound_s), next(self._seq), item)
        key = self.id_of(item)
        previous = self.live.get(key)
        if previous is None:
            self.depth[view.tier.rank] += 1
        else:
            self._left_missed(previous, view.tier.rank)
        self.live[key] = entry
        heapq.heappush(self.heaps[view.tier.rank], entry)
        return entry

    def discard(self, item: T) -> bool:
        """Take `item` out wherever it is (lazily); False when it was not queued."""
        entry = self.live.get(self.id_of(item))
        if entry is None or entry[3] is not item:
            return False
        del self.live[self.id_of(item)]
        tier_rank = self.view_of(item).tier.rank
        self.depth[tier_rank] -= 1
        self._left_missed(entry, tier_rank)
        return True

    def take(self, choice: Choice[T]) -> T:
        """Admit the chosen item: it leaves the queue and counts in the starving share."""
        discipline = self.discipline
        self.aged_share += discipline.aged_share_alpha * ((1.0 if choice.starving else 0.0) - self.aged_share)
        heapq.heappop(choice.heap)  # the chosen entry heads its heap (`head` made sure)
        del self.live[self.id_of(choice.item)]
        self.depth[choice.tier_rank] -= 1
        self._left_missed(choice.entry, choice.tier_rank)
        return choice.item

    def _left_missed(self, entry: Entry, tier_rank: int) -> None:
        if entry[2] in self._in_missed:
            self._in_missed.discard(entry[2])
            self.missed_depth[tier_rank] -= 1

    def is_live(self, entry: Entry) -> bool:
        return self.live.get(self.id_of(entry[3])) is entry

    def head(self, heap: list[Entry]) -> Entry | None:
        while heap:
            entry = heap[0]
            if self.is_live(entry):
                return entry
            heapq.heappop(heap)  # stale: removed or re-added since it was pushed
        return None

    def items(self) -> Iterator[T]:
        """Live items, tier by tier in heap order (a snapshot; O(n log n), not for the hot path)."""
        for tier_rank in range(len(TIERS)):
            for entry in sorted(self.heaps[tier_rank]) + sorted(self.missed[tier_rank]):
                if self.is_live(entry):
                    yield entry[3]

    # -- the clock ---------------------------------------------------------------------------
    def begin(self, now: float, pool: PoolView) -> None:
        """Fix the clock and load for the choices until the next call; refresh the heads' fairness credit."""
        self.now, self.pool = now, pool
        self._classes.clear()
        self._ranks.clear()
        for heap in (*self.heaps, *self.missed):
            self._rekey_head(heap)

    def _rekey_head(self, heap: list[Entry]) -> None:
        taken: list[Entry] = []
        while heap and len(taken) < self.discipline.rekey_head:
            entry = heapq.heappop(heap)
            if self.is_live(entry):
                taken.append(entry)
        for band, _, seq, item in taken:
            fresh: Entry = (band, self.ranking.within_tier_key(self.view_of(item), self.pool.aging_bound_s), seq, item)
            self.live[self.id_of(item)] = fresh
            heapq.heappush(heap, fresh)

    # -- the choice --------------------------------------------------------------------------
    def settle_missed(self, tier_rank: int) -> None:
        """Move the tier's waiting heads that can no longer make their TTFT deadline to its missed heap."""
        if tier_rank >= LOWEST_RANK:
            return  # the lowest tier has no attainable class
        heap = self.heaps[tier_rank]
        lead = self.lead if tier_rank >= self.discipline.lead_exempt_tiers else None
        aging = self.pool.aging_bound_s
        while (entry := self.head(heap)) is not None and entry[0] == BAND_WAITING:
            view = self.view_of(entry[3])
            if view.ttft_ms is None or self.now + (lead(view) if lead is not None else 0.0) < deadline(view, aging):
                return
            heapq.heappush(self.missed[tier_rank], heapq.heappop(heap))
            if entry[2] not in self._in_missed:
                self._in_missed.add(entry[2])
                self.missed_depth[tier_rank] += 1

    def heads(self) -> list[Choice[T]]:
        """Each tier's attainable and missed heads, with their rank class at the fixed clock."""
        heads: list[Choice[T]] = []
        for tier_rank in range(len(TIERS)):
            self.settle_missed(tier_rank)
            for heap in (self.heaps[tier_rank], self.missed[tier_rank]):
                entry = self.head(heap)
                if entry is None:
                    continue
                missed = heap is self.missed[tier_rank]
                rank_class = self._classes.get(entry[2])
                if rank_class is None:
                    rank_class = self.ranking.rank_class(self.view_of(entry[3]), self.now, self.pool)
                    if rank_class != STARVING_CLASS and missed:
                        rank_class = MISSED_CLASS  # moved for its lead, its deadline not yet passed
                    self._classes[entry[2]] = rank_class
                heads.append(Choice(rank_class, tier_rank, entry, heap, missed))
        return heads

    def choose(self, heads: list[Choice[T]] | None = None) -> Choice[T] | None:
        """The cross-tier choice among `heads` (default: all of them), or None when empty."""
        if heads is None:
            heads = self.heads()
        best = self.best(heads)
        if best is not None and best.starving and self.aged_share >= self.discipline.aged_share:
            fresh = self.best([head for head in heads if not head.starving])
            if fresh is not None and fresh.tier_rank < best.tier_rank:
                return fresh
        return best

    def best(self, heads: list[Choice[T]]) -> Choice[T] | None:
        """The head with the smallest rank (the first in tier order among equals), or None."""
        if not heads:
            return None
        lowest = min(head.rank_class for head in heads)
        tied = [head for head in heads if head.rank_class == lowest]
        if len(tied) == 1:
            return tied[0]
        return min(tied, key=self.full_rank)

    def full_rank(self, head: Choice[T]) -> Rank:
        rank = self._ranks.get(head.entry[2])
        if rank is None:
            view = self.view_of(head.item)
            rank = self.ranking.rank(view, self.now, self.pool)
            if head.rank_class == MISSED_CLASS and rank[0] != MISSED_CLASS:
                rank = (MISSED_CLASS, -self.ranking.score(view, self.now, self.pool))  # in the missed heap for its lead
            self._ranks[head.entry[2]] = rank
        return rank

    def ahead_of(self, view: RequestView) -> int:
        """About how many queued requests would be chosen before a new one with `view`: for an
        attainable request of a protected tier, the attainable ones of its tier and above (its
        deadline is the latest of its tier); for any other, all of them."""
        rank_class = self.ranking.rank_class(view, self.now, self.pool)
        if STARVING_CLASS < rank_class < MISSED_CLASS:
            tier_rank = view.tier.rank
            return sum(self.depth[r] - self.missed_depth[r] for r in range(tier_rank + 1))
        return len(self.live)
