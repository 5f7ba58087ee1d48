"""Counting prompt tokens for the token quota and the length term.

With `--tokenizer` the model's own tokenizer counts (chat requests through its chat template when
it has one). Without it, or when the tokenizer fails on an input, the count is an estimate: one
token per 4 characters of text (the usual English average for BPE vocabularies) plus 4 tokens of
framing per chat message. Token-id prompts are always counted exactly.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4


class PromptCounter(Protocol):
    def count(self, kind: str, body: dict[str, Any]) -> int: ...


def _text_of_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _estimate_text(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def _token_id_count(prompt: Any) -> int | None:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        return sum(len(p) for p in prompt)
    return None


class EstimatingCounter:
    """Characters / 4; exact for token-id prompts."""

    def count(self, kind: str, body: dict[str, Any]) -> int:
        if kind == "chat":
            return sum(MESSAGE_OVERHEAD_TOKENS + _estimate_text(_text_of_content(m.get("content"))) for m in body["messages"])
        prompt = body["prompt"]
        exact = _token_id_count(prompt)
        if exact is not None:
            return exact
        if isinstance(prompt, str):
            return _estimate_text(prompt)
        return sum(_estimate_text(p) for p in prompt)


class TokenizerCounter:
    """The model's tokenizer (Hugging Face `transformers`), falling back to the estimate per request."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.fallback = EstimatingCounter()

    @classmethod
    def load(cls, path_or_id: str) -> "TokenizerCounter":
        from transformers import AutoTokenizer  # heavy: only when a tokenizer is asked for

        return cls(AutoTokenizer.from_pretrained(path_or_id))

    def _encode_len(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=True))

    def count(self, kind: str, body: dict[str, Any]) -> int:
        try:
            if kind == "chat":
                if getattr(self.tokenizer, "chat_template", None):
                    return len(self.tokenizer.apply_chat_template(body["messages"], tokenize=True, add_generation_prompt=True, return_dict=False))
                return sum(MESSAGE_OVERHEAD_TOKENS + self._encode_len(_text_of_content(m.get("content"))) for m in body["messages"])
            prompt = body["prompt"]
            exact = _token_id_count(prompt)
            if exact is not None:
                return exact
            if isinstance(prompt, str):
                return self._encode_len(prompt)
            return sum(self._encode_len(p) for p in prompt)
        except Exception as exc:  # a template that rejects these messages must not fail the request here
            log.debug("tokenizer failed (%s); estimating", exc)
            return self.fallback.count(kind, body)
