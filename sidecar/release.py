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
"""

from __future__ import annotations


class ReleaseGate:
    def __init__(self, *, engine_queue_target: int = 16, max_in_flight: int | None = None) -> None:
        if engine_queue_target < 1:
            raise ValueError(f"engine_queue_target must be >= 1, got {engine_queue_target}")
        self.engine_queue_target = engine_queue_target
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.not_started = 0
        self.engine_waiting: int | None = None
        self.engine_running: int | None = None
        self.engine_capacity: int | None = None
        self.released_total = 0
        self._released_at_scrape = 0

    def engine_queue_estimate(self) -> int:
        if self.engine_waiting is None:
            return self.not_started
        since = self.released_total - self._released_at_scrape
        if self.engine_capacity is not None and self.engine_running is not None:
            free = max(0, self.engine_capacity - self.engine_running)
        elif self.engine_waiting == 0:
            free = since  # never seen queueing: the batch limit is still ahead
        else:
            free = 0
        return min(self.not_started, self.engine_waiting + max(0, since - free))

    def can_release(self) -> bool:
        if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
            return False
        return self.engine_queue_estimate() < self.engine_queue_target

    def on_release(self) -> None:
        self.in_flight += 1
        self.not_started += 1
        self.released_total += 1

    def on_first_byte(self) -> None:
        self.not_started = max(0, self.not_started - 1)

    def on_finish(self, started: bool) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        if not started:
            self.not_started = max(0, self.not_started - 1)

    def observe_engine(self, waiting: int | None, released_total_at_request: int | None = None, running: int | None = None) -> None:
        """A fresh engine scrape; None when the engine exports no such gauge.

        `released_total_at_request` is `released_total` when the scrape was sent: releases after
        that may be missing from the engine's answer, so they stay counted.
        """
        self.engine_waiting = waiting
        self.engine_running = running
        if waiting and running is not None:
            self.engine_capacity = max(self.engine_capacity or 0, running)
        self._released_at_scrape = self.released_total if released_total_at_request is None else released_total_at_request
