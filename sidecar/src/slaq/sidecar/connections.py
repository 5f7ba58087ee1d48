"""Bounds on what one connection may hold: timeouts for each phase of a request, and the connection limit.

A tenant that opens connections and sends nothing, sends a request head or a body slowly, or never
reads its answer, holds sockets, memory and (while queued) a place in line. Each phase has its own
bound, a default and a `slaq sidecar` flag:

    phase                                 bound                       flag                 on expiry
    request head (connection open → head)  `header_s`   10 s          --header-timeout     connection closed
    request body                           `body_s`     30 s          --body-timeout       408 body_timeout, connection closed
    a write the client does not read       `write_idle_s` 30 s        --write-timeout      connection closed (access log: client_write_timeout)
    the engine silent mid-request          `engine_idle_s` 300 s      --engine-idle-timeout 503 before headers, stream ended with engine_stream_broken after
    open connections (both ports)          `max_connections` 2048     --max-connections    503 from uvicorn
    open connections of one client address `max_connections_per_client` 256  --max-connections-per-client  503 and closed
    request head bytes (request line + headers) `max_header_bytes` 16 KiB  --max-header-bytes  431 headers_too_large, closed
    request headers                        `max_headers` 100          --max-headers        431 headers_too_large, closed

The head timeout, the head caps and both connection limits live in the HTTP protocol
(`HeadTimeoutProtocol`): the ASGI app only sees a request once its head is complete. httptools
(llhttp), which parses the head, has no cap of its own on header size or count, so the protocol
counts what the parser hands over and keeps no header past a cap: the request reaches the app
marked (`HEAD_REFUSAL`), and the app answers 431 with a JSON reason and closes the connection. A
head that stays incomplete past the byte cap (one endless header) is answered 431 by the protocol
itself, without waiting for its end. The protocol also stamps each request when its first byte
reached the host (`arrival.py`): the sidecar's TTFT counts from there.

Probes are never refused for the global limit: kubelet's `/health` and `/ready` on the tenant port,
and everything on the metrics port (Prometheus, the operator, a gateway's endpoint picker), are small
and answered without the engine, and a pod whose probes fail for a flood is restarted or taken out of
its Service, which turns the flood into an outage. The per-client cap counts open connections by
peer address (an IPv6 address by its /64, which one host holds whole). Past its cap an address gets a
small probe lane (`PROBE_LANE` connections) that serves only `/health` and `/ready`: behind SNAT
(`externalTrafficPolicy: Cluster`) tenants arrive from the node's address, which is also kubelet's,
and a flood of silent connections from it must not starve the probes. When the lane is full, its
oldest connection still waiting for a head makes room: kubelet sends its request the moment it
connects, so a flooder cannot keep it out without opening connections faster than that.
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from slaq.api.runtime import HEALTH_PATH, READY_PATH
from slaq.sidecar.arrival import ARRIVED, first_byte_stamp
from slaq.sidecar.errors import HeadersTooLarge, refusal

PROBE_PATHS = frozenset({HEALTH_PATH.encode(), READY_PATH.encode()})
PROBE_LANE = 4
HEAD_REFUSAL = "slaq.head_refusal"  # scope key: why the request's head is over a cap (the app refuses it)
HEADER_OVERHEAD = 4  # ": " and CRLF around each header, as on the wire


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_s: float = 10.0
    body_s: float = 30.0
    write_idle_s: float = 30.0
    engine_idle_s: float = 300.0
    max_connections: int = 2048
    # Behind a gateway every tenant shares the gateway's few addresses: raise it to the gateway's
    # connection pool per replica, or 0 (no per-client cap).
    max_connections_per_client: int = 256
    max_header_bytes: int = 16 * 1024  # the request line and every header, as sent
    max_headers: int = 100


def client_key(host: str) -> str:
    """The address a connection is counted under: an IPv4 address, or an IPv6 address's /64."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class ClientConnections:
    """Open connections per client address, for one server (both ports): `per_client` regular ones,
    then a probe lane of `lane` connections that may only ask for a probe."""

    def __init__(self, per_client: int, lane: int = PROBE_LANE) -> None:
        self.per_client = per_client
        self.lane = lane
        self._regular: dict[str, dict[Any, None]] = {}
        self._probe_only: dict[str, dict[Any, None]] = {}

    def opened(self, key: str, connection: "HeadTimeoutProtocol") -> bool | None:
        """Count a new connection: False regular, True probe-only, None refused (close it)."""
        regular = self._regular.setdefault(key, {})
        if not self.per_client or len(regular) < self.per_client:
            regular[connection] = None
            return False
        lane = self._probe_only.setdefault(key, {})
        if len(lane) >= self.lane:
            waiting = next((c for c in lane if c.awaiting_head()), None)
            if waiting is None:
                return None
            del lane[waiting]
            waiting.transport.close()
        lane[connection] = None
        return True

    def closed(self, key: str, connection: "HeadTimeoutProtocol") -> None:
        for table in (self._regular, self._probe_only):
            group = table.get(key)
            if group is not None and group.pop(connection, False) is None and not group:
                del table[key]

    def count(self, key: str) -> int:
        return len(self._regular.get(key, ())) + len(self._probe_only.get(key, ()))


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request head is not complete
    `head_timeout_s` after the connection opened or the previous response ended (uvicorn's own
    keep-alive timer stops at the first byte, so a partial head would hold the socket forever)."""

    head_timeout_s: float = ConnectionLimits.header_s
    clients: ClientConnections | None = None
    max_connections: int | None = None
    exempt_ports: frozenset[int] = frozenset()  # the metrics port: never refused for the global limit

    @classmethod
    def with_limits(cls, limits: ConnectionLimits, exempt_ports: frozenset[int] = frozenset()) -> type["HeadTimeoutProtocol"]:
        """A protocol class for one server: its own per-client table, shared by its connections."""
        return type(cls.__name__, (cls,), {"head_timeout_s": limits.header_s, "max_connections": limits.max_connections,
                                            "clients": ClientConnections(limits.max_connections_per_client), "exempt_ports": exempt_ports,
                                            "max_header_bytes": limits.max_header_bytes, "max_headers": limits.max_headers})

    max_header_bytes: int = ConnectionLimits.max_header_bytes
    max_headers: int = ConnectionLimits.max_headers
    _in_head = False  # between the parser's message begin and headers complete
    _head_bytes = 0  # the head's bytes the parser has handed over (request target and complete headers)
    _head_raw = 0  # bytes received while a head was incomplete: bounds one endless header
    _head_refusal: str | None = None

    _head_timer: asyncio.TimerHandle | None = None
    _counted = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._socket = transport.get_extra_info("socket")
        self._client_key = client_key(self.client[0]) if self.client else ""
        self._probe_only = False
        if self.clients is not None:
            verdict = self.clients.opened(self._client_key, self)
            if verdict is None:
                transport.close()
                return
            self._probe_only = verdict
        self._counted = True
        self._arm_head_timer()

    def awaiting_head(self) -> bool:
        return self._awaiting_head and (self.cycle is None or self.cycle.response_complete)

    def _arm_head_timer(self) -> None:
        self._awaiting_head = True
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _head_timed_out(self) -> None:
        # A request being answered (a pipelined head already parsed) is never cut.
        answering = self.cycle is not None and not self.cycle.response_complete
        if self._awaiting_head and not answering and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_raw += len(data)
        super().data_received(data)
        if self._in_head and self._head_raw > self.max_header_bytes and not self.transport.is_closing():
            self._refuse_head(f"the request head exceeds {self.max_header_bytes} bytes")

    def _refuse_head(self, message: str) -> None:
        """431 for a head still incomplete (no request for the app to answer), then close."""
        status, headers, body = refusal(HeadersTooLarge(message))
        head = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        self.transport.write(b"HTTP/1.1 %d Request Header Fields Too Large\r\n%s\r\n%s" % (status, head, body))
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[ARRIVED] = first_byte_stamp(self._socket)  # type: ignore[literal-required]  # arrival.py
        self._in_head, self._head_bytes, self._head_raw, self._head_refusal = True, 0, 0, None

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        if self._head_bytes > self.max_header_bytes:
            self._head_refusal = self._head_refusal or f"the request head exceeds {self.max_header_bytes} bytes"
            self.url = b"/"  # parsed by uvicorn all the same; the app refuses the request
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + HEADER_OVERHEAD
        if self._head_refusal is None:
            if len(self.headers) >= self.max_headers:
                self._head_refusal = f"the request has more than {self.max_headers} headers"
            elif self._head_bytes > self.max_header_bytes:
                self._head_refusal = f"the request head exceeds {self.max_header_bytes} bytes"
        if self._head_refusal is None:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_refusal is not None:
            self.scope[HEAD_REFUSAL] = self._head_refusal  # type: ignore[literal-required]
        self._awaiting_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
        if self.clients is not None:
            # uvicorn refuses with 503 (and closes) when len(connections) >= limit_concurrency: 0
            # refuses a probe-lane connection anything but a probe, None lets a probe through.
            probe = self.url.split(b"?", 1)[0] in PROBE_PATHS
            if self._probe_only:
                self.limit_concurrency = None if probe else 0
            elif probe or (self.server is not None and self.server[1] in self.exempt_ports):
                self.limit_concurrency = None
            else:
                self.limit_concurrency = self.max_connections
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()

    def connection_lost(self, exc: Any) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        if self.clients is not None and self._counted:
            self.clients.closed(self._client_key, self)
        super().connection_lost(exc)
