"""A small fake OpenAI streaming server for the live benchmark's tests (an ASGI app).

It checks `Authorization: Bearer <key>` against the keys it was given (401 otherwise) and
streams exactly `max_tokens` completion chunks, `delay_s` apart, then a usage chunk and
`data: [DONE]`. It records (key, body) of every accepted request.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from slaq.testing.asgi import answer_lifespan, read_body


class FakeOpenAI:
    def __init__(self, keys: set[str], delay_s: float = 0.002) -> None:
        self.keys, self.delay_s = keys, delay_s
        self.accepted: list[tuple[str, dict[str, Any]]] = []
        self.refused = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        raw = await read_body(receive)
        if raw is None:
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        key = headers.get("authorization", "").removeprefix("Bearer ").strip()
        if scope["path"] != "/v1/completions" or key not in self.keys:
            self.refused += 1
            status = 404 if scope["path"] != "/v1/completions" else 401
            body = json.dumps({"error": {"message": "refused", "code": status}}).encode()
            await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        request = json.loads(raw)
        self.accepted.append((key, request))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        count = int(request["max_tokens"])
        for _ in range(count):
            await asyncio.sleep(self.delay_s)
            chunk = {"object": "text_completion", "choices": [{"index": 0, "text": "t", "finish_reason": None}]}
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(chunk).encode() + b"\n\n", "more_body": True})
        usage = {"object": "text_completion", "choices": [], "usage": {"prompt_tokens": len(request["prompt"]), "completion_tokens": count}}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(usage).encode() + b"\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
