"""The engine's audit trail: one JSON line per request when it leaves the scheduler (`slaq.engine.request_log`).

The sidecar's access line says what the tenant saw; this line says what the engine did to the
request on the way, and both carry the sidecar's `request_id` (`vllm_xargs.slaq_request_id`), so
one complaint about one slow request can be followed from one line to the other:

    {"time": "2026-12-01T00:12:03.125Z", "event": "engine_request", "request_id": "3f2a…",
     "engine_request_id": "cmpl-3f2a…-0-9c1d2e3f", "tenant": "vip", "tier": "critical", "finish": "length",
     "prompt_tokens": 12, "output_tokens": 16, "queue_wait_s": 0.004,
     "requeue_wait_s": 0.0, "engine_s": 0.21, "preemptions": 0, "preemptions_by_reason": {},
     "kv_erased_blocks": 1, "kv_erased_by_reason": {"reuse": 1}, "kv_swap_out_blocks": 0, "kv_swap_in_blocks": 0}

`queue_wait_s` is the wait in the engine's waiting queue before the request's first step (until
it finished, for one that never ran); `requeue_wait_s` the waits after its preemptions. The KV
fields are null when the engine runs without slaq's KV connector (nothing erases or swaps then).
A request the sidecar fanned out (`n` > 1, a batch of prompts) is several engine requests, one
line each, with the same `request_id`.

Bookkeeping is per live request only: the facts hang on the vLLM request (`RequestInfo.facts`) and
the connector's share of them is dropped from its table when the request finishes; nothing here
grows with the number of requests served.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, Mapping, TextIO

RequestLogFormat = Literal["json", "off"]
REQUEST_LOG_FORMATS: tuple[RequestLogFormat, ...] = ("json", "off")
# json or off. `slaq engine` sets it (json unless --request-log off); a scheduler embedded without it
# (the simulator, the standalone driver, benchmarks) writes no lines.
REQUEST_LOG_ENV = "SLAQ_ENGINE_REQUEST_LOG"
LOGGER_NAME = "slaq.engine.request_log"
EVENT = "engine_request"


@dataclass(slots=True, eq=False)
class KVRequestFacts:
    """What slaq's KV connector did for one request (kv_security/planner.py counts into it)."""

    erased: dict[str, int] = field(default_factory=dict)  # blocks zeroed for it, by reason (ownership.py's reasons)
    swap_out_blocks: int = 0  # blocks of its KV sealed into host memory when it was preempted
    swap_in_blocks: int = 0  # blocks restored from such a copy when it was readmitted

    def count_erased(self, reason: str, blocks: int) -> None:
        if blocks:
            self.erased[reason] = self.erased.get(reason, 0) + blocks


@dataclass(slots=True, eq=False)
class RequestFacts:
    """What the scheduler did to one request; times are `time.monotonic()` except `arrived_wall`."""

    request_id: str | None  # the sidecar's id (null for a driver that sets none)
    engine_request_id: str  # vLLM's id: `cmpl-<x-request-id>-<prompt>-<8 hex>` and the like
    tenant: str
    tier: str
    arrived_wall: float
    arrived: float
    waiting_since: float
    queue_wait_s: float | None = None  # set at the first step
    requeue_wait_s: float = 0.0
    preemptions: dict[str, int] = field(default_factory=dict)
    kv: KVRequestFacts | None = None  # the KV connector's count, shared with it (None: no slaq connector)

    def scheduled(self, now: float) -> None:
        """The request got a step after waiting (its first, or its first after a preemption)."""
        if self.queue_wait_s is None:
            self.queue_wait_s = now - self.arrived
        else:
            self.requeue_wait_s += now - self.waiting_since

    def preempted(self, reason: str, now: float) -> None:
        self.preemptions[reason] = self.preemptions.get(reason, 0) + 1
        self.waiting_since = now

    def record(self, *, finish: str | None, prompt_tokens: int, output_tokens: int, now: float) -> dict[str, Any]:
        kv = self.kv
        return {
            "time": datetime.fromtimestamp(self.arrived_wall, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "event": EVENT,
            "request_id": self.request_id,
            "engine_request_id": self.engine_request_id,
            "tenant": self.tenant,
            "tier": self.tier,
            "finish": finish,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "queue_wait_s": round(self.queue_wait_s if self.queue_wait_s is not None else now - self.arrived, 6),
            "requeue_wait_s": round(self.requeue_wait_s, 6),
            "engine_s": round(now - self.arrived, 6),
            "preemptions": sum(self.preemptions.values()),
            "preemptions_by_reason": dict(self.preemptions),
            "kv_erased_blocks": sum(kv.erased.values()) if kv is not None else None,
            "kv_erased_by_reason": dict(kv.erased) if kv is not None else None,
            "kv_swap_out_blocks": kv.swap_out_blocks if kv is not None else None,
            "kv_swap_in_blocks": kv.swap_in_blocks if kv is not None else None,
        }


def new_facts(*, request_id: str | None, engine_request_id: str, tenant: str, tier: str) -> RequestFacts:
    now = time.monotonic()
    return RequestFacts(request_id, engine_request_id, tenant, tier, arrived_wall=time.time(), arrived=now, waiting_since=now)


class RequestLog:
    """Writes one line per finished request through the `slaq.engine.request_log` logger, on standard
    output of the engine core process (the engine container's log, beside vLLM's own)."""

    def __init__(self, fmt: RequestLogFormat = "json", stream: TextIO | None = None) -> None:
        if fmt not in REQUEST_LOG_FORMATS:
            raise ValueError(f"{REQUEST_LOG_ENV} must be one of {', '.join(REQUEST_LOG_FORMATS)}, got {fmt!r}")
        self.enabled = fmt == "json"
        self.logger = logging.getLogger(LOGGER_NAME)
        if self.enabled:
            self.attach(stream or sys.stdout)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "RequestLog":
        environ = os.environ if environ is None else environ
        return cls(environ.get(REQUEST_LOG_ENV) or "off")  # type: ignore[arg-type]

    def attach(self, stream: TextIO) -> None:
        """Lines go to `stream` alone, unprefixed (vLLM's log format would wrap them)."""
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(message)s"))
        self.logger.handlers = [handler]
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            self.logger.info(json.dumps(record, separators=(",", ":")))
