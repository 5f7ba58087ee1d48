"""One line of a server-sent-event stream as OpenAI-compatible servers write it (vLLM, the sidecar).

Every client of a streamed completion in this project (the demo's load generator, the live
benchmark, the e2e traffic, the engine tests) reads its lines through `sse_data`, and those that
read a body of chunks cut it into lines with `lines` (or `alines`).

A line of an event stream ends at CRLF, LF or CR, and nowhere else (the HTML standard's
event-stream grammar). `str.splitlines()`, and httpx's `iter_lines()`/`aiter_lines()` built on
it, also end a line at U+0085, U+2028, U+2029 and four other control characters. vLLM writes a
token's text unescaped into its JSON (only characters below U+0020 are escaped), so a token that
decodes to one of them (NEL, the line and paragraph separators) cut its chunk in two for those
readers: half a JSON string, then a line that is no event at all (an e2e run met it on the tiny
model's random tokens).
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterable, AsyncIterator, Final, Iterable, Iterator


class _Done:
    def __repr__(self) -> str:
        return "DONE"


DONE: Final = _Done()  # the stream's closing `data: [DONE]`


def sse_data(line: str | bytes) -> Any:
    """The parsed JSON of a `data:` line; DONE for `data: [DONE]`; None for any other line
    (blank lines between events, `:` comments, other fields). Malformed JSON raises ValueError."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return DONE
    return json.loads(payload)


class LineSplitter:
    """Bytes of an event stream in, whole lines out (their line end removed, UTF-8 decoded), cut only
    at CRLF, LF or CR; a CR at the end of a chunk waits for the next, which may begin with its LF."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[str]:
        data = self._pending + chunk
        parts = data.splitlines(keepends=True)  # bytes split at CRLF, LF and CR only
        self._pending = parts.pop() if parts and not parts[-1].endswith(b"\n") else b""  # no line end yet, or a CR whose LF may come next
        return [part.rstrip(b"\r\n").decode("utf-8", "replace") for part in parts]

    def flush(self) -> list[str]:
        """The last line, when the stream ended without a line end."""
        rest, self._pending = self._pending, b""
        return [rest.rstrip(b"\r\n").decode("utf-8", "replace")] if rest else []


def lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of a stream's body chunks (e.g. httpx's `response.iter_bytes()`)."""
    splitter = LineSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.flush()


async def alines(chunks: AsyncIterable[bytes]) -> AsyncIterator[str]:
    """`lines` of an asynchronous body (e.g. httpx's `response.aiter_bytes()`)."""
    splitter = LineSplitter()
    async for chunk in chunks:
        for line in splitter.feed(chunk):
            yield line
    for line in splitter.flush():
        yield line
