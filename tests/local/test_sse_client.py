"""The load generator's light streaming client against a real socket server that frames its answers
the ways an HTTP/1.1 server may: chunked with events split across chunks, Content-Length, or ended
by closing; refused connections and a silent server are results, not exceptions."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from slaq.local import sse_client
from slaq.local.sse_client import ChunkedDecoder, post_stream, request_bytes
from tests.support.sse_server import Handler, chunk, serve, sse_event, stream_sse


def _run(handler: Handler, **kwargs) -> tuple[sse_client.StreamResult, list[dict], float]:
    async def go() -> tuple[sse_client.StreamResult, list[dict], float]:
        server, url, seen = await serve(handler)
        async with server:
            sent = time.monotonic()
            result = await post_stream(url + "/v1/completions", {"model": "m", "stream": True}, {"Authorization": "Bearer k"}, **kwargs)
        return result, seen, sent

    return asyncio.run(go())


def test_the_first_token_is_the_first_event_with_a_choice_even_when_an_event_is_split_across_chunks() -> None:
    first, second = sse_event(""), sse_event("x")  # an empty first text still counts: it is a token
    async def handler(body: dict, writer: asyncio.StreamWriter) -> None:
        await stream_sse(writer, [chunk(b": keep-alive\n\n"), chunk(first[:9]), chunk(first[9:]), chunk(second),
                               chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"], gap_s=0.05)

    result, seen, sent = _run(handler)
    assert result.status == 200 and result.done and result.error is None
    assert result.first_token_at is not None and result.ended_at is not None
    # The first token came with the third chunk (two gaps in), the end two more gaps later.
    assert 0.09 < result.first_token_at - sent < result.ended_at - sent
    assert seen[0]["request_line"] == "POST /v1/completions HTTP/1.1" and seen[0]["headers"]["authorization"] == "Bearer k"
    assert seen[0]["headers"]["connection"] == "close" and seen[0]["body"] == {"model": "m", "stream": True}


def test_lazy_reading_still_sees_the_end_and_the_first_token_on_time() -> None:
    async def handler(body: dict, writer: asyncio.StreamWriter) -> None:
        await stream_sse(writer, [chunk(sse_event("a"))] + [chunk(sse_event("b"))] * 30 + [chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"], gap_s=0.01)

    result, _, sent = _run(handler, lazy_after_first_token=True)
    assert result.done and result.error is None
    assert result.first_token_at - sent < sse_client.LAZY_READ_S  # the first token is not read lazily
    assert result.ended_at - sent >= 0.3  # 30 gaps of 10 ms


def test_a_refusal_with_a_content_length_body_has_its_status_and_no_token() -> None:
    async def handler(body: dict, writer: asyncio.StreamWriter) -> None:
        payload = json.dumps({"reason": "over quota"}).encode()
        writer.write(b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload))
        await writer.drain()
        await asyncio.sleep(1.0)  # the client ends by the length, not by the close

    started = time.monotonic()
    result, _, _ = _run(handler)
    assert result.status == 429 and result.first_token_at is None and not result.done and result.error is None
    assert time.monotonic() - started < 1.0


def test_a_stream_cut_before_its_end_is_an_error_and_not_done() -> None:
    async def handler(body: dict, writer: asyncio.StreamWriter) -> None:
        await stream_sse(writer, [chunk(sse_event("a"))])

    result, _, _ = _run(handler)
    assert result.status == 200 and result.first_token_at is not None and not result.done
    assert result.error == "the connection closed before the response ended"


def test_a_refused_connection_and_a_silent_server_are_results() -> None:
    async def silent(body: dict, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5.0)

    result, _, _ = _run(silent, timeout_s=0.3)
    assert result.status is None and result.error == "no answer within 0.3 s" and result.ended_at is not None

    async def refused() -> sse_client.StreamResult:
        server, url, _ = await serve(silent)
        server.close()
        await server.wait_closed()
        return await post_stream(url, {}, {})

    result = asyncio.run(refused())
    assert result.status is None and result.error and "ConnectionRefused" in result.error


def test_the_chunked_decoder_takes_any_split_of_its_input() -> None:
    wire = chunk(b"hello ") + b"b;ext=1\r\nworld, and \r\n" + chunk(b"more") + b"0\r\n\r\n"
    for size in (1, 2, 3, 7, len(wire)):
        decoder = ChunkedDecoder()
        out = b"".join(decoder.feed(wire[i:i + size]) for i in range(0, len(wire), size))
        assert out == b"hello world, and more" and decoder.ended


def test_the_request_is_a_json_post_and_only_plain_http_is_taken() -> None:
    host, port, request = request_bytes("http://127.0.0.1:8123/v1/completions", {"a": 1}, {"X-Key": "v"})
    assert (host, port) == ("127.0.0.1", 8123)
    head, body = request.split(b"\r\n\r\n")
    assert body == b'{"a":1}' and b"Content-Length: 7" in head and b"X-Key: v" in head
    with pytest.raises(ValueError, match="not a plain http:// URL"):
        request_bytes("https://example.com/v1", {}, {})
