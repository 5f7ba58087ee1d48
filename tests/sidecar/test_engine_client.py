"""The sidecar's pooled client to the engine: idle connections are dropped before the engine would close them."""

from __future__ import annotations

import asyncio

from slaq.sidecar.proxy import ENGINE_KEEP_ALIVE_S, IDLE_CONNECTION_EXPIRY_S, EngineClient

RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def _serve_counting(connections: list[int]) -> asyncio.base_events.Server:
    """An HTTP/1.1 server that answers every request with `{}` and keeps connections open; counts them."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(RESPONSE)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def _two_requests(idle_expiry_s: float, pause_s: float) -> int:
    connections: list[int] = []
    server = await _serve_counting(connections)
    port = server.sockets[0].getsockname()[1]
    client = EngineClient(f"http://127.0.0.1:{port}", shards=1, idle_expiry_s=idle_expiry_s)
    try:
        for _ in range(2):
            response = await client.open("POST", "/v1/completions", body=b"{}", headers={})
            await response.aread()
            await response.aclose()
            await asyncio.sleep(pause_s)
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    return len(connections)


def test_an_idle_connection_past_its_expiry_is_not_reused() -> None:
    assert asyncio.run(_two_requests(idle_expiry_s=0.1, pause_s=0.3)) == 2  # the first was dropped: a fresh one
    assert asyncio.run(_two_requests(idle_expiry_s=5.0, pause_s=0.3)) == 1  # the negative control: reused


def test_idle_connections_expire_well_before_the_engines_keep_alive_timeout() -> None:
    """vLLM closes connections idle for 5 s; a pool that kept them as long raced that close (ReadError, 503)."""
    assert IDLE_CONNECTION_EXPIRY_S <= ENGINE_KEEP_ALIVE_S / 2
