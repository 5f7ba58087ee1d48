"""The queue discipline both queues host: which waiting request goes next.

The sidecar's queue (`slaq.sidecar.queue`) and the engine's waiting queue (`slaq.engine.queue`)
host the same `TieredQueue`, configured from the pool's `SchedulerSpec` by `Discipline.from_spec`;
each feeds it its own facts (a `RequestView` per request, the load, the clock, its estimate of the
time from admission to a first token). Given the same requests at the same time they choose the
same order (tests/policy/test_discipline.py checks the two hosts against each other).

- **One heap per tier**, keyed by the ranking's static `within_tier_key` (the deadline less a
  bounded tenant-fairness credit, refreshed for the first `rekey_head` of each heap when a host
  begins a step or a release round, unless the host's key token says nothing it is computed from
  moved). Band 0 holds requests a host puts back ahead of their tier
  (`put_back_ahead`: the engine's preempted requests); band 1 everything else (`push`). Removal is
  lazy: an entry is live while the live map points at it, so a cancelled request costs O(1). A
  host may pass over a choice (`pass_over`: the engine's waiting loop, for the rest of a step): it
  stays queued, out of its heap, until `restore_passed`.
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
from typing import Callable, Generic, Hashable, Iterator, NamedTuple, Sequence, TypeVar

from slaq.api.common import Tier
from slaq.api.pool import QueueSpec, SchedulerSpec
from slaq.policy.ranking import LOWEST_RANK, MISSED_CLASS, STARVING_CLASS, DeadlineClassRanking, Rank, deadline
from slaq.policy.views import PoolView, RequestView

T = TypeVar("T")
BAND_AHEAD, BAND_WAITING = 0, 1
TIERS = tuple(Tier)


class Entry(NamedTuple, Generic[T]):
    """An item in a tier heap. Heaps order entries as tuples: band, key, then `seq`, which is
    unique, so two entries never compare their items. (A named tuple: heap comparisons stay in C.)"""

    band: int  # BAND_AHEAD (put back ahead of its tier) or BAND_WAITING
    key: float  # the ranking's within-tier key, as of the push or the last refresh of the heads
    seq: int  # push order
    item: T


# Entries are built with `_new(Entry, (band, key, seq, item))`, in C: a named tuple's generated
# __new__ is Python, and a host step builds a few dozen (its pushes, the refreshed heads of every heap).
_new = tuple.__new__


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
    """A tier head offered to the cross-tier choice: give it back to `take` or `pass_over`."""

    rank_class: int
    tier_rank: int
    _entry: Entry[T]
    _heap: list[Entry[T]]
    missed: bool  # the head of its tier's missed heap

    @property
    def item(self) -> T:
        return self._entry.item

    @property
    def starving(self) -> bool:
        return self.rank_class == STARVING_CLASS


class TieredQueue(Generic[T]):
    """Per-tier heaps, missed heaps and the cross-tier choice (see the module doc).

    A host calls `begin(now, pool)` before it chooses (the clock and load are fixed until the next
    call), `choose()` for the next item, and `take(choice)` when it admits or releases it, or
    `pass_over(choice)` to leave it queued but out of the choice until `restore_passed()`. Between
    `begin` calls each head's rank is computed once. The heaps and their entries are the queue's
    own: hosts use the verbs here (tests/policy/test_queue_hosts.py reads the hosts' source)."""

    def __init__(self, ranking: DeadlineClassRanking, discipline: Discipline, view_of: Callable[[T], RequestView],
                 id_of: Callable[[T], Hashable]) -> None:
        self.ranking = ranking
        self.discipline = discipline
        self.view_of = view_of
        self.id_of = id_of
        self.lead: LeadTime | None = None  # the host's time from admission to a first token; None: deadlines alone
        self._heaps: list[list[Entry[T]]] = [[] for _ in TIERS]
        self._missed: list[list[Entry[T]]] = [[] for _ in TIERS]
        self._live: dict[Hashable, Entry[T]] = {}
        self._depth = [0] * len(TIERS)  # live items per tier rank
        self._missed_depth = [0] * len(TIERS)  # of which in the missed heap
        self._in_missed: set[int] = set()  # seqs of live entries in a missed heap
        self._passed: list[Choice[T]] = []  # passed over since the last `restore_passed`
        self._passed_ids: set[Hashable] = set()  # of which still queued
        self._aged_share = 0.0  # running share of choices that went to starving requests
        self._now = 0.0
        self._pool = PoolView(load=0.0, max_length_tokens=1, aging_bound_s=60.0)
        self._seq = itertools.count()
        self._choices: dict[int, Choice[T]] = {}  # seq -> the head's Choice, rank class included (between `begin` calls)
        self._ranks: dict[int, Rank] = {}
        # id(heap) -> the key token its head was last refreshed at, while no live entry has left the
        # heap since (`begin`: such a head's keys are what a refresh would compute again)
        self._fresh: dict[int, Hashable] = {}

    def __len__(self) -> int:
        return len(self._live)

    @property
    def now(self) -> float:
        """The clock of the last `begin`."""
        return self._now

    @property
    def aged_share(self) -> float:
        """The running share of choices that went to starving requests."""
        return self._aged_share

    def depth(self, tier_rank: int) -> int:
        """Queued items of the tier (passed over ones included)."""
        return self._depth[tier_rank]

    def missed_depth(self, tier_rank: int) -> int:
        """Queued items of the tier in its missed heap."""
        return self._missed_depth[tier_rank]

    def depth_by_rank(self) -> tuple[int, ...]:
        """Queued items per tier, indexed by tier rank."""
        return tuple(self._depth)

    # -- contents ----------------------------------------------------------------------------
    def push(self, item: T) -> None:
        """Queue `item` in its tier (again, if it was queued: the earlier entry lapses)."""
        self._push(item, BAND_WAITING)

    def put_back_ahead(self, item: T) -> None:
        """Queue `item` ahead of every waiting item of its tier (the engine's preempted requests)."""
        self._push(item, BAND_AHEAD)

    def _push(self, item: T, band: int) -> None:
        view = self.view_of(item)
        entry: Entry[T] = _new(Entry, (band, self.ranking.within_tier_key(view, self._pool.aging_bound_s), next(self._seq), item))
        key = self.id_of(item)
        previous = self._live.get(key)
        if previous is None:
            self._depth[view.tier.rank] += 1
        else:
            self._left_missed(previous, view.tier.rank)
            self._moved_in_tier(view.tier.rank)
        self._live[key] = entry
        self._passed_ids.discard(key)
        heapq.heappush(self._heaps[view.tier.rank], entry)

    def discard(self, item: T) -> bool:
        """Take `item` out wherever it is (lazily); False when it was not queued."""
        key = self.id_of(item)
        entry = self._live.get(key)
        if entry is None or entry.item is not item:
            return False
        del self._live[key]
        self._passed_ids.discard(key)
        tier_rank = self.view_of(item).tier.rank
        self._depth[tier_rank] -= 1
        self._left_missed(entry, tier_rank)
        self._moved_in_tier(tier_rank)
        return True

    def take(self, choice: Choice[T]) -> T:
        """Admit the chosen item: it leaves the queue and counts in the starving share."""
        self._aged_share += self.discipline.aged_share_alpha * ((1.0 if choice.starving else 0.0) - self._aged_share)
        heapq.heappop(choice._heap)  # the chosen entry heads its heap (`_head` made sure)
        self._fresh.pop(id(choice._heap), None)
        del self._live[self.id_of(choice.item)]
        self._depth[choice.tier_rank] -= 1
        self._left_missed(choice._entry, choice.tier_rank)
        return choice.item

    def pass_over(self, choice: Choice[T]) -> None:
        """Leave the chosen item queued (it counts in len and depth) but out of the choice until
        `restore_passed` puts it back in its heap."""
        heapq.heappop(choice._heap)  # the chosen entry heads its heap (`_head` made sure)
        self._fresh.pop(id(choice._heap), None)
        self._passed.append(choice)
        self._passed_ids.add(self.id_of(choice.item))

    def restore_passed(self) -> None:
        """Put what was passed over, and is still queued, back in its heap."""
        for choice in self._passed:
            if self._is_live(choice._entry):
                heapq.heappush(choice._heap, choice._entry)
        self._passed.clear()
        self._passed_ids.clear()

    @property
    def passed_over(self) -> int:
        """Items passed over since the last `restore_passed` and still queued."""
        return len(self._passed_ids)

    @property
    def passes(self) -> int:
        """Choices passed over since the last `restore_passed` (those since removed included)."""
        return len(self._passed)

    def _moved_in_tier(self, tier_rank: int) -> None:
        """A live entry of the tier left its heap: entries below its refreshed head may now head it."""
        self._fresh.pop(id(self._heaps[tier_rank]), None)
        self._fresh.pop(id(self._missed[tier_rank]), None)

    def _left_missed(self, entry: Entry[T], tier_rank: int) -> None:
        if entry.seq in self._in_missed:
            self._in_missed.discard(entry.seq)
            self._missed_depth[tier_rank] -= 1

    def _is_live(self, entry: Entry[T]) -> bool:
        return self._live.get(self.id_of(entry.item)) is entry

    def _head(self, heap: list[Entry[T]]) -> Entry[T] | None:
        while heap:
            entry = heap[0]
            if self._is_live(entry):
                return entry
            heapq.heappop(heap)  # stale: removed or re-added since it was pushed
        return None

    def items(self) -> Iterator[T]:
        """Queued items (passed over ones included), tier by tier, each tier's heap in order and
        then its missed heap (a snapshot; O(n log n), not for the hot path)."""
        for tier_rank in range(len(TIERS)):
            for heap in (self._heaps[tier_rank], self._missed[tier_rank]):
                passed = [choice._entry for choice in self._passed if choice._heap is heap]
                for entry in sorted(heap + passed):
                    if self._is_live(entry):
                        yield entry.item

    # -- the clock ---------------------------------------------------------------------------
    def begin(self, now: float, pool: PoolView, key_tokens: Sequence[Hashable] | None = None) -> None:
        """Fix the clock and load for the choices until the next call; refresh the heads' fairness credit.

        `key_tokens`, one per tier rank, lets a host say when nothing a tier's keys are computed from
        has changed (its tenants' service shares: `Accounting.version`): a heap whose last refresh, at
        the same token (and aging bound), changed no key, and that no live entry has left since, is not
        refreshed again: its head is what that refresh found, plus what was pushed since, keyed at the
        same token, so the refresh would change nothing. Without them every head is refreshed."""
        self._now, self._pool = now, pool
        self._choices.clear()
        self._ranks.clear()
        fresh = self._fresh
        for tier_rank in range(len(TIERS)):
            token = None if key_tokens is None else (key_tokens[tier_rank], pool.aging_bound_s)
            for heap in (self._heaps[tier_rank], self._missed[tier_rank]):
                if not heap or (token is not None and fresh.get(id(heap)) == token):
                    continue
                if not self._rekey_head(heap) and token is not None:
                    fresh[id(heap)] = token  # (a changed key may lift an entry not refreshed into the head)

    def _rekey_head(self, heap: list[Entry[T]]) -> bool:
        """Refresh the keys of the heap's first `rekey_head` live entries; whether any changed."""
        # Every step, for every heap: names bound once, liveness (`_is_live`) inline.
        live, id_of, limit = self._live, self.id_of, self.discipline.rekey_head
        taken: list[Entry[T]] = []
        while heap and len(taken) < limit:
            entry = heapq.heappop(heap)
            if live.get(id_of(entry.item)) is entry:
                taken.append(entry)
        key_of, view_of, aging_bound_s = self.ranking.within_tier_key, self.view_of, self._pool.aging_bound_s
        changed = False
        for entry in taken:
            band, key, seq, item = entry
            fresh_key = key_of(view_of(item), aging_bound_s)
            if fresh_key != key:
                entry = _new(Entry, (band, fresh_key, seq, item))
                live[id_of(item)] = entry
                changed = True
            heapq.heappush(heap, entry)
        return changed

    # -- what the hosts look at ------------------------------------------------------------------
    def peek_heads(self, limit: int, accept: Callable[[T], bool]) -> list[T]:
        """Up to `limit` items that `accept`, from the first `limit` of each heap of the tiers above
        the lowest, best first within each: those that can still make their deadline, tiers in
        order, then missed ones. Costs O(limit log n): entries are popped and pushed back unchanged."""
        found: list[T] = []
        for tier_rank in range(LOWEST_RANK):
            self._settle_missed(tier_rank)
        for heap in (*self._heaps[:LOWEST_RANK], *self._missed[:LOWEST_RANK]):
            taken: list[Entry[T]] = []
            while heap and len(taken) < limit and len(found) < limit:
                entry = heapq.heappop(heap)
                if not self._is_live(entry):
                    continue
                taken.append(entry)
                if accept(entry.item):
                    found.append(entry.item)
            for entry in taken:
                heapq.heappush(heap, entry)
            if len(found) >= limit:
                break
        return found

    def expired_head(self, tier_rank: int, now: float) -> T | None:
        """The tier's first waiting item (not one put back ahead) if its TTFT deadline has passed at `now`."""
        entry = self._head(self._heaps[tier_rank])
        if entry is None or entry.band != BAND_WAITING:
            return None
        view = self.view_of(entry.item)
        if view.ttft_ms is None or now < deadline(view, self._pool.aging_bound_s):
            return None
        return entry.item

    # -- the choice --------------------------------------------------------------------------
    def _settle_missed(self, tier_rank: int) -> None:
        """Move the tier's waiting heads that can no longer make their TTFT deadline to its missed heap.
        Asked again at every choice, not once per `begin`: the host's lead may change in between (the
        engine's depends on the step's token limit, which its step budget lowers for vLLM's waiting loop)."""
        if tier_rank >= LOWEST_RANK:
            return  # the lowest tier has no attainable class
        heap = self._heaps[tier_rank]
        lead = self.lead if tier_rank >= self.discipline.lead_exempt_tiers else None
        aging = self._pool.aging_bound_s
        while (entry := self._head(heap)) is not None and entry.band == BAND_WAITING:
            view = self.view_of(entry.item)
            if view.ttft_ms is None or self._now + (lead(view) if lead is not None else 0.0) < deadline(view, aging):
                return
            heapq.heappush(self._missed[tier_rank], heapq.heappop(heap))
            self._moved_in_tier(tier_rank)
            if entry.seq not in self._in_missed:
                self._in_missed.add(entry.seq)
                self._missed_depth[tier_rank] += 1

    def heads(self) -> list[Choice[T]]:
        """Each tier's attainable and missed heads, with their rank class at the fixed clock."""
        heads: list[Choice[T]] = []
        depth = self._depth
        for tier_rank in range(len(TIERS)):
            if not depth[tier_rank]:
                continue  # nothing of the tier is queued (its heaps hold stale entries at most)
            self._settle_missed(tier_rank)
            for heap in (self._heaps[tier_rank], self._missed[tier_rank]):
                entry = self._head(heap)
                if entry is None:
                    continue
                choice = self._choices.get(entry.seq)  # the same until `begin`, unless the entry moved to the missed heap
                if choice is None or choice._heap is not heap:
                    missed = heap is self._missed[tier_rank]
                    if choice is not None:
                        rank_class = choice.rank_class  # its class as first ranked since `begin`
                    else:
                        rank_class = self.ranking.rank_class(self.view_of(entry.item), self._now, self._pool)
                        if rank_class != STARVING_CLASS and missed:
                            rank_class = MISSED_CLASS  # moved for its lead, its deadline not yet passed
                    choice = self._choices[entry.seq] = Choice(rank_class, tier_rank, entry, heap, missed)
                heads.append(choice)
        return heads

    def choose(self, heads: list[Choice[T]] | None = None) -> Choice[T] | None:
        """The cross-tier choice among `heads` (default: all of them), or None when empty."""
        if heads is None:
            heads = self.heads()
        best = self.best(heads)
        if best is not None and best.starving and self._aged_share >= self.discipline.aged_share:
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
        seq = head._entry.seq
        rank = self._ranks.get(seq)
        if rank is None:
            view = self.view_of(head.item)
            rank = self.ranking.rank(view, self._now, self._pool)
            if head.rank_class == MISSED_CLASS and rank[0] != MISSED_CLASS:
                rank = (MISSED_CLASS, -self.ranking.score(view, self._now, self._pool))  # in the missed heap for its lead
            self._ranks[seq] = rank
        return rank

    def ahead_of(self, view: RequestView) -> int:
        """About how many queued requests would be chosen before a new one with `view`: for an
        attainable request of a protected tier, the attainable ones of its tier and above (its
        deadline is the latest of its tier); for any other, all of them."""
        rank_class = self.ranking.rank_class(view, self._now, self._pool)
        if STARVING_CLASS < rank_class < MISSED_CLASS:
            tier_rank = view.tier.rank
            return sum(self._depth[r] - self._missed_depth[r] for r in range(tier_rank + 1))
        return len(self._live)
