"""The sidecar's pooled client to the engine: idle connections are dropped before the engine would close them."""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import threading

import httpx
import uvloop

from slaq.sidecar.errors import EngineUnavailable
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


# an engine that resets connections as it accepts them ------------------------------------------

def _resetting_listener() -> tuple[socket.socket, int]:
    """A listener that accepts each connection and resets it at once (SO_LINGER 0), as the kernel does
    for the connections of an engine killed mid-accept."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(512)

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return  # closed: the test is over
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


async def _open_many(port: int, rounds: int, at_once: int) -> collections.Counter:
    client = EngineClient(f"http://127.0.0.1:{port}")
    outcomes: collections.Counter = collections.Counter()

    async def one(probe: bool) -> None:
        try:
            if probe:  # the monitor's health probe: its caller expects httpx's errors
                await client.get("/health", timeout_s=5.0)
            else:
                await client.open("POST", "/v1/completions", body=b"{}", headers={})
            outcomes["answered"] += 1
        except (EngineUnavailable, httpx.HTTPError):
            outcomes["unavailable"] += 1
        except Exception as exc:  # a request: a bare 500; a probe: the end of the monitor's loop
            outcomes[f"{type(exc).__name__}: {exc}"] += 1

    try:
        for _ in range(rounds):
            await asyncio.gather(*(one(probe=i % 5 == 0) for i in range(at_once)))
    finally:
        await client.aclose()
    return outcomes


def test_a_connection_reset_as_it_opens_is_the_engine_unavailable_to_requests_and_probes_under_uvloop() -> None:
    """The sidecar runs on uvloop wherever it is installed (uvicorn's "auto"; vLLM brings it). There a
    connection reset right after its connect surfaced from httpx as AttributeError (httpcore reads the
    socket's peer through anyio, and uvloop's transport no longer has a socket): the engine-kill test
    once got a bare 500, and a health probe meeting it would have ended the monitor's loop. About
    1.5 % of these opens hit it."""
    server, port = _resetting_listener()
    try:
        outcomes = uvloop.run(_open_many(port, rounds=20, at_once=50))
    finally:
        server.close()
    assert outcomes == {"unavailable": 1000}, outcomes
