"""`slaq_protected_load`: the share of the pod's capacity the tiers that pay need, 1.0 at capacity.

    protected load = protected requests held (mean over ~30 s) / requests the pod holds at load 1.0

- protected requests held: critical and standard requests admitted here and not yet settled,
  queued in the sidecar or released to the engine (`PROTECTED_TIERS`; batch requests never count,
  so a batch backlog alone never scales the pool), averaged over time with a 30 s time constant
  (`window_s`): the count at one instant swings with Poisson bursts, and one scrape's burst would
  otherwise scale a pool out for the whole scale-down window;
- requests the pod holds at load 1.0: how many requests of the current mix fill the engine, the
  engine's running requests over its KV cache usage (`vllm:num_requests_running` /
  `vllm:kv_cache_usage_perc`, as the sidecar last scraped them), at most its batch limit
  (`maxNumSeqs`); without
  those gauges, the requests released and unfinished over the pod's load (`SidecarCore.load`); the
  last estimate while the engine is idle or not ready (down, restarting: what is still in flight
  then, over a KV usage last seen before it went down, says nothing of its capacity), and the
  batch slot limit before the first. Requests waiting in the engine's own queue hold no KV and
  are not counted as capacity.

The figure is proportional to the protected tiers' arrival rate (Little's law: requests held =
rate x time in the pod), so an HPA's `AverageValue` rule, ceil(sum over pods / target), gives the
replica count that keeps the protected tiers at `target` of the pool's capacity; the remainder is
the headroom that absorbs a rise while new replicas start. When protected requests queue (the pod
is short of capacity) their time in the pod grows and the figure rises above 1.0 with the
backlog, and it does not fall while they wait: scale-down waits for them. `slaq_sla_risk`, a
max-type figure, is not proportional to load: averaged by an HPA it scaled a pool down too far
(docs/decisions/0025-scale-on-protected-load.md).
"""

from __future__ import annotations

import math

from slaq.api.common import Tier

PROTECTED_TIERS = frozenset({Tier.CRITICAL, Tier.STANDARD})


class ProtectedLoad:
    def __init__(self, slot_limit: int, *, window_s: float = 30.0, now: float = 0.0) -> None:
        if slot_limit < 1:
            raise ValueError(f"slot_limit must be >= 1, got {slot_limit}")
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self.held = 0
        self.mean_held = 0.0  # the time-weighted moving average of `held`
        self.capacity = float(slot_limit)  # requests at load 1.0, last estimate
        self._at = now

    def _advance(self, now: float) -> None:
        # `held` was constant since the last change: the exact update of a continuous-time EWMA.
        elapsed = now - self._at
        if elapsed > 0:
            self.mean_held += (1.0 - math.exp(-elapsed / self.window_s)) * (self.held - self.mean_held)
            self._at = now

    def admitted(self, tier: Tier, now: float) -> None:
        if tier in PROTECTED_TIERS:
            self._advance(now)
            self.held += 1

    def settled(self, tier: Tier, now: float) -> None:
        if tier in PROTECTED_TIERS:
            self._advance(now)
            self.held = max(0, self.held - 1)

    def value(self, now: float, slots: int, running: int | None, kv_usage: float | None, in_flight: int, load: float,
              engine_ready: bool = True) -> float:
        """The gauge at `now`: `slots` the engine's batch limit, `running` and `kv_usage` its last
        scraped gauges (None: not exported), `in_flight` the requests released and unfinished,
        `load` the pod's load; `engine_ready` False: the capacity is not estimated again."""
        self._advance(now)
        if engine_ready:
            if running and kv_usage:
                self.capacity = min(float(slots), running / kv_usage)
            elif running is None and in_flight > 0 and load > 0.0:
                self.capacity = in_flight / load
        return self.mean_held / self.capacity
