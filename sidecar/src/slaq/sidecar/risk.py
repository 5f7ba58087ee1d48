"""`slaq_sla_risk`: one number per pod, 1.0 at the SLO boundary, rising before violations happen.

    risk = max(observed, projected)

    observed  = the q-quantile (q = 0.9) of  max(ttft / ttft_objective, tpot / tpot_objective)
                over requests with objectives that finished in the last `window_s` (60 s);
    projected = max over requests still waiting for their first token (queued here, or released
                to the engine without a first byte yet) of
                    (expected first token - arrival) / ttft_objective,
                expected first token = now + engine_ttft while queued here, and
                max(now, release + engine_ttft) once released,
                where engine_ttft is an EWMA of the release-to-first-byte time of the
                request's tier (the engine serves critical before standard, so one mixed
                figure would make critical requests look late), requests with a TTFT
                objective only.

`observed` says how the pod has been doing; `projected` says a waiting request will miss its
objective unless it starts within its remaining slack, and crosses 1.0 `engine_ttft` seconds
*before* the deadline passes, so an HPA scales out while requests can still be saved. A released
request's engine time is counted once: from its release, not again from now (counting it from
now made every request the engine was about to answer look late, and shed batch work at load 1.0). Requests
without objectives (the batch tier) never contribute. An idle pod reports 0.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from slaq.api.common import Tier


class Releasable(Protocol):
    """What the risk needs of a queue entry: when it went to the engine (None while queued)."""

    @property
    def release_time(self) -> float | None: ...


@dataclass(slots=True)
class _Waiting:
    arrival: float
    ttft_s: float
    entry: Releasable | None = None
    tier: Tier | None = None


class SlaRisk:
    def __init__(self, *, window_s: float = 60.0, quantile: float = 0.9, engine_ttft_alpha: float = 0.2, max_samples: int = 10_000) -> None:
        self.window_s = window_s
        self.quantile = quantile
        self.engine_ttft_alpha = engine_ttft_alpha
        self.engine_ttft_s = 0.0  # over every request with a TTFT objective
        self.engine_ttft_by_tier: dict[Tier, float] = {}
        self._finished: deque[tuple[float, float]] = deque(maxlen=max_samples)  # (finish time, ratio)
        self._waiting: dict[int, _Waiting] = {}

    def waiting(self, key: int, arrival: float, ttft_ms: float | None, entry: Releasable | None = None, tier: Tier | None = None) -> None:
        """A request with objectives waits for its first token; `entry` says when it is released
        (without one it counts as queued until it starts)."""
        if ttft_ms is not None:
            self._waiting[key] = _Waiting(arrival, ttft_ms / 1000.0, entry, tier)

    def engine_ttft(self, tier: Tier | None) -> float:
        """The recent release-to-first-byte time of `tier` (of all tiers until it has one)."""
        return self.engine_ttft_by_tier.get(tier, self.engine_ttft_s) if tier is not None else self.engine_ttft_s

    def started(self, key: int, engine_ttft_s: float | None) -> None:
        """The request's first byte came. Only requests with a TTFT objective feed `engine_ttft_s`:
        the engine serves them ahead of the batch tier, whose long engine waits (the majority of
        requests under load) would otherwise make every waiting critical request look late."""
        waited = self._waiting.pop(key, None)
        if waited is None or engine_ttft_s is None or engine_ttft_s < 0.0:
            return
        self.engine_ttft_s += self.engine_ttft_alpha * (engine_ttft_s - self.engine_ttft_s)
        if waited.tier is not None:
            before = self.engine_ttft_by_tier.get(waited.tier, engine_ttft_s)
            self.engine_ttft_by_tier[waited.tier] = before + self.engine_ttft_alpha * (engine_ttft_s - before)

    def gone(self, key: int) -> None:
        self._waiting.pop(key, None)

    def finished(self, now: float, ttft_s: float | None, tpot_s: float | None, ttft_ms: float | None, tpot_ms: float | None) -> None:
        ratios = []
        if ttft_ms is not None and ttft_s is not None:
            ratios.append(ttft_s * 1000.0 / ttft_ms)
        if tpot_ms is not None and tpot_s is not None:
            ratios.append(tpot_s * 1000.0 / tpot_ms)
        if ratios:
            self._finished.append((now, max(ratios)))

    def observed(self, now: float) -> float:
        while self._finished and self._finished[0][0] < now - self.window_s:
            self._finished.popleft()
        if not self._finished:
            return 0.0
        ratios = sorted(r for _, r in self._finished)
        index = min(len(ratios) - 1, max(0, math.ceil(self.quantile * len(ratios)) - 1))
        return ratios[index]

    def projected(self, now: float, *, queued_only: bool = False) -> float:
        """`queued_only`: over the requests still queued here, not those released to the engine
        (what shedding reads while no batch work is in the engine: `SidecarCore.current_risk`)."""
        worst = 0.0
        for w in self._waiting.values():
            release = None if w.entry is None else w.entry.release_time
            if queued_only and release is not None:
                continue
            engine = self.engine_ttft(w.tier)
            first_token = now + engine if release is None else max(now, release + engine)
            worst = max(worst, (first_token - w.arrival) / w.ttft_s)
        return worst

    def value(self, now: float) -> float:
        return max(self.observed(now), self.projected(now))
