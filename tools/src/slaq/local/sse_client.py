"""A light client for one streaming completion: its status, when its first token came, whether it ended.

The demo's load generator runs at the lowest CPU priority on a machine whose cores the engine and
the sidecar keep busy, so whatever CPU it spends per request shows up as its own waiting in the
TTFT it reports. httpx spent about 10 ms of CPU per 16-token streamed request on this project's
two-core machine (half of it in per-token line handling); this client spends a fraction of that:
an `asyncio.Protocol` over one connection (`Connection: close`), the HTTP/1.1 head and chunked
framing decoded by hand, the first server-sent event with a choice parsed as JSON and nothing
after it. With `lazy_after_first_token`, reading pauses after the first token and resumes every
LAZY_READ_S, so the rest of the stream arrives in a few reads instead of one wake-up per token
(the end time is then known to within LAZY_READ_S).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from slaq.sse import DONE, sse_data

LAZY_READ_S = 0.25
DONE_EVENT = b"[DONE]"  # looked for in the stream's last bytes after the first token


@dataclass
class StreamResult:
    status: int | None = None
    first_token_at: float | None = None  # time.monotonic() when the first event with a choice was read
    ended_at: float | None = None  # time.monotonic() when the response ended (or broke)
    done: bool = False  # the stream ended with its [DONE] event
    error: str | None = None
    request_id: str | None = None  # the response's x-request-id (the sidecar's id for the request)


class ChunkedDecoder:
    """HTTP/1.1 chunked transfer coding, fed in pieces: `feed` returns the payload bytes it could
    decode; `ended` is set by the last (empty) chunk."""

    def __init__(self) -> None:
        self._pending = b""
        self._left = 0  # payload bytes left in the current chunk
        self._crlf = 0  # bytes of the CRLF after the current chunk's payload still to skip
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        out = []
        data = self._pending + data
        self._pending = b""
        at = 0
        while at < len(data) and not self.ended:
            if self._left:
                take = min(self._left, len(data) - at)
                out.append(data[at:at + take])
                at += take
                self._left -= take
                if not self._left:
                    self._crlf = 2
            elif self._crlf:
                skip = min(self._crlf, len(data) - at)
                at += skip
                self._crlf -= skip
            else:
                line_end = data.find(b"\r\n", at)
                if line_end < 0:
                    self._pending = data[at:]
                    break
                size = int(data[at:line_end].split(b";", 1)[0], 16)
                at = line_end + 2
                if size == 0:
                    self.ended = True
                else:
                    self._left = size
        return b"".join(out)


def _event_data(event: bytes) -> Any:
    """A server-sent event's data (`slaq.sse.sse_data` of its `data:` line): DONE, a parsed chunk,
    or None (no data line, or one that is not JSON)."""
    for line in event.split(b"\n"):
        try:
            data = sse_data(line)
        except ValueError:
            return None
        if data is not None:
            return data
    return None


class _StreamProtocol(asyncio.Protocol):
    def __init__(self, request: bytes, on_first_token: Callable[[], None] | None, lazy: bool) -> None:
        self._request = request
        self._on_first_token = on_first_token
        self._lazy = lazy
        self._head: bytes | None = None
        self._raw = b""  # bytes before the head is complete
        self._body_left: int | None = None  # Content-Length bodies
        self._chunked: ChunkedDecoder | None = None
        self._events = b""  # decoded payload not yet split into events (until the first token)
        self._tail = b""  # the decoded payload's last bytes (after the first token)
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self.result = StreamResult()
        self.finished: asyncio.Future[None] = self._loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        if self._head is None:
            self._raw += data
            end = self._raw.find(b"\r\n\r\n")
            if end < 0:
                return
            self._head, data = self._raw[:end], self._raw[end + 4:]
            self._raw = b""
            self._read_head(self._head)
        if self._chunked is not None:
            payload = self._chunked.feed(data)
            ended = self._chunked.ended
        else:
            payload = data
            if self._body_left is not None:
                payload = data[:self._body_left]
                self._body_left -= len(payload)
            ended = self._body_left == 0
        self._payload(payload)
        if ended:
            self._end()
        elif self._lazy and self.result.first_token_at is not None and self._transport is not None:
            # Whatever comes in the next LAZY_READ_S waits in the socket and is read in one go.
            self._transport.pause_reading()
            self._loop.call_later(LAZY_READ_S, self._read_again)

    def _read_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.result.status = int(lines[0].split(b" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                self._chunked = ChunkedDecoder()
            elif name == b"content-length":
                self._body_left = int(value.strip())
            elif name == b"x-request-id":
                self.result.request_id = value.strip().decode("ascii", "replace")

    def _payload(self, payload: bytes) -> None:
        if self.result.first_token_at is None and self.result.status == 200:
            self._events += payload
            while self.result.first_token_at is None:
                end = self._events.find(b"\n\n")
                if end < 0:
                    return
                event, self._events = self._events[:end], self._events[end + 2:]
                data = _event_data(event)
                if data is DONE:
                    self.result.done = True
                # A chunk with a choice is a token, even with an empty text (a partial UTF-8
                # sequence from the random-weight model).
                elif isinstance(data, dict) and data.get("choices"):
                    self.result.first_token_at = time.monotonic()
                    if self._on_first_token is not None:
                        self._on_first_token()
            payload, self._events = self._events, b""
        self._tail = (self._tail + payload)[-32:]
        if DONE_EVENT in self._tail:
            self.result.done = True

    def _read_again(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def _end(self) -> None:
        if self.result.ended_at is None:
            self.result.ended_at = time.monotonic()
        if self._transport is not None:
            self._transport.close()
        if not self.finished.done():
            self.finished.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.result.ended_at is None:  # not ended by its framing
            delimited_by_close = self._head is not None and self._body_left is None and self._chunked is None
            if not delimited_by_close and self.result.error is None:
                self.result.error = f"{type(exc).__name__}: {exc}" if exc else "the connection closed before the response ended"
        self._end()

    def abort(self, why: str) -> None:
        self.result.error = self.result.error or why
        if self._transport is not None:
            self._transport.abort()
        self._end()


def request_bytes(url: str, body: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[str, int, bytes]:
    """(host, port, the HTTP/1.1 request) for a JSON POST to `url`."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"not a plain http:// URL: {url!r}")
    port = parts.port or 80
    payload = json.dumps(body, separators=(",", ":")).encode()
    lines = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
             f"Content-Length: {len(payload)}", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    return parts.hostname, port, ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


async def post_stream(url: str, body: Mapping[str, Any], headers: Mapping[str, str], *,
                      on_first_token: Callable[[], None] | None = None, lazy_after_first_token: bool = False,
                      timeout_s: float = 120.0) -> StreamResult:
    """POST `body` as JSON to `url` and read the streamed response (see the module doc). A refused
    connection, a broken stream or the timeout is a result (`error` set), not an exception."""
    host, port, request = request_bytes(url, body, headers)
    loop = asyncio.get_running_loop()
    protocol: _StreamProtocol | None = None
    try:
        async with asyncio.timeout(timeout_s):
            _, protocol = await loop.create_connection(lambda: _StreamProtocol(request, on_first_token, lazy_after_first_token), host, port)
            await protocol.finished
    except (OSError, TimeoutError) as exc:
        why = f"{type(exc).__name__}: {exc}" if str(exc) else f"no answer within {timeout_s:g} s"
        if protocol is None:
            return StreamResult(error=why, ended_at=time.monotonic())
        protocol.abort(why)
    return protocol.result
