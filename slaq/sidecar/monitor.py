"""Background watchers: the engine's health and queue gauges, and the tenant table file."""

from __future__ import annotations

import asyncio
import logging

import httpx

from slaq.api.runtime import HEALTH_PATH, METRICS_PATH
from slaq.sidecar.proxy import EngineClient
from slaq.sidecar.service import SidecarCore

log = logging.getLogger(__name__)

ENGINE_WAITING = "vllm:num_requests_waiting"
ENGINE_RUNNING = "vllm:num_requests_running"
ENGINE_KV_USAGE = "vllm:kv_cache_usage_perc"


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


class EngineMonitor:
    """Marks the engine ready while its /health answers 200 and feeds its queue gauge to the gate."""

    def __init__(self, engine: EngineClient, core: SidecarCore, *, interval_s: float = 0.25) -> None:
        self.engine = engine
        self.core = core
        self.interval_s = interval_s
        self.ready = False

    async def poll_once(self) -> None:
        try:
            health = await self.engine.get(HEALTH_PATH, timeout_s=2.0)
            self.ready = health.status_code == 200
        except httpx.HTTPError:
            self.ready = False
        if not self.ready:
            self.core.gate.observe_engine(None)
            return
        released_before = self.core.gate.released_total
        try:
            metrics = await self.engine.get(METRICS_PATH, timeout_s=2.0)
        except httpx.HTTPError:
            return
        text = metrics.text if metrics.status_code == 200 else ""
        waiting = gauge_sum(text, ENGINE_WAITING)
        running = gauge_sum(text, ENGINE_RUNNING)
        kv = gauge_sum(text, ENGINE_KV_USAGE)
        self.core.observe_engine(None if waiting is None else int(waiting), None if running is None else int(running), kv, released_before)

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)


async def watch_table(core: SidecarCore, interval_s: float = 1.0) -> None:
    while True:
        await asyncio.to_thread(core.directory.refresh)
        await asyncio.sleep(interval_s)
