"""The metrics port: what Prometheus, a gateway's endpoint picker and the operator read.

It serves `/metrics` (the sidecar's own series followed by the engine's `vllm:*` and
`slaq_engine_*` families, fetched from the engine on every scrape so a scrape never shows a stale
copy) and `/slaq/usage` (per-tenant demand and SLO outcomes).

`vllm:num_requests_waiting` here is the pod's whole queue: the engine's waiting requests plus the
requests the sidecar still holds. A gateway's endpoint picker (llm-d / Gateway API Inference
Extension) routes on that series by default, and the sidecar's release gate keeps the engine's own
count near its target however long the sidecar's queue grows, so the engine's figure alone would
make a pod with a thousand queued requests look like one with sixteen. The engine's own count stays
readable per tier as `slaq_engine_queue_depth`, the sidecar's as `slaq_queue_depth`. None of it is on the tenant port:
tenants must not read each other's names, rates and latencies. The NetworkPolicy lets only the
monitoring and operator namespaces reach this port.
"""

from __future__ import annotations

import json
import logging

import httpx

from slaq.api.runtime import HEALTH_PATH, METRICS_PATH, USAGE_PATH
from slaq.sidecar.metrics import CONTENT_TYPE
from slaq.sidecar.proxy import EngineClient
from slaq.sidecar.service import SidecarCore

log = logging.getLogger(__name__)

ENGINE_FAMILY_PREFIXES = ("vllm:", "slaq_engine_")
ENGINE_SCRAPE_TIMEOUT_S = 2.0
# The gauge a gateway's endpoint picker reads as a pod's queue length (llm-d router's default
# `--total-queued-requests-metric`).
POD_WAITING_FAMILY = "vllm:num_requests_waiting"


def _family_of(line: str) -> str:
    """The metric name a Prometheus text line is about ('' for a blank or foreign comment)."""
    if line.startswith("# HELP ") or line.startswith("# TYPE "):
        return line[7:].split(" ", 1)[0]
    if line.startswith("#"):
        return ""
    return line.split("{", 1)[0].split(" ", 1)[0]


def engine_families(text: str) -> str:
    """The engine's `vllm:*` and `slaq_engine_*` lines (HELP, TYPE and samples); its process and
    Python runtime series are left out, they describe the engine process, not the pod's serving."""
    kept = [line for line in text.splitlines() if _family_of(line).startswith(ENGINE_FAMILY_PREFIXES)]
    return "\n".join(kept) + "\n" if kept else ""


def with_sidecar_waiting(text: str, held: int) -> str:
    """`text` with the `held` requests queued in the sidecar added to the engine's waiting count.

    Added to the first sample of the family only (an engine with several data-parallel ranks reports
    one sample each), so any sum over the pod's samples counts each held request once."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("#") and _family_of(line) == POD_WAITING_FAMILY:
            series, _, value = line.rpartition(" ")
            lines[i] = f"{series} {float(value) + held}"
            break
    return "\n".join(lines) + "\n" if lines else ""


class MetricsApp:
    """ASGI app of the metrics port, over the same core and engine client as the tenant port."""

    def __init__(self, core: SidecarCore, engine: EngineClient, *, engine_timeout_s: float = ENGINE_SCRAPE_TIMEOUT_S) -> None:
        self.core = core
        self.engine = engine
        self.engine_timeout_s = engine_timeout_s

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if scope["method"] not in ("GET", "HEAD"):
            await self._send(send, 405, "application/json", json.dumps({"reason": "method_not_allowed"}).encode())
        elif path == METRICS_PATH:
            await self._send(send, 200, CONTENT_TYPE, await self.scrape())
        elif path == USAGE_PATH:
            await self._send(send, 200, "application/json", json.dumps(self.core.usage_report()).encode())
        elif path == HEALTH_PATH:
            await self._send(send, 200, "application/json", b'{"status":"ok"}')
        else:
            await self._send(send, 404, "application/json", json.dumps({"reason": "not_found", "error": {"message": f"no route {path} on the metrics port"}}).encode())

    async def scrape(self) -> bytes:
        engine_text = await self._engine_text()
        self.core.metrics.engine_up.set(1.0 if engine_text is not None else 0.0)
        if engine_text is not None:
            engine_text = with_sidecar_waiting(engine_text, len(self.core.queue))
        return self.core.metrics.render() + (engine_text or "").encode()

    async def _engine_text(self) -> str | None:
        try:
            response = await self.engine.get(METRICS_PATH, timeout_s=self.engine_timeout_s)
        except httpx.HTTPError as exc:
            log.warning("engine metrics unavailable for this scrape: %s", exc)
            return None
        if response.status_code != 200:
            log.warning("engine metrics answered %s for this scrape", response.status_code)
            return None
        return engine_families(response.text)

    @staticmethod
    async def _send(send, status: int, content_type: str, body: bytes) -> None:
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
