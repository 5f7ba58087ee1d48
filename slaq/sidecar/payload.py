"""Parsing and checking OpenAI request bodies before anything is charged or queued.

Every field is checked against the route's allowlist (`fields.py`) with the pool's bounds; every
failure names the field. What passes is what may reach the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slaq.sidecar.errors import InvalidField, MalformedJSON, UnknownModel
from slaq.sidecar.fields import BodyLimits, Kind, check_fields, check_messages

__all__ = ["BodyLimits", "InferencePayload", "Kind", "decode_json", "parse_payload"]


@dataclass(slots=True)
class InferencePayload:
    kind: Kind
    body: dict[str, Any]
    model: str | None
    stream: bool
    max_tokens: int | None
    n: int  # completions the engine runs: `n` times the prompts of a batch
    include_usage: bool  # the client asked for the stream's usage chunk (the sidecar always asks the engine)


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
    include_usage = stream and bool((body.get("stream_options") or {}).get("include_usage"))
    return InferencePayload(kind=kind, body=body, model=model, stream=stream, max_tokens=max_tokens, n=n, include_usage=include_usage)
