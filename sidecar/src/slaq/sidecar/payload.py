"""Parsing and checking OpenAI request bodies before anything is charged or queued.

Every field is checked against the route's allowlist (`fields.py`) with the pool's bounds; every
failure names the field. What passes is what may reach the engine.

A large body is parsed, checked and re-serialised in a worker process (`ParserPool`), not on the
event loop that streams every other tenant's tokens: json's C decoder holds the GIL for a whole
parse, so a thread would not help (4 MiB of `[[1],[1],...]` blocked the loop ~0.7 s on 2 cores, in
a thread as on the loop). What comes back is a checked body (unpickled in a fraction of the parse's
time: the allowlist's bounds leave only token-id lists and strings large) and its serialisation.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from slaq.sidecar.errors import InvalidField, MalformedJSON, SidecarError, UnknownModel
from slaq.sidecar.fields import BodyLimits, Kind, check_fields, check_messages
from slaq.sidecar.tokens import PromptCount

__all__ = ["BodyLimits", "InferencePayload", "Kind", "ParserPool", "decode_json", "parse_payload"]

OFF_LOOP_BYTES = 64 * 1024  # larger bodies are parsed in a worker process (64 KiB parses in a few ms at worst)
WORKER_NICENESS = 5


@dataclass(slots=True)
class InferencePayload:
    kind: Kind
    body: dict[str, Any]
    model: str | None
    stream: bool
    max_tokens: int | None
    n: int  # completions the engine runs: `n` times the prompts of a batch
    include_usage: bool  # the client asked for the stream's usage chunk (the sidecar always asks the engine)
    continuous_usage: bool = False  # the client asked for usage in every chunk too (vLLM: only with include_usage)
    # The engine may produce tokens no chunk shows: hidden reasoning (`include_reasoning: false`) and the
    # control tokens of tool calls. The sidecar then asks for usage in every chunk, so a stream cut before
    # its usage chunk is charged the engine's count as of the last chunk (`ResponseObserver`).
    hides_tokens: bool = False
    tokens_per_event: int = 1  # `stream_interval`: tokens one streamed event may carry
    # vLLM computes a logprob distribution over the vocabulary at every prompt position (`prompt_logprobs`,
    # or completions' `echo` with `logprobs`): the prompt is charged twice, once as prompt and once as
    # output-like work.
    prompt_logprobs: bool = False
    # The body as compact JSON without `stream_options`, when a worker process parsed it: the engine's
    # body is this with the sidecar's fields spliced in front (`SidecarCore.enriched_body`).
    serialised: bytes | None = None
    prompt_count: PromptCount | None = None  # counted off the event loop (`SidecarCore.admit`), else when checked in

    @property
    def prompt_charge_factor(self) -> int:
        return 2 if self.prompt_logprobs else 1

    @property
    def max_output(self) -> int | None:
        """The most output tokens this request may produce (None: up to the context)."""
        return None if self.max_tokens is None else self.n * self.max_tokens


class _NonFinite(ValueError):
    """A number literal beyond float range (1e309 parses to inf): json.dumps would re-send it to
    the engine as `Infinity`, which is not JSON."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NonFinite(text)
    return value


def _path_of_non_finite(node: Any, path: str = "") -> str | None:
    """Where in a decoded body the first infinite number is (the refusal names it)."""
    if isinstance(node, float) and math.isinf(node):
        return path or "body"
    if isinstance(node, dict):
        items = ((f"{path}.{key}" if path else str(key), value) for key, value in node.items())
    elif isinstance(node, list):
        items = ((f"{path}[{i}]", value) for i, value in enumerate(node))
    else:
        return None
    for where, value in items:
        if (found := _path_of_non_finite(value, where)) is not None:
            return found
    return None


def decode_json(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except _NonFinite as exc:
        # Rare, so the body is decoded once more to name the field.
        try:
            where = _path_of_non_finite(json.loads(text, parse_constant=_reject_constant))
        except RecursionError:
            where = None
        raise InvalidField(where or "body", f"must be a finite number (got {str(exc)[:40]})") from None
    except UnicodeDecodeError as exc:
        raise MalformedJSON(f"body is not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except (json.JSONDecodeError, ValueError) as exc:
        raise MalformedJSON(f"body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise MalformedJSON("body is nested too deeply") from exc


def parse_payload(raw: bytes, kind: Kind, served_model_name: str | None, limits: BodyLimits | None = None,
                  cache_salt: str | None = None) -> InferencePayload:
    """Decode and check one body; with `cache_salt`, multimodal item ids are rewritten under it."""
    limits = limits or BodyLimits.default()
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise InvalidField("body", "must be a JSON object")
    check_fields(body, kind, limits)
    model = body.get("model")
    if model is not None and served_model_name is not None and model != served_model_name:
        raise UnknownModel(f"model {model!r} is not served here (this pool serves {served_model_name!r})")
    if kind == "chat":
        if body.get("messages") is None:
            raise InvalidField("messages", "is required")
        check_messages(body["messages"], cache_salt)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        if body.get("prompt") is None:
            raise InvalidField("prompt", "is required")
        max_tokens = body.get("max_tokens")
    n = body.get("n") or 1
    if kind == "completions" and isinstance(body["prompt"], list) and not isinstance(body["prompt"][0], int):
        n *= len(body["prompt"])  # a batch of prompts is that many completions
    stream = bool(body.get("stream", False))
    stream_options = body.get("stream_options") or {}
    include_usage = stream and bool(stream_options.get("include_usage"))
    hides_tokens = stream and kind == "chat" and (body.get("include_reasoning") is False or bool(body.get("tools")))
    return InferencePayload(kind=kind, body=body, model=model, stream=stream, max_tokens=max_tokens, n=n, include_usage=include_usage,
                            continuous_usage=include_usage and bool(stream_options.get("continuous_usage_stats")), hides_tokens=hides_tokens,
                            tokens_per_event=body.get("stream_interval") or 1, prompt_logprobs=_asks_prompt_logprobs(kind, body))


def _asks_prompt_logprobs(kind: Kind, body: dict[str, Any]) -> bool:
    """vLLM's rule: `prompt_logprobs`, or for completions `echo` with `logprobs` (0 included)."""
    if body.get("prompt_logprobs") is not None:
        return True
    return kind == "completions" and bool(body.get("echo")) and body.get("logprobs") is not None



def _parse_and_serialise(raw: bytes, kind: Kind, served_model_name: str | None, limits: BodyLimits,
                         cache_salt: str | None) -> InferencePayload | SidecarError:
    """In a worker process: `parse_payload`, plus the checked body's serialisation."""
    try:
        payload = parse_payload(raw, kind, served_model_name, limits, cache_salt)
    except SidecarError as error:
        return error
    rest = {key: value for key, value in payload.body.items() if key != "stream_options"}
    payload.serialised = json.dumps(rest, separators=(",", ":"), allow_nan=False).encode()
    return payload


def _lower_priority() -> None:
    """A worker yields the CPU to the serving process: streaming tokens comes before parsing a large body."""
    os.nice(WORKER_NICENESS)


class ParserPool:
    """A small pool of worker processes for bodies over `threshold` bytes (started on first use)."""

    def __init__(self, workers: int = 2, threshold: int = OFF_LOOP_BYTES) -> None:
        self.workers = workers
        self.threshold = threshold
        self._executor: ProcessPoolExecutor | None = None

    def wants(self, raw: bytes) -> bool:
        return len(raw) > self.threshold

    async def parse(self, raw: bytes, kind: Kind, served_model_name: str | None, limits: BodyLimits,
                    cache_salt: str | None) -> InferencePayload:
        if self._executor is None:
            # spawn: the sidecar runs threads (httpx, uvicorn), which fork must not copy.
            self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_lower_priority)
        result = await asyncio.wrap_future(self._executor.submit(_parse_and_serialise, raw, kind, served_model_name, limits, cache_salt))
        if isinstance(result, SidecarError):
            raise result
        return result

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
