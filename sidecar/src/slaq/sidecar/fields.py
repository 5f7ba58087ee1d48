"""What a tenant may send: the request-body allowlist of each inference route, with types and bounds.

The sidecar is the tenant boundary. A body field is forwarded to the engine only when it is in the
route's allowlist below and its value passes the field's check; any other field is refused with
400 naming it (never silently dropped), so a client learns what slaq accepts. The lists cover the
fields of the OpenAI completions and chat APIs that vLLM 0.32 serves, and vLLM's sampling
extensions that only shape one request's own output. Left out on purpose (400 if sent):

- scheduling and identity, which the sidecar sets itself: `priority`, `cache_salt`, `vllm_xargs`,
  `request_id` (the sidecar's own id is returned as `x-request-id`);
- what reaches into the engine or other tenants: `kv_transfer_params`, `ec_transfer_params`,
  `session_id`, `prompt_embeds`, `mm_processor_kwargs`, `media_io_kwargs`, `chat_template`,
  `chat_template_kwargs`, `structured_outputs`, `repetition_detection`, `mm_payload`,
  `return_mm_kwargs`, `routed_experts_prompt_start`, `logprob_token_ids`, `return_token_offsets`,
  `return_prompt_text`, `watermarking`.

Bounds come from the pool (`RequestLimitsSpec` and the model's context length): `BodyLimits`.
`sidecar/README.md` carries the table `allowlist_markdown()` renders (a test keeps them equal).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Literal

from slaq.api.pool import RequestLimitsSpec
from slaq.sidecar.errors import InvalidField

Kind = Literal["completions", "chat"]
MAX_TOKENS_LIMIT = 1_048_576  # the largest context any pool may configure (ModelSpec.max_model_len)
MIN_BODY_BYTES = 64 * 1024
MAX_STRING_CHARS = 1024  # one stop string, one bad word, a user id, a suffix's bound is the body cap
CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
# image_embeds is not among them: tensors a tenant sends would be deserialised in the engine.
CONTENT_PART_TYPES = frozenset({"text", "image_url", "input_audio", "video_url", "audio_url", "file", "refusal"})
# Media by URL must come inline (data:): the engine would otherwise fetch an http(s) or file URL
# from inside the pod on the tenant's behalf (cluster-internal addresses, the pod's own ports).
URL_PART_TYPES = frozenset({"image_url", "video_url", "audio_url"})
# What a content part may hold besides `type` and `uuid`: its own key, and inside it these keys.
PART_VALUE_KEYS: dict[str, frozenset[str] | None] = {
    "text": None, "refusal": None,  # a string
    "image_url": frozenset({"url", "detail"}), "video_url": frozenset({"url"}), "audio_url": frozenset({"url"}),
    "input_audio": frozenset({"data", "format"}), "file": frozenset({"file_data", "file_id", "filename"}),
}


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The pool's bounds on one request body."""

    spec: RequestLimitsSpec
    max_model_len: int = MAX_TOKENS_LIMIT

    @classmethod
    def default(cls) -> "BodyLimits":
        return cls(RequestLimitsSpec())

    @property
    def max_body_bytes(self) -> int:
        """maxModelLen × bytesPerToken, at least 64 KiB and at most the pool's maxBodyBytes."""
        return min(self.spec.max_body_bytes, max(MIN_BODY_BYTES, self.max_model_len * self.spec.bytes_per_token))


Check = Callable[[Any, BodyLimits], "str | None"]  # None: the value is acceptable; else the problem


@dataclass(frozen=True, slots=True)
class FieldRule:
    name: str
    accepts: str  # for the docs table: the type and bound, in words
    check: Check


# -- value checks -----------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _boolean(v: Any, _: BodyLimits) -> str | None:
    return None if isinstance(v, bool) else "must be a boolean"


def _short_string(v: Any, _: BodyLimits) -> str | None:
    return None if isinstance(v, str) and len(v) <= MAX_STRING_CHARS else f"must be a string of at most {MAX_STRING_CHARS} characters"


def _string(v: Any, _: BodyLimits) -> str | None:
    return None if isinstance(v, str) else "must be a string"


def _number_in(low: float, high: float, *, open_low: bool = False) -> Check:
    def check(v: Any, _: BodyLimits) -> str | None:
        ok = _is_number(v) and (v > low if open_low else v >= low) and v <= high
        return None if ok else f"must be a number in {'(' if open_low else '['}{low:g}, {high:g}]"
    return check


def _int_in(low: int, high: Callable[[BodyLimits], int] | int, what: str = "") -> Check:
    def check(v: Any, limits: BodyLimits) -> str | None:
        top = high(limits) if callable(high) else high
        return None if _is_int(v) and low <= v <= top else f"must be an integer in [{low}, {top}]{what}"
    return check


def _one_of(*values: str) -> Check:
    def check(v: Any, _: BodyLimits) -> str | None:
        return None if v in values else f"must be one of {list(values)}"
    return check


def _max_tokens(v: Any, limits: BodyLimits) -> str | None:
    return _int_in(1, limits.max_model_len, " (the pool's maxModelLen)")(v, limits)


def _n(v: Any, limits: BodyLimits) -> str | None:
    return _int_in(1, limits.spec.max_n, " (the pool's requestLimits.maxN)")(v, limits)


def _logprobs_int(v: Any, limits: BodyLimits) -> str | None:
    return _int_in(0, limits.spec.max_logprobs, " (the pool's requestLimits.maxLogprobs)")(v, limits)


def _logprobs_chat(v: Any, _: BodyLimits) -> str | None:
    return _boolean(v, _)


def _stop(v: Any, limits: BodyLimits) -> str | None:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) and 0 < len(s) <= MAX_STRING_CHARS for s in v) or len(v) > limits.spec.max_stop:
        return f"must be a string or a list of at most {limits.spec.max_stop} non-empty strings of at most {MAX_STRING_CHARS} characters"
    return None


def _token_list(bound: Callable[[BodyLimits], int], name: str) -> Check:
    def check(v: Any, limits: BodyLimits) -> str | None:
        top = bound(limits)
        if isinstance(v, list) and len(v) <= top and all(_is_int(t) and t >= 0 for t in v):
            return None
        return f"must be a list of at most {top} token ids >= 0{name}"
    return check


def _string_list(v: Any, limits: BodyLimits) -> str | None:
    if isinstance(v, list) and len(v) <= limits.spec.max_stop and all(isinstance(s, str) and len(s) <= MAX_STRING_CHARS for s in v):
        return None
    return f"must be a list of at most {limits.spec.max_stop} strings (the pool's requestLimits.maxStop)"


def _logit_bias(v: Any, limits: BodyLimits) -> str | None:
    if (isinstance(v, dict) and len(v) <= limits.spec.max_logit_bias
            and all(k.isdigit() and _is_number(b) and -100 <= b <= 100 for k, b in v.items())):
        return None
    return f"must map at most {limits.spec.max_logit_bias} token ids to numbers in [-100, 100] (the pool's requestLimits.maxLogitBias)"


def _stream_options(v: Any, _: BodyLimits) -> str | None:
    if not isinstance(v, dict):
        return "must be an object"
    for key, value in v.items():
        if key not in ("include_usage", "continuous_usage_stats"):
            return f"has unknown key {key!r} (accepted: include_usage, continuous_usage_stats)"
        if value is not None and not isinstance(value, bool):
            return f"{key} must be a boolean"
    return None


def _nesting_depth(value: Any, stop_above: int) -> int:
    """Levels of objects and lists in `value` (a scalar is 0); stops counting past `stop_above`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > stop_above:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def grammar_problem(v: Any, limits: BodyLimits, what: str = "") -> str | None:
    """The engine compiles `response_format`, `tools` and `tool_choice` into a grammar (xgrammar, on its
    own CPU, per request): bounded in serialised size and nesting depth beyond the body cap."""
    top = limits.spec.max_schema_depth
    if _nesting_depth(v, top) > top:
        return f"{what}nests deeper than {top} levels of objects and lists (the pool's requestLimits.maxSchemaDepth)"
    size = len(json.dumps(v, separators=(",", ":")))
    if size > limits.spec.max_schema_bytes:
        return f"{what}is {size} bytes as JSON; at most {limits.spec.max_schema_bytes} (the pool's requestLimits.maxSchemaBytes)"
    return None


def _response_format(v: Any, limits: BodyLimits) -> str | None:
    if not isinstance(v, dict) or v.get("type") not in ("text", "json_object", "json_schema", "structural_tag"):
        return "must be an object whose type is text, json_object, json_schema or structural_tag"
    return grammar_problem(v, limits)


def _beam_search(v: Any, limits: BodyLimits) -> str | None:
    if not isinstance(v, bool):
        return "must be a boolean"
    if v and not limits.spec.allow_beam_search:
        return "beam search is not allowed on this pool (requestLimits.allowBeamSearch)"
    return None


def _tool_choice(v: Any, limits: BodyLimits) -> str | None:
    if isinstance(v, str):
        return None if len(v) <= MAX_STRING_CHARS else f"must be a string of at most {MAX_STRING_CHARS} characters"
    return grammar_problem(v, limits) if isinstance(v, dict) else "must be an object or a string"


def _tools(v: Any, limits: BodyLimits) -> str | None:
    top = limits.spec.max_tools
    if isinstance(v, list) and len(v) <= top and all(isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict) for t in v):
        return grammar_problem(v, limits, "together ")
    return f"must be a list of at most {top} objects of type function (the pool's requestLimits.maxTools)"


def _documents(v: Any, limits: BodyLimits) -> str | None:
    top = limits.spec.max_messages
    if isinstance(v, list) and len(v) <= top and all(isinstance(d, dict) and all(isinstance(x, str) for x in d.values()) for d in v):
        return None
    return f"must be a list of at most {top} objects of strings"


def _prompt(v: Any, limits: BodyLimits) -> str | None:
    bad = "must be a non-empty string, a list of strings, a list of token ids or a list of token-id lists"
    if isinstance(v, str):
        return None if v else "must not be empty"
    if not isinstance(v, list) or not v:
        return bad
    if all(_is_int(t) for t in v):
        return None if all(t >= 0 for t in v) else "token ids must be >= 0"
    if len(v) > limits.spec.max_prompt_batch:
        return f"holds {len(v)} prompts; at most {limits.spec.max_prompt_batch} (the pool's requestLimits.maxPromptBatch)"
    if all(isinstance(p, str) for p in v):
        return None
    if all(isinstance(p, list) and p and all(_is_int(t) and t >= 0 for t in p) for p in v):
        return None
    return bad


def _messages(v: Any, limits: BodyLimits) -> str | None:
    """Shape only; each message is checked by `check_messages`, which names the message."""
    if not isinstance(v, list) or not v:
        return "must be a non-empty list"
    if len(v) > limits.spec.max_messages:
        return f"holds {len(v)} messages; at most {limits.spec.max_messages} (the pool's requestLimits.maxMessages)"
    return None


def _max_logprobs(limits: BodyLimits) -> int:
    return limits.spec.max_logprobs


def _max_stop(limits: BodyLimits) -> int:
    return limits.spec.max_stop


def _context(limits: BodyLimits) -> int:
    return limits.max_model_len


def _flags(*names: str) -> tuple[FieldRule, ...]:
    return tuple(FieldRule(name, "boolean", _boolean) for name in names)


def _rules(*rules: FieldRule) -> dict[str, FieldRule]:
    return {rule.name: rule for rule in rules}


_SHARED = (
    FieldRule("model", "string", _string),
    FieldRule("frequency_penalty", "number in [-2, 2]", _number_in(-2, 2)),
    FieldRule("presence_penalty", "number in [-2, 2]", _number_in(-2, 2)),
    FieldRule("repetition_penalty", "number in (0, 2]", _number_in(0, 2, open_low=True)),
    FieldRule("length_penalty", "number in [-10, 10]", _number_in(-10, 10)),
    FieldRule("logit_bias", "object: token id → number in [-100, 100], at most maxLogitBias entries", _logit_bias),
    FieldRule("max_tokens", "integer in [1, maxModelLen]", _max_tokens),
    FieldRule("min_tokens", "integer in [0, maxModelLen]", _int_in(0, _context)),
    FieldRule("n", "integer in [1, maxN]", _n),
    FieldRule("seed", "integer", lambda v, _: None if _is_int(v) else "must be an integer"),
    FieldRule("stop", "string or list of at most maxStop strings", _stop),
    FieldRule("stop_token_ids", "list of at most maxStop token ids", _token_list(_max_stop, " (the pool's requestLimits.maxStop)")),
    FieldRule("bad_words", "list of at most maxStop strings", _string_list),
    FieldRule("allowed_token_ids", "list of at most maxModelLen token ids", _token_list(_context, "")),
    FieldRule("stream", "boolean", _boolean),
    FieldRule("stream_options", "object: include_usage, continuous_usage_stats (booleans)", _stream_options),
    FieldRule("stream_interval", "integer in [1, 1024]", _int_in(1, 1024)),
    FieldRule("temperature", "number in [0, 100]", _number_in(0, 100)),
    FieldRule("top_p", "number in (0, 1]", _number_in(0, 1, open_low=True)),
    FieldRule("top_k", "integer in [-1, 1048576]", _int_in(-1, MAX_TOKENS_LIMIT)),
    FieldRule("min_p", "number in [0, 1]", _number_in(0, 1)),
    FieldRule("user", "string of at most 1024 characters", _short_string),
    FieldRule("use_beam_search", "boolean; true only where the pool's allowBeamSearch is", _beam_search),
    FieldRule("truncate_prompt_tokens", "integer in [-1, maxModelLen]", _int_in(-1, _context)),
    FieldRule("truncation_side", "left or right", _one_of("left", "right")),
    FieldRule("prompt_logprobs", "integer in [0, maxLogprobs]", _logprobs_int),
    FieldRule("response_format", "object with type text, json_object, json_schema or structural_tag, within maxSchemaBytes and maxSchemaDepth", _response_format),
    FieldRule("thinking_token_budget", "integer in [0, maxModelLen]", _int_in(0, _context)),
    *_flags("include_stop_str_in_output", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "add_special_tokens",
            "echo", "return_tokens_as_token_ids", "return_token_ids"),
)

COMPLETIONS_FIELDS = _rules(
    FieldRule("prompt", "string, list of at most maxPromptBatch strings, token ids, or token-id lists", _prompt),
    FieldRule("suffix", "string", _string),
    FieldRule("logprobs", "integer in [0, maxLogprobs]", _logprobs_int),
    *_SHARED,
)

CHAT_FIELDS = _rules(
    FieldRule("messages", "list of at most maxMessages messages (roles system, user, assistant, tool, developer, function)", _messages),
    FieldRule("max_completion_tokens", "integer in [1, maxModelLen]", _max_tokens),
    FieldRule("logprobs", "boolean", _logprobs_chat),
    FieldRule("top_logprobs", "integer in [0, maxLogprobs]", _logprobs_int),
    FieldRule("tools", "list of at most maxTools function tools, together within maxSchemaBytes and maxSchemaDepth", _tools),
    FieldRule("tool_choice", "none, auto, required, or an object naming a function, within maxSchemaBytes and maxSchemaDepth", _tool_choice),
    FieldRule("reasoning_effort", "none, minimal, low, medium, high or xhigh", _one_of("none", "minimal", "low", "medium", "high", "xhigh")),
    FieldRule("documents", "list of at most maxMessages objects of strings", _documents),
    *_flags("parallel_tool_calls", "include_reasoning", "add_generation_prompt", "continue_final_message"),
    *_SHARED,
)

ALLOWLISTS: dict[Kind, dict[str, FieldRule]] = {"completions": COMPLETIONS_FIELDS, "chat": CHAT_FIELDS}


def check_fields(body: dict[str, Any], kind: Kind, limits: BodyLimits) -> None:
    """Refuse the first field outside the route's allowlist, or whose value is out of bounds."""
    rules = ALLOWLISTS[kind]
    for name, value in body.items():
        rule = rules.get(name)
        if rule is None:
            raise InvalidField(name, f"is not accepted by slaq on /v1/{'chat/completions' if kind == 'chat' else 'completions'} (sidecar/README.md lists the fields)")
        if value is None:
            continue
        problem = rule.check(value, limits)
        if problem is not None:
            raise InvalidField(name, problem)


# -- chat messages ---------------------------------------------------------------------------
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning", "refusal", "function_call"})


def check_messages(messages: list[Any], cache_salt: str | None = None) -> None:
    """Each message's shape; with `cache_salt`, content parts' multimodal `uuid`s are rewritten in place
    under the tenant's salt, so two tenants never share a multimodal cache entry."""
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidField(where, "must be an object")
        for key in message:
            if key not in _MESSAGE_KEYS:
                raise InvalidField(f"{where}.{key}", f"is not accepted by slaq (accepted: {', '.join(sorted(_MESSAGE_KEYS))})")
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
            if not isinstance(part, dict) or part.get("type") not in CONTENT_PART_TYPES:
                raise InvalidField(f"{where}.content[{j}]", f"must be an object whose type is one of {sorted(CONTENT_PART_TYPES)}")
            kind = part["type"]
            for key in part:
                if key not in ("type", "uuid", kind):
                    raise InvalidField(f"{where}.content[{j}].{key}", f"is not accepted in a {kind} part (accepted: type, uuid, {kind})")
            value = part.get(kind)
            allowed = PART_VALUE_KEYS[kind]
            if allowed is not None and isinstance(value, dict):
                for key in value:
                    if key not in allowed:
                        raise InvalidField(f"{where}.content[{j}].{kind}.{key}", f"is not accepted (accepted: {', '.join(sorted(allowed))})")
            if kind in URL_PART_TYPES:
                media = part.get(kind)
                url = media.get("url") if isinstance(media, dict) else media
                if not isinstance(url, str) or not url.startswith("data:"):
                    raise InvalidField(f"{where}.content[{j}].{kind}.url", "must be a data: URL (the engine fetches no URL on a tenant's behalf)")
            uuid = part.get("uuid")
            if uuid is not None:
                if not isinstance(uuid, str) or len(uuid) > MAX_STRING_CHARS:
                    raise InvalidField(f"{where}.content[{j}].uuid", f"must be a string of at most {MAX_STRING_CHARS} characters")
                if cache_salt is not None:
                    part["uuid"] = salted_uuid(uuid, cache_salt)


def salted_uuid(uuid: str, cache_salt: str) -> str:
    """A tenant's multimodal item id as the engine sees it: its cache entry is the tenant's own."""
    return "slaq-" + hashlib.sha256(f"{cache_salt}\0{uuid}".encode()).hexdigest()[:32]


def allowlist_markdown() -> str:
    """The table sidecar/README.md carries: every accepted field, its routes and what it accepts."""
    names = sorted(set(COMPLETIONS_FIELDS) | set(CHAT_FIELDS))
    lines = ["| field | completions | chat | accepts |", "|---|---|---|---|"]
    for name in names:
        rules = [r for r in (COMPLETIONS_FIELDS.get(name), CHAT_FIELDS.get(name)) if r is not None]
        accepts = " / ".join(dict.fromkeys(r.accepts for r in rules))
        lines.append(f"| `{name}` | {'yes' if name in COMPLETIONS_FIELDS else ''} | {'yes' if name in CHAT_FIELDS else ''} | {accepts} |")
    return "\n".join(lines)
