"""`slaq.sse.sse_data`: the one reading of a server-sent-event line every streaming client shares."""

from __future__ import annotations

import pytest

from slaq.sse import DONE, alines, lines, sse_data


def test_data_lines_are_parsed_done_is_its_marker_and_other_lines_are_none() -> None:
    assert sse_data('data: {"choices": [{"text": ""}]}') == {"choices": [{"text": ""}]}
    assert sse_data(b'data:{"usage": {"completion_tokens": 3}}') == {"usage": {"completion_tokens": 3}}
    assert sse_data("data: [DONE]") is DONE and sse_data(b"data: [DONE]  ") is DONE
    for line in ("", ": keep-alive", "event: message", "id: 7"):
        assert sse_data(line) is None
    with pytest.raises(ValueError):
        sse_data("data: {not json")


def test_lines_end_only_at_crlf_lf_or_cr_whatever_a_tokens_text_holds() -> None:
    """vLLM writes a token's text unescaped: NEL, U+2028 and U+2029 inside a JSON string are text,
    where str.splitlines() (and httpx's aiter_lines) ended the line there (an e2e run: "Unterminated string")."""
    event = 'data: {"choices": [{"text": "a\u0085b\u2028c\u2029d"}]}'.encode()
    body = event + b"\n\n" + b"data: [DONE]\r\n\r\n"
    expected = [event.decode(), "", "data: [DONE]", ""]
    assert list(lines([body])) == expected
    # Cut anywhere, even inside a character's UTF-8 bytes or between a CR and its LF, the lines are the same.
    for at in range(1, len(body)):
        assert list(lines([body[:at], body[at:]])) == expected, at
    assert sse_data(expected[0]) == {"choices": [{"text": "a\u0085b\u2028c\u2029d"}]}


def test_a_bare_cr_ends_a_line_and_the_last_line_needs_no_line_end() -> None:
    assert list(lines([b"data: 1\rdata: 2\r", b"\rdata: 3"])) == ["data: 1", "data: 2", "", "data: 3"]
    assert list(lines([])) == [] and list(lines([b""])) == []


async def test_alines_reads_an_asynchronous_body_the_same_way() -> None:
    async def body():
        for chunk in (b'data: {"t": "\xe2\x80', b'\xa8"}\n', b"\ndata: [DONE]"):
            yield chunk

    assert [line async for line in alines(body())] == ['data: {"t": "\u2028"}', "", "data: [DONE]"]
