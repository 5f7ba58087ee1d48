"""`SoonestFinishers`: the running requests' planned ends, soonest first, kept across steps.

Urgent preemption asks every step of a backlog whether a running request finishing on its own
frees a slot in time for an urgent waiting one (preemption.py, `frees_in_time`): the k-th smallest
of the running requests' planned steps left (`RequestInfo.planned_output` less the tokens
delivered, before its floor of 1). Read from the whole batch, that is a pass over every running
request each step: at 256 running requests 170–310 µs of a 2.5–2.9 ms step, timed in place in
`sched_overhead.py`'s `churn` (the same call repeated in a microbenchmark: 41 µs; in place it is the
step's first read of the batch's fields from memory). Kept here instead, it costs O(log n) per
admission and per question.

The key of a running request is the output clock (`tick`: the most tokens any request received in a
model output, summed over outputs) at which its plan ends if it gets a token in every output from
now on: clock + planned steps left. A request can never get ahead of that: in one output it
receives at most the tokens the clock moves by, and its plan is fixed while it runs (set when it
arrives, output_plan.py). A request that gets fewer (a prefill chunk, a held-back step, a
preemption and resumption) ends later than its key, so every key is a lower bound of its request's
true one. Only the keys at the top of the heap are read again, and a key found stale moves down:
the first k keys found true are the k smallest, exactly what the batch pass answers
(tests/engine/test_finishers.py compares the two on a driven scheduler).

The requests are those that hold blocks (the block manager's admissions and releases). One that
holds blocks outside the running batch (a KV connector loading its KV asynchronously; slaq's own
connector loads synchronously) is passed over: it frees no slot.
"""

from __future__ import annotations

import heapq
from typing import Callable

from slaq.engine import vllm_compat as vc
from slaq.engine.vllm_compat import Request


class SoonestFinishers:
    def __init__(self, steps_left: Callable[[Request], int]) -> None:
        """`steps_left`: a running request's planned steps left before the floor of 1, the plan the
        batch read uses (`blocks.PlannedOutputLeft.unfloored_one`)."""
        self._steps_left = steps_left
        self._clock = 0
        self._heap: list[tuple[int, int, str]] = []  # (key, entry number, request id), stale entries included
        self._live: dict[str, tuple[Request, int]] = {}  # request id -> (request, its current entry's number)
        self._entries = 0

    def __len__(self) -> int:
        return len(self._live)

    def admitted(self, request: Request) -> None:
        """`request` runs (admitted, or resumed after a preemption)."""
        self._entries += 1
        request_id = vc.request_id(request)
        self._live[request_id] = (request, self._entries)
        heapq.heappush(self._heap, (self._clock + self._steps_left(request), self._entries, request_id))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._compact()

    def released(self, request_id: str) -> None:
        """The request stopped running (finished or preempted); its entry is dropped when it surfaces."""
        self._live.pop(request_id, None)

    def tick(self, tokens: int) -> None:
        """A model output was applied in which no request received more than `tokens` tokens."""
        self._clock += tokens

    def kth_steps_left(self, k: int) -> int | None:
        """The k-th smallest planned steps left among the running requests (before the floor of 1),
        None when fewer than k run."""
        if k > len(self._live):
            return None
        heap, live, clock = self._heap, self._live, self._clock
        found: list[tuple[int, int, str]] = []
        aside: list[tuple[int, int, str]] = []  # holding blocks outside the running batch
        while len(found) < k and heap:
            key, entry, request_id = heapq.heappop(heap)
            current = live.get(request_id)
            if current is None or current[1] != entry:
                continue  # stale: it stopped running, or runs under a later entry
            if not vc.is_running(current[0]):
                aside.append((key, entry, request_id))
                continue
            true_key = clock + self._steps_left(current[0])
            if true_key > key:
                heapq.heappush(heap, (true_key, entry, request_id))  # it fell behind its plan's pace: further down
                continue
            found.append((true_key, entry, request_id))
        for item in found + aside:
            heapq.heappush(heap, item)
        return found[-1][0] - clock if len(found) == k else None

    def _compact(self) -> None:
        """Drop the stale entries (those of requests no longer running): the heap's size stays O(running)."""
        clock = self._clock
        self._heap = [(clock + self._steps_left(request), entry, request_id) for request_id, (request, entry) in self._live.items()]
        heapq.heapify(self._heap)
