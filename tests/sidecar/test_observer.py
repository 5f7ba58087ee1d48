"""The response observer reads vLLM's bytes without holding them, without sockets."""

from __future__ import annotations

import json

from slaq.sidecar.proxy import ResponseObserver, forward_request_headers


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def test_streamed_chat_first_token_and_count_across_split_chunks() -> None:
    role = {"choices": [{"delta": {"role": "assistant", "content": ""}}]}
    token = {"choices": [{"delta": {"content": "hi"}}]}
    body = sse(role, token, token, token)
    observer = ResponseObserver(streaming=True)
    firsts = [observer.feed(body[i:i + 7]) for i in range(0, len(body), 7)]
    assert firsts.count(True) == 1
    assert observer.output_tokens() == 3


def test_role_chunk_alone_is_not_a_first_token() -> None:
    observer = ResponseObserver(streaming=True)
    assert not observer.feed(sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}))


def test_usage_in_the_tail_wins_over_event_count() -> None:
    observer = ResponseObserver(streaming=True)
    observer.feed(sse({"choices": [{"text": "a"}]}, {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5}}))
    assert observer.output_tokens() == 5 and observer.prompt_tokens() == 11


def test_non_streaming_reads_usage_and_counts_first_byte() -> None:
    observer = ResponseObserver(streaming=False)
    body = json.dumps({"choices": [{"text": "x" * 10000}], "usage": {"prompt_tokens": 3, "total_tokens": 10, "completion_tokens": 7}}).encode()
    assert observer.feed(body[:5000]) is True
    assert observer.feed(body[5000:]) is False
    assert observer.output_tokens() == 7 and observer.prompt_tokens() == 3


def test_credentials_and_gateway_headers_are_not_forwarded() -> None:
    forwarded = forward_request_headers({"authorization": "Bearer k", "x-llm-d-slo-ttft-ms": "1", "content-type": "application/json", "host": "x"})
    assert forwarded == {"content-type": "application/json"}
