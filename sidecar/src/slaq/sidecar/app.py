"""The HTTP layer: a pure ASGI application over `SidecarCore` (no framework middleware).

It reads bodies (bounded), routes, turns `SidecarError`s into responses through
`errors.refusal` (the one mapping), and streams engine responses through byte for byte. This is
the tenant port: the OpenAI API, /health and /ready. Metrics and usage are on the metrics port
(`metrics_port.py`), out of tenants' reach. Every request but the probes gets an access-log line
(lines of failed authentication sampled per client address: access.py).

Before a request is routed its head is checked (`head_problem`): over the protocol's byte or count
cap (connections.py) is 431, a header that must appear once (`SINGLETON_HEADERS`) appearing twice is
400: two `Authorization` headers are never resolved by order. A client address with too many failed
authentications lately is refused before its key is looked at (auth_failures.py), and an engine
that stopped answering its health checks refuses new requests at once (monitor.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from http import HTTPStatus
from typing import Any, Awaitable, Callable

import httpx

from slaq.api.runtime import HEALTH_PATH, READY_PATH
from slaq.sidecar.access import AccessEntry, AccessLog
from slaq.sidecar.addresses import TrustedProxies, peer_address
from slaq.sidecar.arrival import door_wait_s
from slaq.sidecar.auth_failures import AuthFailures
from slaq.sidecar.connections import HEAD_REFUSAL, ConnectionLimits, client_key
from slaq.sidecar.errors import (
    AuthThrottled,
    BodyTimeout,
    BodyTooLarge,
    DuplicateHeader,
    EngineTimeout,
    EngineUnavailable,
    HeadersTooLarge,
    MethodNotAllowed,
    NotFound,
    SidecarError,
    Unauthorized,
    UnsupportedMediaType,
    http_status,
    refusal,
)
from slaq.sidecar.metrics_port import MetricsApp
from slaq.sidecar.monitor import EngineMonitor, watch_table
from slaq.sidecar.proxy import (
    EngineClient,
    EventFramer,
    ResponseObserver,
    REQUEST_ID_HEADER,
    broken_stream_event,
    client_usage_filter,
    forward_request_headers,
    forward_response_headers,
    is_event_stream,
)
from slaq.sidecar.service import Flight, SidecarCore
from slaq.sidecar.tenants import FAIRNESS_ID_HEADER, SLO_TPOT_HEADER, SLO_TTFT_HEADER, Identity

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

INFERENCE_ROUTES = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
ENGINE_ERROR_BODY_LIMIT = 1024 * 1024
PROBE_PATHS = frozenset({HEALTH_PATH, READY_PATH})  # kubelet asks every few seconds: not audited
CLIENT_CLOSED = 499
DRAIN_TIMEOUT = "drain_timeout"  # the access log's reason for a request cut when the drain ran out (503)
# Headers read as one value: a second copy would be resolved by order (the last one wins in
# `_headers`), so a request carrying one twice is refused instead.
SINGLETON_HEADERS = frozenset({b"authorization", b"content-type", b"content-length", b"host",
                               *(h.encode() for h in (FAIRNESS_ID_HEADER, SLO_TTFT_HEADER, SLO_TPOT_HEADER))})
ENGINE_DOWN_RETRY_S = 1.0
ACCESS_FLUSH_S = 1.0  # how often the sampled access lines' summaries are written


async def _send_bytes(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await _send_bytes(send, status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body)


class _AnswerStarted:
    """The app's `send`, noting whether the response has started (a failure after that cannot be answered)."""

    __slots__ = ("send", "started")

    def __init__(self, send: Send) -> None:
        self.send, self.started = send, False

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)


async def _send_refusal(send: Send, error: SidecarError, request_id: str) -> None:
    status, headers, body = refusal(error)
    await _send_bytes(send, status, [*headers, (REQUEST_ID_HEADER.encode(), request_id.encode())], body)


def head_problem(scope: Scope) -> SidecarError | None:
    """Why the request's head is refused before routing: over a cap the protocol counted, or a
    singleton header sent more than once; None when it is fine."""
    too_large = scope.get(HEAD_REFUSAL)
    if too_large is not None:
        return HeadersTooLarge(too_large)
    seen: set[bytes] = set()
    for name, _ in scope["headers"]:
        if name in SINGLETON_HEADERS:
            if name in seen:
                return DuplicateHeader(f"the {name.decode('latin-1')} header appears more than once")
            seen.add(name)
    return None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def _read_body(receive: Receive, limit: int, timeout_s: float) -> bytes:
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_bounded(receive, limit)
    except TimeoutError:
        raise BodyTimeout(f"request body not received within {timeout_s:g} s") from None


async def _read_bounded(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError("client disconnected while sending the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class SidecarApp:
    """The tenant port's app; `metrics_app` is the metrics port's, over the same core and engine."""

    def __init__(
        self,
        core: SidecarCore,
        engine: EngineClient,
        *,
        max_body_bytes: int | None = None,
        monitor_interval_s: float = 0.25,
        access: AccessLog | None = None,
        connection_limits: ConnectionLimits = ConnectionLimits(),
        trusted_proxies: TrustedProxies = TrustedProxies(),
        auth_failures: AuthFailures | None = None,
        engine_health_timeout_s: float | None = None,
    ) -> None:
        self.core = core
        self.engine = engine
        self.max_body_bytes = max_body_bytes or core.config.limits.max_body_bytes
        self.connection_limits = connection_limits
        self.trusted_proxies = trusted_proxies
        self.monitor = EngineMonitor(engine, core, interval_s=monitor_interval_s,
                                     **({} if engine_health_timeout_s is None else {"health_timeout_s": engine_health_timeout_s}))
        self.access = access or AccessLog()
        self.auth_failures = auth_failures if auth_failures is not None else AuthFailures()
        self.metrics_app = MetricsApp(core, engine)
        self._tasks: list[asyncio.Task] = []
        self._works: set[asyncio.Task] = set()  # each request's work (`_inference`), until it ends

    # ASGI entry ----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            peer = peer_address(scope)
            # Arrival is when the request's first byte reached the host (arrival.py), so TTFT, the
            # access log and SLO outcomes include the wait at the door, not only what follows the body.
            arrival = self.core.clock() - door_wait_s(scope)
            entry = AccessEntry(scope["method"], scope["path"], arrival, request_id=uuid.uuid4().hex,
                                client=self.trusted_proxies.client(peer, scope["headers"]), peer=peer)
            answer = _AnswerStarted(send)
            try:
                problem = head_problem(scope)
                if problem is not None:
                    raise problem
                await self._route(scope, receive, answer, entry)
            except SidecarError as error:
                entry.status, entry.reason = http_status(error), error.reason
                await _send_refusal(send, error, entry.request_id)
            except Exception:
                # A defect, not a refusal: its traceback is logged under the request id, the access log
                # says 500 internal_error, and a client not yet answered gets the refusals' JSON shape
                # (not the server's bare 500); one mid-answer has its connection closed.
                log.exception("request %s failed inside the sidecar", entry.request_id)
                entry.status, entry.reason = HTTPStatus.INTERNAL_SERVER_ERROR.value, SidecarError.reason
                if answer.started:
                    raise
                await _send_refusal(send, SidecarError(f"the sidecar failed on this request (logged under request id {entry.request_id})"),
                                    entry.request_id)
            finally:
                if entry.path not in PROBE_PATHS:
                    self.access.write(entry)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        self.core.directory.refresh()
        await self.monitor.poll_once()
        self._tasks = [asyncio.create_task(self.monitor.run()), asyncio.create_task(watch_table(self.core)),
                       asyncio.create_task(self._flush_access())]
        if self.core.shared_quotas is not None:
            self._tasks.append(asyncio.create_task(self.core.shared_quotas.run()))  # heartbeats, and probes of a lost store

    async def shutdown(self) -> None:
        # Requests still at work when the server's drain ran out (uvicorn cancels their tasks and
        # goes on without waiting): each ends here, its quota settled and its line logged, before
        # the engine client and the quota store close under it.
        works = list(self._works)
        for work in works:
            work.cancel()
        await asyncio.gather(*works, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.access.flush(time.time(), everything=True)
        await self.engine.aclose()
        if self.core.shared_quotas is not None:
            await self.core.shared_quotas.aclose()
        self.core.parsers.close()
        self.core.counter.close()

    async def _flush_access(self) -> None:
        while True:
            await asyncio.sleep(ACCESS_FLUSH_S)
            now = time.time()
            self.access.flush(now)
            self.auth_failures.prune(self.core.clock())

    def ready(self) -> bool:
        return self.monitor.ready and self.core.directory.loaded and not self.core.draining

    # routing -------------------------------------------------------------------------------

    async def _route(self, scope: Scope, receive: Receive, send: Send, entry: AccessEntry) -> None:
        path, method = scope["path"], scope["method"]
        if path == HEALTH_PATH:
            await _send_json(send, 200, {"status": "ok"})
        elif path == READY_PATH:
            ready = self.ready()
            await _send_json(send, 200 if ready else 503, {
                "ready": ready, "engine": self.monitor.ready, "tenant_table": self.core.directory.loaded,
                "draining": self.core.draining, "table_error": self.core.directory.last_error,
            })
        elif path in INFERENCE_ROUTES:
            if method != "POST":
                raise MethodNotAllowed(f"{path} accepts POST")
            await self._inference(scope, receive, send, INFERENCE_ROUTES[path], entry)
        elif path == "/v1/models":
            if method != "GET":
                raise MethodNotAllowed(f"{path} accepts GET")
            entry.identity = self._identify(_headers(scope), entry)
            await self._passthrough(scope, send, entry)
        else:
            raise NotFound(f"no route {method} {path}")

    def _identify(self, headers: dict[str, str], entry: AccessEntry) -> Identity:
        """The tenant the key names, unless the client's address failed too often lately."""
        address, now = client_key(entry.client or ""), self.core.clock()
        retry_after = self.auth_failures.retry_after(address, now)
        if retry_after is not None:
            error = AuthThrottled(f"{self.auth_failures.limits.limit} failed authentications from {address} within "
                                  f"{self.auth_failures.limits.window_s:g} s", retry_after_s=retry_after)
            self.core.refused(error, None)
            raise error
        try:
            return self.core.identify(headers)
        except Unauthorized:
            self.auth_failures.failed(address, now)
            raise

    async def _passthrough(self, scope: Scope, send: Send, entry: AccessEntry) -> None:
        response = await self.engine.open("GET", scope["path"], body=None, headers={})
        entry.status = response.status_code
        try:
            await send({"type": "http.response.start", "status": response.status_code, "headers": forward_response_headers(response.headers, entry.request_id)})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    # inference -----------------------------------------------------------------------------

    async def _inference(self, scope: Scope, receive: Receive, send: Send, kind: str, entry: AccessEntry) -> None:
        headers = _headers(scope)
        identity = entry.identity = self._identify(headers, entry)
        if not self.monitor.ready:
            error = EngineUnavailable(f"the engine did not answer its health check within {self.monitor.health_timeout_s:g} s",
                                      retry_after_s=ENGINE_DOWN_RETRY_S)
            self.core.refused(error, identity)
            raise error
        await self.core.precheck(identity)  # a tenant at its limit is refused before its body costs anything
        try:
            content_type = headers.get("content-type", "application/json").split(";")[0].strip().lower()
            if content_type not in ("application/json", ""):
                raise UnsupportedMediaType(f"content-type must be application/json, got {content_type!r}")
            raw = await _read_body(receive, self.max_body_bytes, self.connection_limits.body_s)
        except SidecarError as error:
            self.core.refused(error, identity)
            raise
        # The client may go away while queued or streaming: stop the work (which frees the queue
        # slot, or closes the engine connection so vLLM aborts the request) instead of finishing it.
        work = asyncio.ensure_future(self._serve(scope, send, entry, identity, kind, headers, raw))
        self._works.add(work)
        work.add_done_callback(self._works.discard)
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server cancels this request (its drain ran out): the work ends with it
            entry.reason = DRAIN_TIMEOUT
            work.cancel()
            gone.cancel()
            await asyncio.gather(work, gone, return_exceptions=True)
            raise
        if work.done():
            gone.cancel()
            try:
                work.result()
            except TimeoutError:
                # The client stopped reading: returning with the response unfinished makes uvicorn close the connection.
                entry.status, entry.reason = CLIENT_CLOSED, "client_write_timeout"
            return
        entry.status, entry.reason = CLIENT_CLOSED, "client_closed"
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work

    async def _serve(self, scope: Scope, send: Send, entry: AccessEntry, identity: Identity, kind: str, headers: dict[str, str], raw: bytes) -> None:
        started = time.perf_counter()
        flight = entry.flight = await self.core.admit(identity, kind, raw, arrival=entry.arrival)  # type: ignore[arg-type]
        observer = ResponseObserver(flight.payload.stream, tokens_per_event=flight.payload.tokens_per_event, max_output=flight.payload.max_output)
        status = CLIENT_CLOSED  # unless the response completes
        refund = False  # the engine produced nothing: it refused the request or was never reached
        try:
            status, entry.reason = await self._stream(scope, send, flight, headers, observer, started, entry.request_id)
            entry.status = status
            refund = status >= 400 and entry.reason != "engine_stream_broken"
        except EngineUnavailable as error:
            self.core.refused(error, identity)
            # Unreachable: the engine never had it. Timed out: it may have worked on it all along.
            status, refund = http_status(error), not isinstance(error, EngineTimeout)
            raise
        except (SidecarError, TimeoutError):  # refused, or the client stopped reading (`_inference`): as set above
            raise
        except Exception:
            status = HTTPStatus.INTERNAL_SERVER_ERROR.value  # a defect (logged by the caller): the reservation stands
            raise
        except asyncio.CancelledError:
            # The client went away; one that read the closing [DONE] first (and may well close before
            # the engine's stream has ended) got the whole answer: it counts as answered, with its outcome.
            if observer.answered:
                status = HTTPStatus.OK.value
                entry.status, entry.reason = status, None
            elif entry.reason == DRAIN_TIMEOUT:  # not the client: the pod's drain ran out (`_inference`)
                status = entry.status = HTTPStatus.SERVICE_UNAVAILABLE.value
            raise
        finally:
            self.core.finish(
                flight,
                # A stream cut after tokens went past (the client left before the usage chunk, the
                # engine broke, the drain ran out) is charged what the sidecar counted; an engine
                # refusal carries none.
                output_tokens=(observer.output_tokens() if status < 400 or status in (CLIENT_CLOSED, 502) or entry.reason == DRAIN_TIMEOUT
                               else None),
                engine_prompt_tokens=observer.prompt_tokens(),
                status=status,
                refund=refund,
            )

    async def _stream(self, scope: Scope, send: Send, flight: Flight, headers: dict[str, str], observer: ResponseObserver, started: float,
                      request_id: str) -> tuple[int, str | None]:
        """Forward the engine's answer; returns its status and, for a failure, the access log's reason.
        A write the client leaves unread for `write_idle_s` raises TimeoutError."""
        # The sidecar's own share of TTFT: its work before the request leaves (queue wait excluded)
        # plus forwarding the first token; everything else is the engine's or the network's.
        before_engine = time.perf_counter() - started - flight.entry.queue_wait_s
        response = await self._open_engine(scope["path"], self.core.enriched_body(flight, request_id), forward_request_headers(headers, request_id))
        try:
            if response.status_code >= 400:
                await self._engine_error(send, response, request_id)
                if not observer.first_token:
                    observer.first_token = True
                    self.core.first_token(flight)
                return response.status_code, f"engine_{response.status_code}"
            await send({"type": "http.response.start", "status": response.status_code, "headers": forward_response_headers(response.headers, request_id)})
            framer = EventFramer(observer.streaming and is_event_stream(response.headers))
            payload = flight.payload
            client_view = client_usage_filter(payload.include_usage, payload.continuous_usage, payload.hides_tokens) if observer.streaming else None
            write_idle_s = self.connection_limits.write_idle_s
            loop = asyncio.get_running_loop()
            try:
                async for chunk in response.aiter_raw():
                    received = time.perf_counter()
                    first = observer.feed(chunk)
                    if first:
                        self.core.first_token(flight)
                    whole = framer.feed(chunk)
                    if whole and client_view is not None:
                        whole = client_view(whole)
                    if whole:
                        async with asyncio.timeout_at(loop.time() + write_idle_s):
                            await send({"type": "http.response.body", "body": whole, "more_body": True})
                    if first:
                        self.core.metrics.added.observe(max(0.0, before_engine) + time.perf_counter() - received)
            except httpx.HTTPError as exc:
                # Headers are gone already: end the stream on an event boundary with an error event
                # (a non-streaming body just ends short, which its JSON parser notices).
                log.warning("engine stream broke for tenant %s: %s", flight.identity.tenant.name, exc)
                tail = broken_stream_event(f"the engine stream broke: {type(exc).__name__}") if framer.enabled else b""
                await send({"type": "http.response.body", "body": tail})
                return 502, "engine_stream_broken"
            rest = framer.rest()
            async with asyncio.timeout_at(loop.time() + write_idle_s):
                await send({"type": "http.response.body", "body": client_view(rest) if client_view is not None else rest})
            return response.status_code, None
        finally:
            await response.aclose()

    async def _open_engine(self, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        """The engine's response (headers read), or EngineUnavailable once the engine stops answering
        its health checks without having answered one since this request was sent (monitor.py)."""
        sent = time.monotonic()
        opening = asyncio.ensure_future(self.engine.open("POST", path, body=body, headers=headers))
        stopped = asyncio.ensure_future(self.monitor.stopped_answering(sent))
        try:
            await asyncio.wait((opening, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not opening.done():
                opening.cancel()
                await asyncio.wait((opening,))  # its connection closed (vLLM aborts the request if it ever reads it)
        if opening.cancelled():
            raise EngineUnavailable(f"the engine stopped answering its health check ({self.monitor.health_timeout_s:g} s) "
                                    "after this request was sent", retry_after_s=ENGINE_DOWN_RETRY_S)
        return opening.result()

    async def _engine_error(self, send: Send, response: httpx.Response, request_id: str) -> None:
        """Engine refusals get the sidecar's `reason` too (`engine_<status>`), keeping the engine's message."""
        raw = b""
        async for chunk in response.aiter_raw():
            raw += chunk
            if len(raw) > ENGINE_ERROR_BODY_LIMIT:
                break
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = {"error": {"message": raw[:2000].decode("utf-8", "replace")}}
        if not isinstance(payload, dict):
            payload = {"error": payload}
        payload.setdefault("reason", f"engine_{response.status_code}")
        body = json.dumps(payload).encode()
        await _send_bytes(send, response.status_code, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                                       (REQUEST_ID_HEADER.encode(), request_id.encode())], body)
