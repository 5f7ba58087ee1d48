"""The engine side: an httpx streaming client, and an observer that reads the bytes going past.

Bytes are forwarded as they arrive, a server-sent-event stream in whole events (vLLM writes each
event in one piece, so this holds nothing back in practice); the observer only notes when the
first token went by, counts streamed token events, and keeps a bounded tail of the body to read
the `usage` object vLLM puts at the end of a response. Nothing is buffered beyond that.
"""

from __future__ import annotations

import itertools
import json
import re
import ssl
from typing import Callable, Mapping

import httpx

from slaq.sidecar.errors import EngineTimeout, EngineUnavailable

# A completion chunk is a token even with an empty text: vLLM streams a token that detokenizes to
# nothing yet (part of a UTF-8 character) with its token id and text "", and its own benchmark counts
# that chunk as the first token. A chat chunk with empty content is the role chunk vLLM sends before
# any token.
_TOKEN_EVENT = re.compile(rb'"text":\s?"|"(?:content|reasoning_content|reasoning)":\s?"(?!")|"tool_calls":\s?\[\{')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s?(\d+)')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens":\s?(\d+)')
_DONE_EVENT = b"data: [DONE]"
TAIL_BYTES = 4096
USAGE_OVERLAP_BYTES = 64  # longer than any `"completion_tokens": N`

# Headers are allowlisted both ways. Towards the engine only what it needs to parse the body and
# trace context: every other header vLLM reads (X-Request-Id, X-data-parallel-rank, X-Session-ID,
# endpoint-load-metrics-format, ...) would let a tenant steer the engine. The sidecar sets the
# engine's request id itself (`REQUEST_ID_HEADER`). Back to the client only the content type: the
# engine's other headers (endpoint-load-metrics: the pod's KV use and queue) are the pod's business.
ENGINE_REQUEST_HEADERS = ("content-type", "accept", "traceparent", "tracestate")
CLIENT_RESPONSE_HEADERS = ("content-type",)
REQUEST_ID_HEADER = "x-request-id"
_USAGE = b'"usage"'
_USAGE_ONLY_EVENT = re.compile(rb'"choices":\s?\[\]')
_USAGE_OBJECT = re.compile(rb'"usage":\s?\{')
# The usage object of a chunk that has choices (continuous usage), with its one level of nested details.
_CHUNK_USAGE = re.compile(rb',\s?"usage":\s?\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}')
_CHOICE_INDEX = re.compile(rb'"choices":\s?\[\{"index":\s?(\d+)')


class ResponseObserver:
    """Watches response bytes: first token time, streamed token count, usage from the tail."""

    __slots__ = ("streaming", "first_token", "token_events", "answered", "tokens_per_event", "max_output", "_carry", "_tail",
                 "_completion_tokens", "_prompt_tokens", "_final_usage", "_per_choice")

    def __init__(self, streaming: bool, *, tokens_per_event: int = 1, max_output: int | None = None) -> None:
        self.streaming = streaming
        # vLLM sends one event per `stream_interval` tokens (the last may hold fewer): without usage the
        # count of token events times it is an upper bound of the output, capped at what was asked for.
        self.tokens_per_event = max(1, tokens_per_event)
        self.max_output = max_output
        self.first_token = False
        self.token_events = 0
        self.answered = False  # the stream's closing `data: [DONE]` went past: the client has the whole answer
        self._carry = b""
        self._tail = b""  # the end of the bytes seen, so a count cut between two chunks is still read
        self._completion_tokens: int | None = None  # the last usage counts that went past
        self._prompt_tokens: int | None = None
        self._final_usage = False  # the stream's usage-only chunk went past: `_completion_tokens` is the total
        self._per_choice: dict[int, int] = {}  # continuous usage: each choice's count as of its last chunk

    def feed(self, chunk: bytes) -> bool:
        """Note a chunk; True when this chunk carried the response's first token."""
        was_first = self.first_token
        # Usage is read as it goes past, not from the body's end: vLLM writes fields after it
        # (prompt_token_ids, prompt_logprobs) that a tenant can make longer than any tail.
        window = self._tail + chunk
        if (found := _COMPLETION_TOKENS.findall(window)):
            self._completion_tokens = int(found[-1])
        if (found := _PROMPT_TOKENS.findall(window)):
            self._prompt_tokens = int(found[-1])
        self._tail = window[-USAGE_OVERLAP_BYTES:]
        if not self.streaming:
            self.first_token = True
            return not was_first
        data = self._carry + chunk
        events = data.split(b"\n\n")
        self._carry = events.pop()[-TAIL_BYTES:]
        for event in events:
            if _USAGE in event:
                self._note_usage(event)
            if _TOKEN_EVENT.search(event):
                self.token_events += 1
                self.first_token = True
            elif event.strip() == _DONE_EVENT:
                self.answered = True
        return self.first_token and not was_first

    def _note_usage(self, event: bytes) -> None:
        if _USAGE_ONLY_EVENT.search(event):
            self._final_usage = True
        elif (counted := _COMPLETION_TOKENS.search(event)) and (choice := _CHOICE_INDEX.search(event)):
            # vLLM's continuous usage: the chunk's own choice's tokens so far, those no chunk showed included.
            self._per_choice[int(choice[1])] = int(counted[1])

    def output_tokens(self) -> int | None:
        """vLLM's own count when the body carried usage; else, for a stream cut before its usage chunk
        (by the client or the engine), the engine's count as of its last chunk when the chunks carried
        usage (hidden reasoning and tool-call control tokens included), or the sidecar's own count of
        what went past: token events × tokens per event, at most `max_output`, whichever is larger.
        None when nothing is known."""
        if not self.streaming or self._final_usage or (self._completion_tokens is not None and not self._per_choice):
            return self._completion_tokens
        streamed = self.token_events * self.tokens_per_event
        if self.max_output is not None:
            streamed = min(streamed, self.max_output)
        counted = max(sum(self._per_choice.values()), streamed)
        return counted or None

    def prompt_tokens(self) -> int | None:
        return self._prompt_tokens


class EventFramer:
    """Cuts a server-sent-event stream at event boundaries.

    When the engine's stream breaks, what the client has is whole events, so the error event the
    sidecar appends (`broken_stream_event`) parses, and no half token event reaches the client. An
    event longer than `limit` bytes is passed on as it comes (framing is given up for that
    stream), so a misbehaving upstream cannot make the sidecar buffer without bound.
    """

    __slots__ = ("enabled", "limit", "_pending")

    def __init__(self, enabled: bool, limit: int = 1 << 20) -> None:
        self.enabled = enabled
        self.limit = limit
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to forward now: every whole event received so far."""
        if not self.enabled:
            return chunk
        data = self._pending + chunk
        end = data.rfind(b"\n\n") + 2
        if end < 2:
            if len(data) > self.limit:
                self.enabled, self._pending = False, b""
                return data
            self._pending = data
            return b""
        self._pending = data[end:]
        return data[:end]

    def rest(self) -> bytes:
        """What is left when the stream ended normally (an upstream that ended without a blank line)."""
        rest, self._pending = self._pending, b""
        return rest


def broken_stream_event(message: str) -> bytes:
    """The SSE event that ends a stream the engine broke: vLLM's in-stream error shape plus the
    sidecar's `reason`, and no `[DONE]`, so an OpenAI client raises instead of taking a cut
    answer as complete."""
    error = {"object": "error", "message": message, "type": "engine_stream_broken", "param": None, "code": 502}
    return b"data: " + json.dumps({"error": error, "reason": "engine_stream_broken"}).encode() + b"\n\n"


def is_event_stream(headers: httpx.Headers) -> bool:
    return headers.get("content-type", "").split(";")[0].strip().lower() == "text/event-stream"


def forward_request_headers(headers: Mapping[str, str], request_id: str) -> dict[str, str]:
    """The engine's request headers: the allowlisted client headers (names lower-case) and the sidecar's request id."""
    forwarded = {name: headers[name] for name in ENGINE_REQUEST_HEADERS if name in headers}
    forwarded[REQUEST_ID_HEADER] = request_id
    return forwarded


def forward_response_headers(headers: httpx.Headers, request_id: str) -> list[tuple[bytes, bytes]]:
    forwarded = [(name.encode(), headers[name].encode("latin-1")) for name in CLIENT_RESPONSE_HEADERS if name in headers]
    forwarded.append((REQUEST_ID_HEADER.encode(), request_id.encode()))
    return forwarded


def client_usage_filter(include_usage: bool, continuous_usage: bool, forced_continuous: bool) -> Callable[[bytes], bytes] | None:
    """What comes out of a stream's whole events before the client sees them: the usage the sidecar asked
    the engine for on the client's behalf (the usage-only chunk, and the usage in every chunk when it
    forced continuous usage). None: the events go through as they are."""
    strip_chunks = forced_continuous and not continuous_usage
    if include_usage and not strip_chunks:
        return None

    def client_view(events: bytes) -> bytes:
        if not include_usage:
            events = drop_usage_events(events)
        if strip_chunks and _USAGE in events:
            events = b"\n\n".join(event if _USAGE_ONLY_EVENT.search(event) else _CHUNK_USAGE.sub(b"", event, count=1)
                                  for event in events.split(b"\n\n"))
        return events

    return client_view


def drop_usage_events(events: bytes) -> bytes:
    """Whole SSE events without the usage-only chunk (no choices, a usage object) the sidecar asked
    the engine for on behalf of a client that did not."""
    if _USAGE not in events:
        return events
    kept = [event for event in events.split(b"\n\n") if not (_USAGE_OBJECT.search(event) and _USAGE_ONLY_EVENT.search(event))]
    return b"\n\n".join(kept)


# vLLM's server closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds (5 by default).
# httpx also keeps idle connections 5 s by default, so a request could be written to a connection
# the engine was closing at that moment and fail with ReadError (seen: 2 requests of a full test
# run answered 503). Idle connections are dropped well before the engine would close them.
ENGINE_KEEP_ALIVE_S = 5.0
IDLE_CONNECTION_EXPIRY_S = 2.0


class _EngineTransport(httpx.AsyncHTTPTransport):
    """httpx's transport, with one failure of the layers below it made httpx's own.

    Under uvloop a transport's socket reads None once the peer has reset the connection, and
    httpcore 1.0 looks at a new connection's socket (through anyio) before any read would have
    failed: a connection reset right after its connect (an engine killed with connections still in
    its accept backlog) raised AttributeError out of httpx, and the client got a bare 500 where it
    should have got 503 (CI: the engine-kill test), and a health probe that met it would have ended
    the monitor's loop."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except AttributeError as exc:
            raise httpx.ConnectError(f"connection reset as it opened ({exc})", request=request) from exc


class EngineClient:
    """Pooled HTTP/1.1 clients to the engine inside the pod.

    httpcore 1.0's pool does work quadratic in its number of idle connections on every request
    (`_assign_requests_to_connections` counts idle connections once per idle connection), which
    at 200 concurrent streams cost more CPU than everything else in the sidecar. Requests are
    therefore spread round-robin over `shards` small pools.
    """

    def __init__(self, base_url: str, *, shards: int = 16, connections_per_shard: int = 256, connect_timeout_s: float = 5.0,
                 idle_expiry_s: float = IDLE_CONNECTION_EXPIRY_S, engine_idle_s: float | None = 300.0) -> None:
        self.base_url = base_url.rstrip("/")
        tls = ssl.create_default_context()  # loaded once: each client would load the CA bundle again (~60 ms)
        self.clients = [
            httpx.AsyncClient(
                base_url=self.base_url,
                # read: the engine silent this long (no headers, no byte of the stream) ends the request.
                timeout=httpx.Timeout(connect=connect_timeout_s, read=engine_idle_s, write=60.0, pool=None),
                transport=_EngineTransport(verify=tls, limits=httpx.Limits(max_connections=connections_per_shard,
                                                                             max_keepalive_connections=connections_per_shard,
                                                                             keepalive_expiry=idle_expiry_s)),
            )
            for _ in range(max(1, shards))
        ]
        self._next = itertools.cycle(self.clients)

    @property
    def client(self) -> httpx.AsyncClient:
        """The client for control requests (health, metrics)."""
        return self.clients[0]

    async def open(self, method: str, path: str, *, body: bytes | None, headers: Mapping[str, str]) -> httpx.Response:
        """Send a request and return the response with its body still streaming."""
        client = next(self._next)
        request = client.build_request(method, path, content=body, headers=headers)
        try:
            return await client.send(request, stream=True)
        except httpx.ReadTimeout as exc:
            raise EngineTimeout(f"engine at {self.base_url} sent no answer within its idle timeout", retry_after_s=1.0) from exc
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise EngineUnavailable(f"engine at {self.base_url} unreachable: {type(exc).__name__}", retry_after_s=1.0) from exc

    async def get(self, path: str, timeout_s: float) -> httpx.Response:
        return await self.client.get(path, timeout=timeout_s)

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()
