"""Parsing and checking OpenAI request bodies before anything is charged or queued.

Only what the sidecar relies on, or what would otherwise reach the engine as an obvious client
error, is checked here; every failure names the field. Everything else passes through untouched
for the engine to judge.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from slaq.sidecar.errors import InvalidField, MalformedJSON, UnknownModel

MAX_TOKENS_LIMIT = 1_048_576  # the largest context any pool may configure (ModelSpec.max_model_len)
MAX_N = 128
CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})

Kind = Literal["completions", "chat"]


@dataclass(slots=True)
class InferencePayload:
    kind: Kind
    body: dict[str, Any]
    model: str | None
    stream: bool
    max_tokens: int | None
    n: int


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_json(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise MalformedJSON(f"body is not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except (json.JSONDecodeError, ValueError) as exc:
        raise MalformedJSON(f"body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise MalformedJSON("body is nested too deeply") from exc


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _optional(body: dict[str, Any], name: str, check: Any, problem: str) -> None:
    if name in body and body[name] is not None and not check(body[name]):
        raise InvalidField(name, problem)


def _int_in(low: int, high: int) -> Any:
    return lambda v: _is_int(v) and low <= v <= high


def _check_sampling(body: dict[str, Any]) -> None:
    _optional(body, "stream", lambda v: isinstance(v, bool), "must be a boolean")
    _optional(body, "temperature", lambda v: _is_number(v) and v >= 0, "must be a number >= 0")
    _optional(body, "top_p", lambda v: _is_number(v) and 0 < v <= 1, "must be a number in (0, 1]")
    _optional(body, "top_k", lambda v: _is_int(v) and v >= -1, "must be an integer >= -1")
    _optional(body, "presence_penalty", lambda v: _is_number(v) and -2 <= v <= 2, "must be a number in [-2, 2]")
    _optional(body, "frequency_penalty", lambda v: _is_number(v) and -2 <= v <= 2, "must be a number in [-2, 2]")
    _optional(body, "seed", _is_int, "must be an integer")
    _optional(body, "n", _int_in(1, MAX_N), f"must be an integer in [1, {MAX_N}]")
    _optional(body, "user", lambda v: isinstance(v, str), "must be a string")
    _optional(
        body, "stop", lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
        "must be a string or a list of strings",
    )
    _optional(body, "stream_options", lambda v: isinstance(v, dict), "must be an object")
    for name in ("max_tokens", "max_completion_tokens"):
        _optional(body, name, _int_in(1, MAX_TOKENS_LIMIT), f"must be an integer in [1, {MAX_TOKENS_LIMIT}]")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidField("messages", "must be a non-empty list")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidField(where, "must be an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise InvalidField(f"{where}.role", f"must be one of {sorted(CHAT_ROLES)}")
        content = message.get("content")
        if content is None:
            if role in ("user", "system", "developer"):
                raise InvalidField(f"{where}.content", "is required")
            continue
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise InvalidField(f"{where}.content", "must be a string or a list of content parts")
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise InvalidField(f"{where}.content[{j}]", "must be an object with a string 'type'")


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidField("prompt", "must not be empty")
        return
    if not isinstance(prompt, list) or not prompt:
        raise InvalidField("prompt", "must be a string, a list of strings, or a list of token ids")
    if all(isinstance(p, str) for p in prompt):
        return
    if all(_is_int(p) for p in prompt):
        if any(p < 0 for p in prompt):
            raise InvalidField("prompt", "token ids must be >= 0")
        return
    if all(isinstance(p, list) and p and all(_is_int(t) and t >= 0 for t in p) for p in prompt):
        return
    raise InvalidField("prompt", "must be a string, a list of strings, or a list of token ids")


def parse_payload(raw: bytes, kind: Kind, served_model_name: str | None) -> InferencePayload:
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise InvalidField("body", "must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidField("model", "must be a string")
    if model is not None and served_model_name is not None and model != served_model_name:
        raise UnknownModel(f"model {model!r} is not served here (this pool serves {served_model_name!r})")
    _check_sampling(body)
    if kind == "chat":
        _check_messages(body.get("messages"))
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        if "prompt" not in body:
            raise InvalidField("prompt", "is required")
        _check_prompt(body["prompt"])
        max_tokens = body.get("max_tokens")
    n = body.get("n") or 1
    if kind == "completions" and isinstance(body["prompt"], list) and not _is_int(body["prompt"][0]):
        n *= len(body["prompt"])  # a batch of prompts is that many completions
    return InferencePayload(kind=kind, body=body, model=model, stream=bool(body.get("stream", False)), max_tokens=max_tokens, n=n)
