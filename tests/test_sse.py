"""`slaq.sse.sse_data`: the one reading of a server-sent-event line every streaming client shares."""

from __future__ import annotations

import pytest

from slaq.sse import DONE, sse_data


def test_data_lines_are_parsed_done_is_its_marker_and_other_lines_are_none() -> None:
    assert sse_data('data: {"choices": [{"text": ""}]}') == {"choices": [{"text": ""}]}
    assert sse_data(b'data:{"usage": {"completion_tokens": 3}}') == {"usage": {"completion_tokens": 3}}
    assert sse_data("data: [DONE]") is DONE and sse_data(b"data: [DONE]  ") is DONE
    for line in ("", ": keep-alive", "event: message", "id: 7"):
        assert sse_data(line) is None
    with pytest.raises(ValueError):
        sse_data("data: {not json")
