"""Prompt token counting with the tiny model's real tokenizer, the vLLM-shaped chat rendering, the
estimate fallback, counting off the event loop, and the usage a cut stream is charged from."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from slaq.sidecar.chat_prompt import content_format, template_inputs, vllm_tool
from slaq.sidecar.proxy import ResponseObserver, client_usage_filter
from slaq.sidecar.service import CoreConfig, SidecarCore
from slaq.sidecar.tenants import TenantDirectory
from slaq.sidecar.tokens import ENCODER_PROCESSES, OFF_LOOP_TEXT_CHARS, EstimatingCounter, PromptCount, TokenizerCounter
from tests.sidecar.tables import abc_table, bearer

CJK = "服务等级目标限制首个令牌的时间和每个输出令牌的时间。"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                                            "x-extra": "dropped by vLLM's model"}}


@pytest.fixture(scope="module")
def tiny() -> TokenizerCounter:
    from slaq.engine.tiny_model import ensure_tiny_model

    return TokenizerCounter.load(str(ensure_tiny_model()))


def test_a_cjk_prompt_is_counted_by_the_tokenizer_where_the_old_estimate_was_3x_short(tiny: TokenizerCounter) -> None:
    expected = len(tiny.tokenizer.encode(CJK, add_special_tokens=True))
    assert tiny.measure("completions", {"prompt": CJK}) == PromptCount(expected, "tokenizer")
    assert expected >= 2 * len(CJK)  # byte-level BPE without CJK merges: ~3 tokens per character; characters / 4 was 11x short
    assert EstimatingCounter().count("completions", {"prompt": CJK}) == len(CJK)  # the fallback counts one per non-ASCII character


def test_the_fast_path_gives_the_tokenizers_own_ids(tiny: TokenizerCounter) -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 40 + CJK
    assert tiny.count("completions", {"prompt": text}) == len(tiny.tokenizer.encode(text))
    assert tiny.count("completions", {"prompt": [text, "hello"]}) == len(tiny.tokenizer.encode(text)) + len(tiny.tokenizer.encode("hello"))
    assert tiny.count("completions", {"prompt": text, "truncate_prompt_tokens": 7}) == 7  # vLLM keeps that many


def test_a_chat_with_tools_counts_the_template_with_the_tools_as_vllm_dumps_them(tiny: TokenizerCounter) -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "weather"}, {"type": "text", "text": "in Paris?"}]}], "tools": [WEATHER]}
    dumped = {"type": "function", "function": {"name": "get_weather", "description": None, "parameters": WEATHER["function"]["parameters"]}}
    # The tiny template: tools as JSON (transformers' tojson), then "role: content" lines; text parts joined by a newline.
    rendered = f"tools: {json.dumps([dumped], ensure_ascii=False)}\nuser: weather\nin Paris?\nassistant: "
    assert tiny.measure("chat", body) == PromptCount(len(tiny.tokenizer.encode(rendered, add_special_tokens=False)), "tokenizer")
    without = tiny.count("chat", {"messages": body["messages"]})
    assert without == len(tiny.tokenizer.encode("user: weather\nin Paris?\nassistant: ", add_special_tokens=False))
    assert tiny.count("chat", {**body, "add_generation_prompt": False}) < tiny.count("chat", body)


def test_vllm_tool_dump_keeps_set_options_and_drops_unknown_keys() -> None:
    assert vllm_tool(WEATHER) == {"type": "function", "function": {"name": "get_weather", "description": None, "parameters": WEATHER["function"]["parameters"]}}
    strict = vllm_tool({"type": "function", "function": {"name": "f", "description": "d", "strict": True}})
    assert strict == {"type": "function", "function": {"name": "f", "description": "d", "parameters": None, "strict": True}}


def test_template_inputs_follow_vllms_message_parsing() -> None:
    body = {"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                                                              {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]},
        {"role": "tool", "content": [{"type": "text", "text": "42"}], "tool_call_id": "c1"},
        {"role": "system", "content": "late system"},
    ], "reasoning_effort": "low"}
    inputs = template_inputs(body, "{% for m in messages %}{{ m.content }}{% endfor %}")
    system, user, assistant, tool = inputs.conversation
    # No developer role in the template: developer becomes system, and the system messages are merged at the front.
    assert system == {"role": "system", "content": "be brief\n\nlate system"}
    assert user == {"role": "user", "content": "hi", "name": "ann"}
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == [{"a": 1}, {}] and assistant["content"] == ""
    assert tool == {"role": "tool", "content": "42", "tool_call_id": "c1"}
    assert inputs.kwargs == {"add_generation_prompt": True, "continue_final_message": False, "reasoning_effort": "low", "enable_thinking": True}
    assert body["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # the body sent to the engine is untouched


def test_content_format_is_detected_from_the_template() -> None:
    assert content_format("{% for message in messages %}{{ message['content'] }}{% endfor %}") == "string"
    looping = "{% for message in messages %}{% for part in message['content'] %}{{ part.text }}{% endfor %}{% endfor %}"
    assert content_format(looping) == "openai"
    inputs = template_inputs({"messages": [{"role": "user", "content": "x"}]}, looping)
    assert inputs.conversation[0]["content"] == [{"type": "text", "text": "x"}]


def test_a_tokenizer_that_cannot_be_loaded_is_logged_and_estimated(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="slaq.sidecar.tokens")
    counter = TokenizerCounter.start(str(tmp_path / "no-such-model"))
    assert counter.settled.wait(120)
    assert not counter.loaded and counter.measure("completions", {"prompt": "abcd" * 3}) == PromptCount(3, "estimate")
    assert "could not be loaded" in caplog.text and "ESTIMATED" in caplog.text
    c = SidecarCore(CoreConfig(served_model_name="m"), TenantDirectory.from_table(abc_table()), counter=counter)
    c.check_in(c.identify(bearer("vip")), "completions", b'{"prompt": "abcd", "max_tokens": 2}')
    metrics = c.metrics.render()
    assert b'slaq_prompt_counts_total{method="estimate"} 1.0' in metrics and b"slaq_tokenizer_loaded 0.0" in metrics


def test_a_template_that_refuses_the_messages_is_estimated() -> None:
    class Refusing:
        def get_chat_template(self, *_: Any, **__: Any) -> str:
            return "{{ raise_exception('no') }}"

        def apply_chat_template(self, *_: Any, **__: Any) -> str:
            raise ValueError("the template refuses these messages")

    counter = TokenizerCounter(Refusing())
    assert counter.measure("chat", {"messages": [{"role": "user", "content": "abcd"}]}) == PromptCount(4 + 1, "estimate")


class SlowCounter:
    """Stands for a long prompt's tokenization: holds no GIL for `seconds` (as the Rust encoder)."""

    loaded = True

    def __init__(self, offload: bool, seconds: float = 0.3) -> None:
        self.offload, self.seconds = offload, seconds
        self.threads: list[str] = []

    def measure(self, kind: str, body: dict[str, Any]) -> PromptCount:
        self.threads.append(threading.current_thread().name)
        time.sleep(self.seconds)
        return PromptCount(1234, "tokenizer")

    measure_apart = measure

    def close(self) -> None:
        pass

    def offloads(self, kind: str, body: dict[str, Any]) -> bool:
        return self.offload

    def bound(self, kind: str, body: dict[str, Any]) -> None:
        return None  # no bound: counted before it is admitted


@pytest.mark.parametrize("offload", [True, False])
async def test_a_long_prompt_is_counted_off_the_event_loop(offload: bool) -> None:
    counter = SlowCounter(offload)
    c = SidecarCore(CoreConfig(served_model_name="m"), TenantDirectory.from_table(abc_table()), counter=counter)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    before = ticks
    flight = await c.admit(c.identify(bearer("vip")), "completions", json.dumps({"prompt": "x" * (OFF_LOOP_TEXT_CHARS + 1), "max_tokens": 2}).encode())
    during = ticks - before
    task.cancel()
    assert flight.prompt_tokens == 1234
    if offload:
        assert counter.threads[0].startswith("slaq-count") and during >= 10  # the loop ran on while the thread counted
    else:
        assert counter.threads[0] == threading.current_thread().name and during <= 2  # the negative control: the loop stood still


async def test_a_tenants_long_prompts_are_counted_two_at_a_time() -> None:
    counter = SlowCounter(True, seconds=0.2)
    c = SidecarCore(CoreConfig(served_model_name="m"), TenantDirectory.from_table(abc_table()), counter=counter)
    body = json.dumps({"prompt": "x" * (OFF_LOOP_TEXT_CHARS + 1), "max_tokens": 2}).encode()
    results = await asyncio.gather(*(c.admit(c.identify(bearer(name)), "completions", body) for name in ("vip", "vip", "vip", "std")),
                                   return_exceptions=True)
    assert [type(r).__name__ for r in results] == ["Flight", "Flight", "ConcurrencyExceeded", "Flight"]  # another tenant is not held up
    assert not c._counts


@pytest.fixture(scope="module")
def apart() -> Iterator[TokenizerCounter]:
    """The tiny tokenizer with the sidecar's encoder processes (`counter_for`)."""
    from slaq.engine.tiny_model import ensure_tiny_model

    counter = TokenizerCounter.load(str(ensure_tiny_model()), encoder_processes=ENCODER_PROCESSES)
    yield counter
    counter.close()


def test_long_prompts_are_encoded_in_another_process_with_the_same_counts(apart: TokenizerCounter, tiny: TokenizerCounter) -> None:
    assert apart._encoders is not None and apart._encoders.pid() != os.getpid()
    text = "The quick brown fox jumps over the lazy dog. " * 400 + CJK
    chat = {"messages": [{"role": "user", "content": text}], "tools": [WEATHER]}
    for kind, body in [("completions", {"prompt": text}), ("completions", {"prompt": [text, CJK], "truncate_prompt_tokens": 500}),
                       ("chat", chat), ("completions", {"prompt": CJK, "add_special_tokens": False})]:
        assert apart.measure_apart(kind, body) == tiny.measure(kind, body) == apart.measure(kind, body)
    assert tiny.measure_apart("completions", {"prompt": text}) == tiny.measure("completions", {"prompt": text})  # no processes: in this one


def test_a_dead_encoder_process_leaves_counting_in_this_process(caplog: pytest.LogCaptureFixture) -> None:
    from slaq.engine.tiny_model import ensure_tiny_model

    counter = TokenizerCounter.load(str(ensure_tiny_model()), encoder_processes=1)
    try:
        os.kill(counter._encoders.pid(), signal.SIGKILL)
        with caplog.at_level(logging.WARNING, logger="slaq.sidecar.tokens"):
            assert counter.measure_apart("completions", {"prompt": CJK}) == PromptCount(len(counter.tokenizer.encode(CJK)), "tokenizer")
        assert "an encoder process died" in caplog.text and counter._encoders is None
        assert counter.measure_apart("completions", {"prompt": CJK}).method == "tokenizer"
    finally:
        counter.close()


def test_a_counter_closed_while_its_tokenizer_loads_starts_no_encoder(tiny: TokenizerCounter) -> None:
    counter = TokenizerCounter(source="tiny", encoder_processes=1)  # as `start` makes it, before the load thread is done
    counter.close()  # the sidecar shuts down meanwhile
    counter._use(tiny.tokenizer)  # the load thread finishes
    assert counter._encoders is None
    assert counter.measure_apart("completions", {"prompt": CJK}) == tiny.measure("completions", {"prompt": CJK})


def test_the_tiny_counter_offloads_only_long_prompts(tiny: TokenizerCounter) -> None:
    assert tiny.offloads("completions", {"prompt": "x" * (OFF_LOOP_TEXT_CHARS + 1)})
    assert not tiny.offloads("completions", {"prompt": "x" * 100}) and not tiny.offloads("completions", {"prompt": [1] * 100_000})
    assert tiny.offloads("chat", {"messages": [{"role": "user", "content": "x" * (OFF_LOOP_TEXT_CHARS + 1)}]})


# -- what a cut stream is charged ---------------------------------------------------------------

def chunk(index: int, content: str | None, completion_tokens: int | None = None, prompt_tokens: int = 7) -> bytes:
    delta = {} if content is None else {"content": content}
    event: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": index, "delta": delta}]}
    if completion_tokens is not None:
        event["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def usage_chunk(completion_tokens: int) -> bytes:
    usage = {"prompt_tokens": 7, "completion_tokens": completion_tokens, "total_tokens": 7 + completion_tokens}
    return b"data: " + json.dumps({"id": "c", "choices": [], "usage": usage}, separators=(",", ":")).encode() + b"\n\n"


def test_a_cut_stream_with_hidden_tokens_is_charged_the_engines_count_as_of_its_last_chunk() -> None:
    # 40 hidden reasoning tokens produced no chunk; the first visible one says 41 so far.
    observer = ResponseObserver(True, max_output=500)
    for event in (chunk(0, "", 0), chunk(0, "Hi", 41), chunk(0, " there", 42)):
        observer.feed(event)
    assert observer.output_tokens() == 42 and observer.prompt_tokens() == 7
    # Without the engine's count the sidecar only knew the 2 token events it saw (the gap this closes).
    blind = ResponseObserver(True, max_output=500)
    for event in (chunk(0, ""), chunk(0, "Hi"), chunk(0, " there")):
        blind.feed(event)
    assert blind.output_tokens() == 2


def test_continuous_usage_is_summed_over_choices_and_the_final_usage_wins() -> None:
    observer = ResponseObserver(True, max_output=500)
    for event in (chunk(0, "a", 10), chunk(1, "b", 20), chunk(0, "c", 11)):
        observer.feed(event)
    assert observer.output_tokens() == 31  # choice 0 at 11, choice 1 at 20
    observer.feed(usage_chunk(33))
    assert observer.output_tokens() == 33
    # Still hidden when cut: nothing counted yet is unknown, and the reservation stands.
    silent = ResponseObserver(True, max_output=500)
    silent.feed(chunk(0, "", 0))
    assert silent.output_tokens() is None


@pytest.mark.parametrize("include_usage,continuous", [(False, False), (True, False), (True, True)])
def test_the_client_sees_only_the_usage_it_asked_for(include_usage: bool, continuous: bool) -> None:
    events = chunk(0, "Hi", 41) + chunk(0, None, 42) + usage_chunk(42) + b"data: [DONE]\n\n"
    view = client_usage_filter(include_usage, continuous, forced_continuous=True)
    seen = view(events) if view else events
    parsed = [json.loads(line[6:]) for line in seen.decode().split("\n\n") if line.startswith("data: {")]
    assert [("usage" in p) for p in parsed] == ([True, True, True] if continuous else [False, False] + ([True] if include_usage else []))
    assert parsed[0]["choices"][0]["delta"] == {"content": "Hi"} and seen.endswith(b"data: [DONE]\n\n")
    assert client_usage_filter(True, False, forced_continuous=False) is None  # nothing forced, nothing to take out


async def test_streams_that_may_hide_tokens_ask_the_engine_for_usage_in_every_chunk() -> None:
    c = SidecarCore(CoreConfig(served_model_name="m"), TenantDirectory.from_table(abc_table()))
    sent = {}
    for name, extra in (("plain", {}), ("hidden", {"include_reasoning": False}), ("tools", {"tools": [WEATHER]})):
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True, **extra}
        flight = await c.admit(c.identify(bearer("vip")), "chat", json.dumps(body).encode())
        sent[name] = json.loads(c.enriched_body(flight))["stream_options"]
        c.finish(flight, output_tokens=1, engine_prompt_tokens=None, status=200)
    assert sent["plain"] == {"include_usage": True}
    assert sent["hidden"] == sent["tools"] == {"include_usage": True, "continuous_usage_stats": True}
