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

Encoding is the tokenizers library's batch encoder without offsets. The sidecar counts a prompt of
more than `OFF_LOOP_TEXT_CHARS` characters in a thread, which renders a chat prompt's template and
has the text encoded in one of `ENCODER_PROCESSES` encoder processes (`measure_apart`, encoder.py),
so the event loop keeps streaming other tenants' tokens meanwhile: encoded on a thread of the
sidecar's own process, a 4k-token prompt delays the loop by about 2.4 ms at p99 (encoder.py).

Such a prompt need not be counted before it is admitted: `TokenizerCounter.bound` gives, in O(bytes),
a count the exact one can never exceed, and a request whose quotas admit it even at that bound goes
on while the count runs (`SidecarCore.admit`). The bound, for the tokenizers `byte_bounded` accepts:

- the pre-tokenizers accepted only split text or map each byte to one character (`ByteLevel`
  without `add_prefix_space`); none adds characters;
- every model type (BPE, Unigram, WordPiece, WordLevel) emits at most one token per character it is
  given, except byte fallback, which emits a character's UTF-8 bytes (at most its bytes); an added
  token matched in the text is one token for at least one byte;
- so the text's tokens are at most its UTF-8 bytes after normalization. The normalizers accepted
  (Unicode normal forms, lowercasing, stripping) leave ASCII text as long as it was, so for ASCII
  text, or without a normalizer, that is the UTF-8 bytes of the text itself; non-ASCII text under a
  normalizer has no bound here (it is counted first);
- plus the special tokens the post-processor adds when `add_special_tokens` is set; a tokenizer
  that pads has no bound.

Tokenizers outside this (a normalizer that prepends or replaces, `Metaspace`, `add_prefix_space`,
padding, a slow Python tokenizer) have no bound: their prompts are counted before admission.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from slaq.sidecar.chat_prompt import template_inputs

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
OFF_LOOP_TEXT_CHARS = 8 * 1024  # ~2k tokens: encoding more takes about a millisecond or more
ENCODER_PROCESSES = 2  # the sidecar's encoder processes (encoder.py), shared by the counts someone waits for (two threads) and the settlements (one)

Method = Literal["tokenizer", "token_ids", "estimate"]


@dataclass(frozen=True, slots=True)
class PromptCount:
    tokens: int
    method: Method  # tokenizer: the model's own count; token_ids: a token-id prompt's length; estimate: from characters


@dataclass(frozen=True, slots=True)
class PromptBound:
    """What is known of a prompt before it is counted."""

    tokens: int  # the exact count is at most this
    estimate: int  # the estimate from characters (what orders the request until it is counted)


class PromptCounter(Protocol):
    @property
    def loaded(self) -> bool:
        """The model's tokenizer counts (False: every count is an estimate)."""
        ...

    def measure(self, kind: str, body: dict[str, Any]) -> PromptCount: ...

    def measure_apart(self, kind: str, body: dict[str, Any]) -> PromptCount:
        """`measure`, with the encoding where it disturbs the event loop least (an encoder process,
        encoder.py): it blocks, so it is called from a thread, never the event loop."""
        ...

    def close(self) -> None:
        """Release what counting holds (processes); counting still works after."""
        ...

    def offloads(self, kind: str, body: dict[str, Any]) -> bool:
        """Counting this body takes long enough to leave the event loop for a thread."""
        ...

    def bound(self, kind: str, body: dict[str, Any]) -> PromptBound | None:
        """A count this body's exact one never exceeds, computed in O(bytes); None when there is none
        (the prompt must be counted before it is admitted)."""
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

    measure_apart = measure

    def close(self) -> None:
        pass

    def count(self, kind: str, body: dict[str, Any]) -> int:
        return self.measure(kind, body).tokens

    def offloads(self, kind: str, body: dict[str, Any]) -> bool:
        return False

    def bound(self, kind: str, body: dict[str, Any]) -> PromptBound | None:
        return None  # the estimate is the count: nothing to wait for


# Pre-tokenizers and normalizers under which a text's tokens are at most its UTF-8 bytes (module doc).
SPLITTING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit"})
ASCII_PRESERVING_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Strip", "StripAccents"})


def _components(spec: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    if spec is None:
        return []
    if spec.get("type") == "Sequence":
        return [c for part in spec[key] for c in _components(part, key)]
    return [spec]


def byte_bounded(tokenizer_json: dict[str, Any]) -> tuple[bool, bool]:
    """(bounded, normalizes) for a `tokenizer.json`: bounded when a text's tokens are at most its UTF-8
    bytes (ASCII text only, where it `normalizes`), plus the special tokens added (module doc)."""
    pre = _components(tokenizer_json.get("pre_tokenizer"), "pretokenizers")
    normalizers = _components(tokenizer_json.get("normalizer"), "normalizers")
    model = tokenizer_json.get("model") or {}
    bounded = (
        tokenizer_json.get("padding") is None
        and model.get("type") in ("BPE", "Unigram", "WordPiece", "WordLevel")
        and all(p.get("type") in SPLITTING_PRE_TOKENIZERS and not p.get("add_prefix_space", False) for p in pre)
        # byte fallback over byte-level characters (two UTF-8 bytes each) would break the per-byte bound
        and not (model.get("byte_fallback") and any(p.get("type") == "ByteLevel" for p in pre))
        and all(n.get("type") in ASCII_PRESERVING_NORMALIZERS for n in normalizers)
    )
    return bounded, bool(normalizers)


class TokenizerCounter:
    """The model's Hugging Face tokenizer (`transformers`), counting as vLLM does; the estimate while
    it is not loaded and for an input it fails on."""

    def __init__(self, tokenizer: Any = None, *, source: str | None = None, encoder_processes: int = 0) -> None:
        self.source = source
        self.fallback = EstimatingCounter()
        self.encoder_processes = encoder_processes  # long prompts encoded in processes of their own (encoder.py); 0: in this one
        self._encoders: Any = None  # `EncoderWorkers`, once started
        self._closing = threading.Lock()
        self._closed = False  # `close` was called: no encoders start after it (the tokenizer may still be loading)
        self.settled = threading.Event()  # loaded, or failed to load
        self.tokenizer: Any = None
        self._fast: Any = None
        self._bounded = False  # `bound` applies (byte_bounded)
        self._normalizes = False  # and only to ASCII text
        self._specials = 0  # special tokens the post-processor adds
        if tokenizer is not None:
            self._use(tokenizer)

    @classmethod
    def load(cls, source: str, revision: str | None = None, encoder_processes: int = 0) -> "TokenizerCounter":
        """Load now (raises what loading raises)."""
        counter = cls(source=source, encoder_processes=encoder_processes)
        counter._use(_load_tokenizer(source, revision))
        return counter

    @classmethod
    def start(cls, source: str, revision: str | None = None, encoder_processes: int = 0) -> "TokenizerCounter":
        """A counter that estimates until the tokenizer, loading in a background thread, is ready."""
        counter = cls(source=source, encoder_processes=encoder_processes)
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
        if self._fast is not None:
            spec = self._fast.to_str()
            self._bounded, self._normalizes = byte_bounded(json.loads(spec))
            self._specials = self._fast.num_special_tokens_to_add(False)
            if self.encoder_processes and not self._closed:
                encoders = _started_encoders(spec, self.encoder_processes)
                with self._closing:
                    if self._closed and encoders is not None:
                        encoders.close()  # closed while they started
                    else:
                        self._encoders = encoders
        self.tokenizer = tokenizer
        self.settled.set()

    def close(self) -> None:
        """Stop the encoder processes, or keep them from starting (counting goes on in this process)."""
        with self._closing:
            self._closed = True
            encoders, self._encoders = self._encoders, None
        if encoders is not None:
            encoders.close()

    @property
    def loaded(self) -> bool:
        return self.tokenizer is not None

    def offloads(self, kind: str, body: dict[str, Any]) -> bool:
        return self.loaded and text_chars(kind, body) > OFF_LOOP_TEXT_CHARS

    def _encode_lens(self, texts: list[str], add_special_tokens: bool, apart: bool = False) -> list[int]:
        encoders = self._encoders if apart else None
        if encoders is not None:
            try:
                return encoders.lengths(texts, add_special_tokens)
            except BrokenProcessPool:
                log.warning("an encoder process died: long prompts are encoded in the sidecar's own process from now on")
                self.close()
        if self._fast is not None:
            return [len(e) for e in self._fast.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]  # no list of ids built
        return [len(self.tokenizer.encode(text, add_special_tokens=add_special_tokens)) for text in texts]

    def _chat_text(self, body: dict[str, Any]) -> tuple[str, bool]:
        """The rendered chat prompt and whether it is encoded with special tokens."""
        tools = body.get("tools") or None
        template = self.tokenizer.get_chat_template(None, tools=tools)  # a tokenizer's named templates: "tool_use" when tools are given
        inputs = template_inputs(body, template)
        text = self.tokenizer.apply_chat_template(inputs.conversation, tools=inputs.tools, chat_template=template, tokenize=False, **inputs.kwargs)
        return text, inputs.add_special_tokens

    def _chat_tokens(self, body: dict[str, Any], apart: bool) -> int:
        text, special = self._chat_text(body)
        return _truncated(self._encode_lens([text], special, apart)[0], body)

    def _text_bound(self, text: str, add_special_tokens: bool) -> int | None:
        if self._normalizes and not text.isascii():
            return None
        return len(text.encode()) + (self._specials if add_special_tokens else 0)

    def bound(self, kind: str, body: dict[str, Any]) -> PromptBound | None:
        if self.tokenizer is None or not self._bounded:
            return None
        try:
            if kind == "chat":
                text, special = self._chat_text(body)  # rendering is string assembly: microseconds beside encoding
                bounds = [self._text_bound(text, special)]
            elif _token_id_prompts(body["prompt"]) is not None:
                return None  # exact already
            else:
                special = bool(body.get("add_special_tokens", True))
                bounds = [self._text_bound(p, special) for p in _prompts(body)]
        except Exception:  # a template that refuses the messages: `measure` estimates it, and so must the admission
            return None
        if any(b is None for b in bounds):
            return None
        return PromptBound(sum(_truncated(b, body) for b in bounds), self.fallback.measure(kind, body).tokens)  # type: ignore[arg-type]

    def measure(self, kind: str, body: dict[str, Any]) -> PromptCount:
        return self._measure(kind, body, apart=False)

    def measure_apart(self, kind: str, body: dict[str, Any]) -> PromptCount:
        return self._measure(kind, body, apart=True)

    def _measure(self, kind: str, body: dict[str, Any], apart: bool) -> PromptCount:
        if self.tokenizer is None:
            return self.fallback.measure(kind, body)
        try:
            if kind == "chat":
                return PromptCount(self._chat_tokens(body, apart), "tokenizer")
            if _token_id_prompts(body["prompt"]) is not None:
                return self.fallback.measure(kind, body)
            special = bool(body.get("add_special_tokens", True))
            return PromptCount(sum(_truncated(n, body) for n in self._encode_lens(_prompts(body), special, apart)), "tokenizer")
        except Exception as exc:  # a template that rejects these messages must not fail the request here (the engine answers it)
            log.debug("tokenizer failed (%s); estimating", exc)
            return self.fallback.measure(kind, body)

    def count(self, kind: str, body: dict[str, Any]) -> int:
        return self.measure(kind, body).tokens


def _started_encoders(spec: str, processes: int) -> Any:
    """`EncoderWorkers` for the tokenizer `spec` (its JSON), a worker answering; None, logged, when
    they cannot start (counting stays in this process)."""
    from slaq.sidecar.encoder import EncoderWorkers  # imports the parsing workers' module, which imports this one

    encoders = EncoderWorkers(spec, processes)
    try:
        encoders.pid()
    except Exception as exc:  # e.g. a sandbox that forbids processes: counting works without them
        log.warning("the tokenizer's encoder processes did not start (%s: %s); long prompts are encoded in the sidecar's own process",
                    type(exc).__name__, exc)
        encoders.close()
        return None
    return encoders


def _load_tokenizer(source: str, revision: str | None) -> Any:
    from transformers import AutoTokenizer  # heavy: only when a tokenizer is asked for

    # No remote code: the sidecar is the tenant boundary; a tokenizer that needs it is estimated.
    return AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=False)


def counter_for(tokenizer: str | None, revision: str | None = None) -> PromptCounter:
    """`--tokenizer`: the model's tokenizer, loading in the background; without one, the estimate."""
    if not tokenizer:
        log.warning("no --tokenizer: prompt tokens are ESTIMATED (4 ASCII characters or 1 other per token)")
        return EstimatingCounter()
    return TokenizerCounter.start(tokenizer, revision, encoder_processes=ENCODER_PROCESSES)
