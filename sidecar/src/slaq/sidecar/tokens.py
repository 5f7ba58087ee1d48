"""Counting prompt tokens for reservations, the token quota, fairness and the length term.

With `--tokenizer` the sidecar counts as the engine does: the model's own Hugging Face tokenizer,
chat requests rendered through its chat template the way vLLM 0.32 renders them (`chat_prompt.py`:
messages, tools, template arguments), the text encoded with the request's `add_special_tokens`
(default false for chat, true for completions), and `truncate_prompt_tokens` applied. The tokenizer
is loaded in a background thread at start (a download from the model hub may take a while); until it
is loaded, when it cannot be loaded (logged as a warning), or when it fails on one input (a template
that refuses the messages: the engine refuses them too), the count is an estimate: one token per 4
ASCII characters (the usual English average for BPE vocabularies), one per other character (CJK
text runs close to one token per character), 4 tokens of framing per chat message, and the tools'
JSON at 4 characters per token. Token-id prompts are always counted exactly. `slaq_prompt_counts_total`
counts prompts by method, and `slaq_tokenizer_loaded` says whether the tokenizer is in use.

Encoding is the tokenizers library's batch encoder without offsets, which releases the GIL: the
sidecar counts a prompt of more than `OFF_LOOP_TEXT_CHARS` characters in a thread, so the event loop
keeps streaming other tenants' tokens meanwhile.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from slaq.sidecar.chat_prompt import template_inputs

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
OFF_LOOP_TEXT_CHARS = 8 * 1024  # ~2k tokens: encoding more takes about a millisecond or more

Method = Literal["tokenizer", "token_ids", "estimate"]


@dataclass(frozen=True, slots=True)
class PromptCount:
    tokens: int
    method: Method  # tokenizer: the model's own count; token_ids: a token-id prompt's length; estimate: from characters


class PromptCounter(Protocol):
    @property
    def loaded(self) -> bool:
        """The model's tokenizer counts (False: every count is an estimate)."""
        ...

    def measure(self, kind: str, body: dict[str, Any]) -> PromptCount: ...

    def offloads(self, kind: str, body: dict[str, Any]) -> bool:
        """Counting this body takes long enough to leave the event loop for a thread."""
        ...


def _text_of_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _estimate_text(text: str) -> int:
    ascii_chars = len(text.encode("ascii", "ignore"))
    return (ascii_chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN + len(text) - ascii_chars


def _token_id_prompts(prompt: Any) -> list[list[int]] | None:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return [prompt]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        return prompt
    return None


def _prompts(body: dict[str, Any]) -> list[str]:
    prompt = body["prompt"]
    return [prompt] if isinstance(prompt, str) else prompt


def _truncated(tokens: int, body: dict[str, Any]) -> int:
    """vLLM keeps `truncate_prompt_tokens` tokens of each prompt (-1: up to the context, not known here)."""
    keep = body.get("truncate_prompt_tokens")
    return min(tokens, keep) if isinstance(keep, int) and keep >= 0 else tokens


def text_chars(kind: str, body: dict[str, Any]) -> int:
    """Characters of prompt text in a body (a cheap measure of how long counting it takes)."""
    if kind == "chat":
        return sum(len(_text_of_content(m.get("content"))) for m in body["messages"])
    if _token_id_prompts(body["prompt"]) is not None:
        return 0
    return sum(len(p) for p in _prompts(body))


class EstimatingCounter:
    """Characters: 4 ASCII ones or 1 other per token; exact for token-id prompts."""

    loaded = False

    def measure(self, kind: str, body: dict[str, Any]) -> PromptCount:
        if kind == "chat":
            tokens = sum(MESSAGE_OVERHEAD_TOKENS + _estimate_text(_text_of_content(m.get("content"))) for m in body["messages"])
            if body.get("tools"):
                tokens += _estimate_text(json.dumps(body["tools"], separators=(",", ":")))
            return PromptCount(tokens, "estimate")
        ids = _token_id_prompts(body["prompt"])
        if ids is not None:
            return PromptCount(sum(_truncated(len(p), body) for p in ids), "token_ids")
        return PromptCount(sum(_truncated(_estimate_text(p), body) for p in _prompts(body)), "estimate")

    def count(self, kind: str, body: dict[str, Any]) -> int:
        return self.measure(kind, body).tokens

    def offloads(self, kind: str, body: dict[str, Any]) -> bool:
        return False


class TokenizerCounter:
    """The model's Hugging Face tokenizer (`transformers`), counting as vLLM does; the estimate while
    it is not loaded and for an input it fails on."""

    def __init__(self, tokenizer: Any = None, *, source: str | None = None) -> None:
        self.source = source
        self.fallback = EstimatingCounter()
        self.settled = threading.Event()  # loaded, or failed to load
        self.tokenizer: Any = None
        self._fast: Any = None
        if tokenizer is not None:
            self._use(tokenizer)

    @classmethod
    def load(cls, source: str, revision: str | None = None) -> "TokenizerCounter":
        """Load now (raises what loading raises)."""
        counter = cls(source=source)
        counter._use(_load_tokenizer(source, revision))
        return counter

    @classmethod
    def start(cls, source: str, revision: str | None = None) -> "TokenizerCounter":
        """A counter that estimates until the tokenizer, loading in a background thread, is ready."""
        counter = cls(source=source)
        threading.Thread(target=counter._load, args=(source, revision), name="slaq-tokenizer-load", daemon=True).start()
        return counter

    def _load(self, source: str, revision: str | None) -> None:
        try:
            self._use(_load_tokenizer(source, revision))
            log.info("tokenizer %s loaded: prompt tokens are counted as the engine counts them", source)
        except Exception as exc:  # a missing tokenizer degrades counting, it does not stop the pod
            log.warning("tokenizer %s could not be loaded (%s: %s); prompt tokens are ESTIMATED (4 ASCII characters or 1 other per token), "
                        "see slaq_prompt_counts_total{method=\"estimate\"}", source, type(exc).__name__, exc)
        finally:
            self.settled.set()

    def _use(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "_tokenizer", None)
        # The Rust tokenizer's batch encoder without offsets: the same ids as `tokenizer.encode`, and it releases the GIL.
        self._fast = backend if hasattr(backend, "encode_batch_fast") else None
        self.tokenizer = tokenizer
        self.settled.set()

    @property
    def loaded(self) -> bool:
        return self.tokenizer is not None

    def offloads(self, kind: str, body: dict[str, Any]) -> bool:
        return self.loaded and text_chars(kind, body) > OFF_LOOP_TEXT_CHARS

    def _encode_len(self, text: str, add_special_tokens: bool) -> int:
        if self._fast is not None:
            return len(self._fast.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids)
        return len(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _chat_tokens(self, body: dict[str, Any]) -> int:
        tools = body.get("tools") or None
        template = self.tokenizer.get_chat_template(None, tools=tools)  # a tokenizer's named templates: "tool_use" when tools are given
        inputs = template_inputs(body, template)
        text = self.tokenizer.apply_chat_template(inputs.conversation, tools=inputs.tools, chat_template=template, tokenize=False, **inputs.kwargs)
        return _truncated(self._encode_len(text, inputs.add_special_tokens), body)

    def measure(self, kind: str, body: dict[str, Any]) -> PromptCount:
        if self.tokenizer is None:
            return self.fallback.measure(kind, body)
        try:
            if kind == "chat":
                return PromptCount(self._chat_tokens(body), "tokenizer")
            if _token_id_prompts(body["prompt"]) is not None:
                return self.fallback.measure(kind, body)
            special = bool(body.get("add_special_tokens", True))
            return PromptCount(sum(_truncated(self._encode_len(p, special), body) for p in _prompts(body)), "tokenizer")
        except Exception as exc:  # a template that rejects these messages must not fail the request here (the engine answers it)
            log.debug("tokenizer failed (%s); estimating", exc)
            return self.fallback.measure(kind, body)

    def count(self, kind: str, body: dict[str, Any]) -> int:
        return self.measure(kind, body).tokens


def _load_tokenizer(source: str, revision: str | None) -> Any:
    from transformers import AutoTokenizer  # heavy: only when a tokenizer is asked for

    # No remote code: the sidecar is the tenant boundary; a tokenizer that needs it is estimated.
    return AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=False)


def counter_for(tokenizer: str | None, revision: str | None = None) -> PromptCounter:
    """`--tokenizer`: the model's tokenizer, loading in the background; without one, the estimate."""
    if not tokenizer:
        log.warning("no --tokenizer: prompt tokens are ESTIMATED (4 ASCII characters or 1 other per token)")
        return EstimatingCounter()
    return TokenizerCounter.start(tokenizer, revision)
