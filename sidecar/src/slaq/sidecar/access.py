"""The audit log: one JSON line per request the sidecar answers or refuses, on standard output.

A line says who asked (tenant, tier, the key's fingerprint, the client's address), what became
of it (status, reason, SLO outcome) and what it cost and took (tokens, queue wait, TTFT, TPOT, end
to end). It never holds prompt or output text, nor the key or its stored hash: a tenant's
complaint can be checked against it without it leaking anything.

    {"time": "2026-12-01T00:12:03.120Z", "event": "request", "request_id": "3f2a…", "tenant": "vip", "tier": "critical",
     "key_fingerprint": "5be0c1d2a3f49e77", "client": "10.0.3.7", "peer": "10.0.3.7",
     "method": "POST", "path": "/v1/completions", "status": 200, "reason": null, "stream": true,
     "prompt_tokens": 12, "output_tokens": 16, "queue_wait_s": 0.0, "ttft_s": 0.041,
     "tpot_s": 0.012, "e2e_s": 0.22, "slo": "met", "handover_s": 0.018, "pipe_ahead": 2}

`ttft_s` counts from the moment the request's first byte reached the host (arrival.py);
`handover_s` from its release to the engine to the engine's first byte, with `pipe_ahead` the
released requests that had no first byte yet at that release (the pipe it queued behind).
`request_id` is the sidecar's: the client gets it as `x-request-id`, and the engine's own line for
the request (`slaq.engine.request_log`, event `engine_request`: engine/src/slaq/engine/request_log.py) carries it too,
with what the engine did to the request (queue wait, preemptions, KV blocks erased and swapped).
`key_fingerprint` is `slaq.api.table.key_fingerprint` of the key's stored hash; `client` is the
peer unless the peer is a trusted proxy (addresses.py), `peer` the TCP peer.

Lines of failed authentication (reason `unauthorized` or `auth_throttled`) are sampled per client
address (auth_failures.FailureLines): the first few of a window are written, and the rest are
counted into one line when the window ends, so a flood of wrong keys cannot fill a disk:

    {"time": "…", "event": "access_suppressed", "client": "10.0.3.7", "from": "…", "until": "…",
     "suppressed": 5912, "reasons": {"auth_throttled": 5902, "unauthorized": 10}}
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal, TextIO

from slaq.sidecar.auth_failures import FailureLines
from slaq.sidecar.connections import client_key
from slaq.sidecar.service import Flight
from slaq.sidecar.tenants import Identity

AccessLogFormat = Literal["json", "off"]
ACCESS_LOG_FORMATS: tuple[AccessLogFormat, ...] = ("json", "off")
LOGGER_NAME = "slaq.access"
EVENT = "request"
SUPPRESSED_EVENT = "access_suppressed"
SAMPLED_REASONS = frozenset({"unauthorized", "auth_throttled"})  # failed authentication: sampled per client address


@dataclass(slots=True, eq=False)
class AccessEntry:
    """One request as the HTTP layer sees it; filled in as it goes, written once at the end."""

    method: str
    path: str
    arrival: float  # wall-clock seconds
    identity: Identity | None = None
    flight: Flight | None = None
    status: int = 500
    reason: str | None = None
    request_id: str | None = None  # the sidecar's own id: the client's `x-request-id` and the engine's request id
    client: str | None = None  # the client's address (the peer, or what a trusted proxy reports)
    peer: str | None = None  # the TCP peer's address

    def record(self) -> dict[str, Any]:
        tenant = self.identity.tenant if self.identity else None
        settled = self.flight.settlement if self.flight else None
        return {
            "time": _iso(self.arrival),
            "event": EVENT,
            "request_id": self.request_id,
            "tenant": tenant.name if tenant else None,
            "tier": tenant.tier.value if tenant else None,
            "key_fingerprint": self.identity.key_fingerprint if self.identity else None,
            "client": self.client,
            "peer": self.peer,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "reason": self.reason,
            "stream": self.flight.payload.stream if self.flight else None,
            "prompt_tokens": settled.prompt_tokens if settled else None,
            "output_tokens": settled.output_tokens if settled else None,
            "queue_wait_s": _rounded(settled.queue_wait_s) if settled else None,
            "ttft_s": _rounded(settled.ttft_s) if settled else None,
            "tpot_s": _rounded(settled.tpot_s) if settled else None,
            "e2e_s": _rounded(settled.e2e_s) if settled else None,
            "slo": settled.slo_outcome if settled else None,
            "handover_s": _rounded(settled.handover_s) if settled else None,
            "pipe_ahead": settled.pipe_ahead if settled else None,
        }


def _iso(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)


class AccessLog:
    """Writes entries through the `slaq.access` logger: a line of JSON each, nothing else on it."""

    def __init__(self, fmt: AccessLogFormat = "json", stream: TextIO | None = None, *, failure_lines: FailureLines | None = None) -> None:
        if fmt not in ACCESS_LOG_FORMATS:
            raise ValueError(f"access log format must be one of {', '.join(ACCESS_LOG_FORMATS)}, got {fmt!r}")
        self.enabled = fmt == "json"
        self.failure_lines = failure_lines  # None: every line is written
        self.logger = logging.getLogger(LOGGER_NAME)
        if self.enabled and stream is not None:
            self.attach(stream)

    def attach(self, stream: TextIO = sys.stdout) -> None:
        """Send the lines to `stream` only (not to the root logger's format, which would prefix them)."""
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(message)s"))
        self.logger.handlers = [handler]
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False

    def write(self, entry: AccessEntry) -> None:
        if not self.enabled:
            return
        if self.failure_lines is not None and entry.reason in SAMPLED_REASONS:
            if not self.failure_lines.admit(client_key(entry.client or ""), entry.arrival, entry.reason):
                return
        self.logger.info(json.dumps(entry.record(), separators=(",", ":")))

    def flush(self, now: float, everything: bool = False) -> None:
        """Write the summary line of each sampling window ended by `now` (wall clock) that left lines
        out; `everything`: of every window (at shutdown)."""
        if not self.enabled or self.failure_lines is None:
            return
        for ended in self.failure_lines.flush(now, everything):
            record = {"time": _iso(now), "event": SUPPRESSED_EVENT, **ended, "from": _iso(ended["from"]), "until": _iso(ended["until"])}
            self.logger.info(json.dumps(record, separators=(",", ":")))
