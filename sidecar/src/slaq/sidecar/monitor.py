"""Background watchers: the engine's health and queue gauges, and the tenant table file.

The engine's liveness is its /health answered within `health_timeout_s` (default 2 s,
`--engine-health-timeout`), asked every `interval_s`. An engine that is dead refuses the
connection; one that is hung (stopped, deadlocked) accepts it and says nothing, which the timeout
turns into "not ready" within about timeout + interval. While not ready, the pod reports /ready
false and refuses new requests (503 engine_unavailable + Retry-After), and requests sent to the
engine after its last answer and still without one are ended the same way (`stopped_answering`);
older in-flight requests are left to the engine-idle timeout. The first answer makes it ready again.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from slaq.api.common import Tier
from slaq.api.runtime import ENGINE_HEALTH_TIMEOUT_S, HEALTH_PATH, METRICS_PATH
from slaq.sidecar.proxy import EngineClient
from slaq.sidecar.service import SidecarCore

log = logging.getLogger(__name__)

ENGINE_WAITING = "vllm:num_requests_waiting"
ENGINE_RUNNING = "vllm:num_requests_running"
ENGINE_KV_USAGE = "vllm:kv_cache_usage_perc"
ENGINE_QUEUE_DEPTH = "slaq_engine_queue_depth"  # slaq's engine: waiting requests by tier (engine/src/slaq/engine/metrics.py)


def gauge_sum(text: str, name: str) -> float | None:
    """Sum of a gauge's samples over all label sets in Prometheus text; None when absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and len(line) > len(name) and line[len(name)] in "{ ":
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except ValueError:
                continue
    return total if seen else None


def tier_gauge(text: str, name: str) -> list[int] | None:
    """A gauge with a `tier` label, per tier rank (a tier without a sample counts 0); None when
    no sample has a known tier (an engine that does not export it)."""
    by_name = {tier.value: tier.rank for tier in Tier}
    values, seen = [0] * len(Tier), False
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        labels, _, value = line[len(name) + 1:].rpartition("} ")
        for label in labels.split(","):
            key, _, quoted = label.partition("=")
            if key.strip() == "tier" and quoted.strip('"') in by_name:
                try:
                    values[by_name[quoted.strip('"')]] += int(float(value))
                    seen = True
                except ValueError:
                    pass
    return values if seen else None


HEALTH_TIMEOUT_S = ENGINE_HEALTH_TIMEOUT_S


class EngineMonitor:
    """Marks the engine ready while its /health answers 200 and feeds its queue gauge to the gate."""

    def __init__(self, engine: EngineClient, core: SidecarCore, *, interval_s: float = 0.25,
                 health_timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        self.engine = engine
        self.core = core
        self.interval_s = interval_s
        self.health_timeout_s = health_timeout_s
        self.ready = False
        # time.monotonic() when the last /health the engine answered was sent: it was alive after that
        # (the send, not the answer, so that an answer read after the engine stopped proves nothing later)
        self.last_ok = float("-inf")
        self._changed = asyncio.Event()  # set (and replaced) whenever `ready` changes

    def _set_ready(self, ready: bool, asked: float) -> None:
        if ready:
            self.last_ok = max(self.last_ok, asked)
        self.core.engine_ready = ready
        if ready != self.ready:
            self.ready = ready
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
            log.warning("engine %s", "answers /health: ready" if ready else
                        f"did not answer /health within {self.health_timeout_s:g} s: new requests are refused")

    async def stopped_answering(self, sent: float) -> None:
        """Returns once the engine is not ready and has not answered since `sent` (time.monotonic()):
        a request sent then will get no answer from it."""
        while True:
            changed = self._changed
            if not self.ready and self.last_ok < sent:
                return
            await changed.wait()

    async def poll_once(self) -> None:
        asked = time.monotonic()
        try:
            health = await self.engine.get(HEALTH_PATH, timeout_s=self.health_timeout_s)
            self._set_ready(health.status_code == 200, asked)
        except httpx.HTTPError:
            self._set_ready(False, asked)
        if not self.ready:
            self.core.gate.observe_engine(None)
            return
        released_before, released_by_rank_before = self.core.gate.released_total, list(self.core.gate.released_by_rank)
        try:
            metrics = await self.engine.get(METRICS_PATH, timeout_s=self.health_timeout_s)
        except httpx.HTTPError:
            return
        text = metrics.text if metrics.status_code == 200 else ""
        waiting = gauge_sum(text, ENGINE_WAITING)
        running = gauge_sum(text, ENGINE_RUNNING)
        kv = gauge_sum(text, ENGINE_KV_USAGE)
        self.core.observe_engine(None if waiting is None else int(waiting), None if running is None else int(running), kv, released_before,
                                 tier_gauge(text, ENGINE_QUEUE_DEPTH), released_by_rank_before)

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)


async def watch_table(core: SidecarCore, interval_s: float = 1.0) -> None:
    while True:
        await asyncio.to_thread(core.directory.refresh)
        await asyncio.sleep(interval_s)
