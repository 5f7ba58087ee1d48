"""A tiny HTTP/1.1 server on a real socket for client tests: it reads one JSON POST per connection,
records it, and lets the test's handler write the answer byte for byte (chunked SSE, a refusal...)."""

from __future__ import annotations

import asyncio
import json
from typing import Awaitable, Callable

Handler = Callable[[dict, asyncio.StreamWriter], Awaitable[None]]


def sse_event(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"text": text}]}).encode() + b"\n\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def serve(handler: Handler) -> tuple[asyncio.AbstractServer, str, list[dict]]:
    seen: list[dict] = []

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = json.loads(await reader.readexactly(int(headers["content-length"])))
        seen.append({"request_line": lines[0], "headers": headers, "body": body})
        try:
            await handler(body, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen


async def stream_sse(writer: asyncio.StreamWriter, pieces: list[bytes], gap_s: float = 0.0) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(gap_s)
