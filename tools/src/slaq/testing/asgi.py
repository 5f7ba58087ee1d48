"""Small ASGI pieces the test servers share (fake engines, wiretaps)."""

from __future__ import annotations

from typing import Any


async def read_body(receive: Any) -> bytes | None:
    """The whole request body, or None when the client disconnected before sending it."""
    raw = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        raw += message.get("body", b"")
        if not message.get("more_body"):
            return raw


async def answer_lifespan(receive: Any, send: Any) -> None:
    """Acknowledge startup and shutdown for an app with nothing to set up."""
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return
