"""A fast fake of vLLM's OpenAI server for sidecar tests and benchmarks, and a recording passthrough.

The fake answers /v1/completions and /v1/chat/completions in vLLM's wire format (SSE chunks,
`data: [DONE]`, `usage` at the end of non-streaming bodies), /v1/models, /health and a /metrics
with the `vllm:num_requests_waiting` gauge. It records every body it receives, so tests can see
exactly what the sidecar forwarded. Per-request behaviour comes from `x-fake-*` controls, as headers
(straight to the fake) or in the body's `user` field (`fake_user(...)`: through the sidecar, which
forwards no such header):

    x-fake-tokens: N         completion tokens to produce (default: max_tokens, capped at 16)
    x-fake-delay-ms: D       delay before the first token and between tokens
    x-fake-status: S         answer S with an OpenAI error body instead
    x-fake-break: 1          cut the stream after the first token
    x-fake-linger-ms: L      keep the stream open L ms after its `data: [DONE]`
    x-fake-usage-delay-ms: U the usage chunk (when asked for) comes U ms after the last token
    x-fake-delta: K          what a streamed chat token's delta holds: `content` (the default),
                             `reasoning` or `reasoning_content` (that field for the first half of the
                             tokens, then content), or `tool_calls` (one tool call: its name, then
                             its arguments piece by piece), one token per event as vLLM sends them

`ServerThread` runs any ASGI app with uvicorn on 127.0.0.1 in a thread of its own and stops it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, Callable

import httpx
import uvicorn

from slaq.local.processes import free_port
from slaq.testing.asgi import answer_lifespan, read_body


class ServerThread:
    """An ASGI app served by uvicorn on 127.0.0.1:<free port> in a background thread."""

    def __init__(self, app: Any, *, port: int = 0, **config: Any) -> None:
        self.app = app
        self.port = port or free_port()
        self.config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False, **config)
        self.server = uvicorn.Server(self.config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.run, name=f"asgi-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def fake_user(**controls: Any) -> str:
    """The `user` field that carries x-fake-* controls through the sidecar (which forwards no such
    header): fake_user(delay_ms=150) is "x-fake-delay-ms=150"."""
    return ";".join(f"x-fake-{name.replace('_', '-')}={value}" for name, value in controls.items())


def controls_of(user: Any) -> dict[str, str]:
    if not isinstance(user, str) or not user.startswith("x-fake-"):
        return {}
    return dict(item.split("=", 1) for item in user.split(";") if "=" in item)


def _json_response(status: int, payload: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    body = json.dumps(payload).encode()
    return status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


class FakeEngine:
    """The fake vLLM server (an ASGI app)."""

    def __init__(self, model: str = "fake-model") -> None:
        self.model = model
        self.received: list[dict[str, Any]] = []
        self.received_headers: list[dict[str, str]] = []
        self.healthy = True
        self.waiting_gauge = 0
        self.active = 0
        self.max_active = 0

    def reset(self) -> None:
        self.received.clear()
        self.received_headers.clear()
        self.healthy = True
        self.waiting_gauge = 0
        self.max_active = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        path = scope["path"]
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if path == "/health":
            await self._reply(send, *_json_response(200 if self.healthy else 503, {}))
        elif path == "/metrics":
            text = f'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name="{self.model}"}} {self.waiting_gauge}\n'
            await self._reply(send, 200, [(b"content-type", b"text/plain")], text.encode())
        elif path == "/v1/models":
            await self._reply(send, *_json_response(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}))
        elif path in ("/v1/completions", "/v1/chat/completions"):
            raw = await read_body(receive)
            if raw is None:
                return  # the client gave up before sending its body
            body = json.loads(raw)
            self.received.append(body)
            self.received_headers.append(headers)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            try:
                await self._generate(send, path, body, headers)
            finally:
                self.active -= 1
        else:
            await self._reply(send, *_json_response(404, {"error": {"message": "not found"}}))

    @staticmethod
    async def _reply(send: Any, status: int, headers: list, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _generate(self, send: Any, path: str, body: dict, headers: dict[str, str]) -> None:
        headers = {**headers, **controls_of(body.get("user"))}
        if "x-fake-status" in headers:
            status = int(headers["x-fake-status"])
            await self._reply(send, *_json_response(status, {"error": {"message": "fake engine refused", "type": "BadRequestError", "code": status}}))
            return
        chat = path.endswith("chat/completions")
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        tokens = int(headers.get("x-fake-tokens", min(16, limit)))
        delay = float(headers.get("x-fake-delay-ms", "0")) / 1000.0
        prompt_tokens = 7
        created = int(time.time())
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + tokens, "completion_tokens": tokens}
        if not body.get("stream"):
            if delay:
                await asyncio.sleep(delay * (tokens + 1))
            if chat:
                payload = {"id": "chatcmpl-fake", "object": "chat.completion", "created": created, "model": self.model,
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok " * tokens}, "finish_reason": "length"}], "usage": usage}
            else:
                payload = {"id": "cmpl-fake", "object": "text_completion", "created": created, "model": self.model,
                           "choices": [{"index": 0, "text": "tok " * tokens, "finish_reason": "length"}], "usage": usage}
            await self._reply(send, *_json_response(200, payload))
            return
        delta_kind = headers.get("x-fake-delta", "content")
        if delta_kind not in DELTA_KINDS:
            raise ValueError(f"x-fake-delta: {delta_kind!r} is not one of {', '.join(DELTA_KINDS)}")
        last_finish = "tool_calls" if chat and delta_kind == "tool_calls" else "length"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        for i in range(tokens):
            if delay:
                await asyncio.sleep(delay)
            finish = last_finish if i == tokens - 1 else None
            if chat:
                delta = _chat_delta(delta_kind, i, tokens)
                chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": created, "model": self.model,
                         "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
                if i == 0:
                    role = dict(chunk, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
                    await send({"type": "http.response.body", "body": b"data: " + json.dumps(role).encode() + b"\n\n", "more_body": True})
            else:
                chunk = {"id": "cmpl-fake", "object": "text_completion", "created": created, "model": self.model,
                         "choices": [{"index": 0, "text": "tok ", "logprobs": None, "finish_reason": finish}]}
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(chunk).encode() + b"\n\n", "more_body": True})
            if headers.get("x-fake-break") == "1":
                raise RuntimeError("fake engine cut the stream")
        if (body.get("stream_options") or {}).get("include_usage"):
            # x-fake-usage-delay-ms: the usage chunk comes this long after the last token (a client may leave meanwhile).
            await asyncio.sleep(float(headers.get("x-fake-usage-delay-ms", "0")) / 1000.0)
            final = {"id": "fake", "object": "chat.completion.chunk" if chat else "text_completion", "created": created, "model": self.model, "choices": [], "usage": usage}
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(final).encode() + b"\n\n", "more_body": True})
        linger = float(headers.get("x-fake-linger-ms", "0")) / 1000.0
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": linger > 0})
        if linger:
            await asyncio.sleep(linger)
            await send({"type": "http.response.body", "body": b""})


DELTA_KINDS = ("content", "reasoning", "reasoning_content", "tool_calls")  # x-fake-delta


def _chat_delta(kind: str, i: int, tokens: int) -> dict[str, Any]:
    """The delta of a streamed chat token `i` of `tokens`, shaped as vLLM's DeltaMessage serialises it."""
    if kind == "tool_calls":
        if i == 0:
            return {"tool_calls": [{"id": "chatcmpl-tool-fake", "type": "function", "index": 0, "function": {"name": "get_weather"}}]}
        return {"tool_calls": [{"index": 0, "function": {"arguments": "tok "}}]}
    if kind in ("reasoning", "reasoning_content") and i < tokens // 2:
        return {kind: "think "}
    return {"content": "tok "}


class RecordingPassthrough:
    """Forwards every request to `target` and records the JSON bodies and headers it forwarded (a
    wiretap between the sidecar and a real engine)."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.received: list[dict[str, Any]] = []
        self.received_headers: list[dict[str, str]] = []
        self.client: httpx.AsyncClient | None = None
        # A test's change to the engine's response bytes on their way to the OpenAI routes (e.g. hiding
        # chunks as a reasoning parser would); raising from it breaks the connection, as an engine that
        # died mid-stream. /metrics and /health pass as they are.
        self.rewrite: Callable[[bytes], bytes] | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self.client = httpx.AsyncClient(base_url=self.target, timeout=None)
                else:
                    await self.client.aclose()  # type: ignore[union-attr]
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        raw = await read_body(receive)
        if raw is None:
            return
        if raw:
            try:
                self.received.append(json.loads(raw))
            except ValueError:
                pass
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"host", b"content-length")]
        if raw:
            self.received_headers.append({k.decode().lower(): v.decode() for k, v in headers})
        assert self.client is not None
        request = self.client.build_request(scope["method"], scope["path"], content=raw or None, headers=headers)
        rewrite = self.rewrite if scope["path"].startswith("/v1/") else None
        response = await self.client.send(request, stream=True)
        try:
            out = [(k, v) for k, v in response.headers.raw if k.lower() not in (b"content-length", b"transfer-encoding", b"connection")]
            await send({"type": "http.response.start", "status": response.status_code, "headers": out})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk if rewrite is None else rewrite(chunk), "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()
