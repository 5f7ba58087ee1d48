"""The response observer reads vLLM's bytes without holding them, without sockets."""

from __future__ import annotations

import json

import httpx

from slaq.sidecar.proxy import EventFramer, ResponseObserver, broken_stream_event, drop_usage_events, forward_request_headers, forward_response_headers


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


def test_a_completion_chunk_with_an_empty_text_is_a_token() -> None:
    """vLLM streams a token that detokenizes to nothing yet (part of a UTF-8 character) as a chunk
    with text ""; it is the first token all the same (with --stream-interval 8 the next chunk comes
    eight tokens later), as vLLM's benchmark and the demo's client count it."""
    observer = ResponseObserver(streaming=True)
    assert observer.feed(b'data: {"choices": [{"index": 0, "text": "", "logprobs": null}]}\n\n') is True
    assert observer.feed(sse({"choices": [{"index": 0, "text": "ab", "logprobs": {"text_offset": [3]}}]})) is False
    assert observer.output_tokens() == 2



# Chunks as vLLM 0.32 writes them (`ChatCompletionStreamResponse.model_dump_json(exclude_unset=True)`:
# compact, `reasoning` not `reasoning_content`), the role chunk first.
VLLM_ROLE = b'{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'
VLLM_REASONING = b'{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning":"Let"},"logprobs":null,"finish_reason":null}]}'
VLLM_CONTENT_AFTER_REASONING = b'{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi","reasoning":""},"logprobs":null,"finish_reason":null}]}'
VLLM_TOOL_NAME = (b'{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","index":0,'
                  b'"function":{"name":"get_weather"}}]},"logprobs":null,"finish_reason":null}]}')
VLLM_TOOL_ARGUMENTS = (b'{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"content\\": \\""}}]},'
                       b'"logprobs":null,"finish_reason":null}]}')


def event(raw: bytes) -> bytes:
    return b"data: " + raw + b"\n\n"


def test_reasoning_and_tool_call_deltas_are_token_events_and_the_first_one_is_the_first_token() -> None:
    """A reasoning model streams its thinking as `reasoning` deltas, a tool call streams as `tool_calls`
    deltas with no content: each is a token event (the count a stream cut before usage is charged) and
    the first one is the first token (TTFT). The role chunk, and one with an empty tool-call list, are not."""
    for first in (VLLM_REASONING, VLLM_TOOL_NAME):
        observer = ResponseObserver(streaming=True)
        assert observer.feed(event(VLLM_ROLE)) is False
        assert observer.feed(event(VLLM_ROLE.replace(b'"content":""', b'"content":"","tool_calls":[]'))) is False
        assert observer.feed(event(first)) is True
        # A tool call's arguments may spell `"content": "` (escaped): one event still, never more.
        for later in (VLLM_REASONING, VLLM_CONTENT_AFTER_REASONING, VLLM_TOOL_NAME, VLLM_TOOL_ARGUMENTS):
            assert observer.feed(event(later)) is False
        assert observer.output_tokens() == 5 and observer.token_events == 5

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


def test_non_streaming_usage_is_read_when_prompt_token_ids_follow_it() -> None:
    """vLLM writes prompt_token_ids and prompt_logprobs after `usage`: a tenant asking for them (a
    long prompt, return_token_ids) must not push its usage out of what the sidecar reads."""
    body = json.dumps({"id": "x", "choices": [{"index": 0, "message": {"content": "hi"}}],
                       "usage": {"prompt_tokens": 3000, "completion_tokens": 17, "total_tokens": 3017},
                       "prompt_token_ids": list(range(3000))}).encode()
    observer = ResponseObserver(streaming=False)
    for start in range(0, len(body), 1000):  # cut anywhere, the count included
        observer.feed(body[start:start + 1000])
    assert (observer.output_tokens(), observer.prompt_tokens()) == (17, 3000)


def test_only_allowlisted_headers_and_the_sidecars_request_id_are_forwarded() -> None:
    forwarded = forward_request_headers({"authorization": "Bearer k", "x-llm-d-slo-ttft-ms": "1", "content-type": "application/json", "host": "x",
                                         "x-vllm-priority": "-1000000", "x-request-id": "mine", "x-data-parallel-rank": "1",
                                         "x-session-id": "s", "endpoint-load-metrics-format": "json", "traceparent": "00-ab-cd-01"}, "sidecar-id")
    assert forwarded == {"content-type": "application/json", "traceparent": "00-ab-cd-01", "x-request-id": "sidecar-id"}


def test_engine_response_headers_are_allowlisted() -> None:
    headers = httpx.Headers({"content-type": "text/event-stream", "endpoint-load-metrics": "kv=0.9", "x-request-id": "engine", "server": "uvicorn"})
    assert forward_response_headers(headers, "ours") == [(b"content-type", b"text/event-stream"), (b"x-request-id", b"ours")]


def test_the_usage_chunk_the_client_did_not_ask_for_is_dropped() -> None:
    body = sse({"choices": [{"text": "a"}]}, {"choices": [], "usage": {"completion_tokens": 1}}) + b"data: [DONE]\n\n"
    assert drop_usage_events(body) == sse({"choices": [{"text": "a"}]}) + b"data: [DONE]\n\n"
    compact = b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\n'
    assert drop_usage_events(compact) == b""
    kept = b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":3}}\n\n'  # continuous usage rides on a token chunk
    assert drop_usage_events(kept) == kept


def test_framer_forwards_whole_events_only() -> None:
    body = sse({"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]})
    framer = EventFramer(enabled=True)
    pieces = [framer.feed(body[i:i + 5]) for i in range(0, len(body), 5)]
    assert b"".join(pieces) + framer.rest() == body
    for piece in filter(None, pieces):
        assert piece.endswith(b"\n\n")  # never half an event
    assert framer.rest() == b""


def test_framer_holds_a_cut_event_back_and_the_error_event_parses() -> None:
    whole = b'data: {"choices": [{"text": "a"}]}\n\n'
    framer = EventFramer(enabled=True)
    sent = framer.feed(whole + b'data: {"choices": [{"te')
    assert sent == whole
    events = [json.loads(line[6:]) for line in (sent + broken_stream_event("cut")).decode().split("\n\n") if line]
    assert events[-1]["reason"] == "engine_stream_broken" and events[-1]["error"]["code"] == 502


def test_framer_gives_up_on_an_event_longer_than_its_limit_and_when_disabled() -> None:
    framer = EventFramer(enabled=True, limit=16)
    assert framer.feed(b"data: " + b"x" * 8) == b""
    assert framer.feed(b"y" * 8) == b"data: " + b"x" * 8 + b"y" * 8 and not framer.enabled
    assert framer.feed(b"zz") == b"zz"
    assert EventFramer(enabled=False).feed(b"data: partial") == b"data: partial"
