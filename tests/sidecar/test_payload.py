"""Request-body checks and prompt token counting, without sockets."""

from __future__ import annotations

import json

import pytest

from slaq.sidecar.errors import InvalidField, MalformedJSON, UnknownModel
from slaq.sidecar.payload import parse_payload
from slaq.sidecar.tokens import EstimatingCounter, TokenizerCounter


def test_good_chat_and_completion_parse() -> None:
    chat = parse_payload(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_completion_tokens": 9}).encode(), "chat", "m")
    assert chat.stream and chat.max_tokens == 9 and chat.n == 1
    completion = parse_payload(b'{"prompt": ["a", "b"], "max_tokens": 5, "n": 2}', "completions", "m")
    assert completion.model is None and completion.n == 4  # two prompts, two choices each


@pytest.mark.parametrize("raw,kind,error,field", [
    (b"{", "chat", MalformedJSON, None),
    (b'{"prompt": NaN}', "completions", MalformedJSON, None),
    (b"\xff\xfe", "chat", MalformedJSON, None),
    (b"[1]", "chat", InvalidField, "body"),
    (b'{"model": "other", "messages": [{"role": "user", "content": "x"}]}', "chat", UnknownModel, None),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "chat", InvalidField, "max_tokens"),
    (b'{"messages": [{"role": "wizard", "content": "x"}]}', "chat", InvalidField, "messages[0].role"),
    (b'{"prompt": [1, "a"]}', "completions", InvalidField, "prompt"),
])
def test_bad_bodies_name_the_problem(raw: bytes, kind: str, error: type, field: str | None) -> None:
    with pytest.raises(error) as info:
        parse_payload(raw, kind, "m")  # type: ignore[arg-type]
    if field is not None:
        assert info.value.field == field


def test_estimate_counts_text_and_exact_token_ids() -> None:
    counter = EstimatingCounter()
    assert counter.count("completions", {"prompt": "x" * 40}) == 10
    assert counter.count("completions", {"prompt": [1, 2, 3]}) == 3
    assert counter.count("completions", {"prompt": [[1, 2], [3]]}) == 3
    assert counter.count("chat", {"messages": [{"role": "user", "content": "x" * 8}, {"role": "user", "content": [{"type": "text", "text": "abcd"}]}]}) == 4 + 2 + 4 + 1


class WordTokenizer:
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [0] + [1] * len(text.split())


def test_tokenizer_counter_uses_the_tokenizer_and_falls_back() -> None:
    counter = TokenizerCounter(WordTokenizer())
    assert counter.count("completions", {"prompt": "one two three"}) == 4
    assert counter.count("completions", {"prompt": [5, 6]}) == 2
    broken = TokenizerCounter(object())
    assert broken.count("completions", {"prompt": "x" * 8}) == 2
