"""Bounds on what one connection may hold: timeouts for each phase of a request, and the connection limit.

A tenant that opens connections and sends nothing, sends a request head or a body slowly, or never
reads its answer, holds sockets, memory and (while queued) a place in line. Each phase has its own
bound, a default and a `slaq sidecar` flag:

    phase                                 bound                       flag                 on expiry
    request head (connection open → head)  `header_s`   10 s          --header-timeout     connection closed
    request body                           `body_s`     30 s          --body-timeout       408 body_timeout
    a write the client does not read       `write_idle_s` 30 s        --write-timeout      connection closed (access log: client_write_timeout)
    the engine silent mid-request          `engine_idle_s` 300 s      --engine-idle-timeout 503 before headers, stream ended with engine_stream_broken after
    open connections (both ports)          `max_connections` 2048     --max-connections    503 from uvicorn

The head timeout lives in the HTTP protocol (`HeadTimeoutProtocol`): the ASGI app only sees a
request once its head is complete.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_s: float = 10.0
    body_s: float = 30.0
    write_idle_s: float = 30.0
    engine_idle_s: float = 300.0
    max_connections: int = 2048


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request head is not complete
    `head_timeout_s` after the connection opened or the previous response ended (uvicorn's own
    keep-alive timer stops at the first byte, so a partial head would hold the socket forever)."""

    head_timeout_s: float = ConnectionLimits.header_s

    @classmethod
    def with_timeout(cls, seconds: float) -> type["HeadTimeoutProtocol"]:
        return type(cls.__name__, (cls,), {"head_timeout_s": seconds})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._awaiting_head = True
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _head_timed_out(self) -> None:
        # A request being answered (a pipelined head already parsed) is never cut.
        answering = self.cycle is not None and not self.cycle.response_complete
        if self._awaiting_head and not answering and not self.transport.is_closing():
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._head_timer.cancel()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()

    def connection_lost(self, exc: Any) -> None:
        self._head_timer.cancel()
        super().connection_lost(exc)
