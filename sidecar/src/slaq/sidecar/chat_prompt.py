"""A chat request as vLLM 0.32 hands it to the model's chat template, so the sidecar counts the prompt
the engine will count (`usage.prompt_tokens`).

vLLM (renderers/chat_utils.py, renderers/hf.py, chat_completion/protocol.py) renders a chat body in
these steps, which `template_inputs` repeats for a Hugging Face tokenizer:

- each message's content becomes a string (text parts joined with a newline) when the template
  treats content as a string, or a list of `{"type": "text", "text": ...}` parts when the template
  loops over `message.content` ("openai" content format, detected from the template's syntax tree);
- an assistant message keeps its `tool_calls`, with each call's `arguments` decoded from its JSON
  string into an object (`{}` when empty or not an object); `reasoning` rides along; a tool
  message keeps `tool_call_id`; `name` is kept;
- `developer` messages become `system` messages when the template never names the developer role
  (and the system messages are then merged into one at the front);
- `tools` are the request's tools as vLLM's pydantic models dump them (`description` and
  `parameters` present, null when absent; `strict` only when set);
- the template's keyword arguments are `add_generation_prompt` (default true),
  `continue_final_message`, `documents`, `reasoning_effort` (and `enable_thinking` when it is
  set), unset ones left out;
- the rendered text is encoded with `add_special_tokens` false unless the request sets it.

Not repeated: multimodal placeholders (image/audio tokens are counted by the engine only; the
engine's usage settles them), Mistral and gpt-oss (harmony) renderers, a processor's own chat
template, and engine-side `--chat-template`/`--default-chat-template-kwargs` (the sidecar refuses a
request's own `chat_template` and `chat_template_kwargs`). `response_format` and `tool_choice` never
reach a Hugging Face template in vLLM 0.32, so they are not prompt tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

ContentFormat = Literal["string", "openai"]
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})


@dataclass(frozen=True, slots=True)
class TemplateInputs:
    """What `tokenizer.apply_chat_template` is called with, and how the result is encoded."""

    conversation: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    kwargs: dict[str, Any]
    add_special_tokens: bool


def template_inputs(body: dict[str, Any], chat_template: str) -> TemplateInputs:
    """The inputs vLLM 0.32 gives `chat_template` for this (already checked) chat body."""
    conversation = [_message(m, content_format(chat_template)) for m in body["messages"]]
    _decode_tool_call_arguments(conversation)
    if any(m["role"] == "developer" for m in conversation) and not _names_developer_role(chat_template):
        conversation = _consolidate_system([{**{k: v for k, v in m.items() if k != "tools"}, "role": "system"} if m["role"] == "developer" else m
                                            for m in conversation])
    tools = body.get("tools")
    kwargs = {"add_generation_prompt": body.get("add_generation_prompt", True), "continue_final_message": body.get("continue_final_message", False)}
    for name in ("documents", "reasoning_effort"):
        if body.get(name) is not None:
            kwargs[name] = body[name]
    if body.get("reasoning_effort") is not None:
        kwargs["enable_thinking"] = body["reasoning_effort"] != "none"
    return TemplateInputs(conversation, [vllm_tool(t) for t in tools] if tools else None, kwargs, bool(body.get("add_special_tokens", False)))


def vllm_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A request tool as vLLM's `ChatCompletionToolsParam.model_dump()` gives it to the template."""
    function = tool["function"]
    dumped: dict[str, Any] = {"name": function.get("name"), "description": function.get("description"), "parameters": function.get("parameters")}
    for optional in ("strict", "defer_loading"):
        if function.get(optional) is not None:
            dumped[optional] = function[optional]
    if tool.get("defer_loading") is not None:
        dumped.setdefault("defer_loading", tool["defer_loading"])
    result: dict[str, Any] = {"type": "function", "function": dumped}
    if tool.get("defer_loading") is not None:
        result["defer_loading"] = tool["defer_loading"]
    return result


def _texts(content: Any) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    texts = []
    for part in content:
        kind = part.get("type")
        if kind in TEXT_PART_TYPES and isinstance(part.get(kind), str):
            texts.append(part[kind])
    return texts


def _message(message: dict[str, Any], fmt: ContentFormat) -> dict[str, Any]:
    role = message["role"]
    texts = _texts(message.get("content"))
    content: Any = [{"type": "text", "text": t} for t in texts] if fmt == "openai" else "\n".join(texts)
    if role == "tool" and isinstance(content, list):
        content = "\n".join(texts)  # vLLM flattens a tool message's text parts for every template
    result: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            result["tool_calls"] = [dict(call, function=dict(call["function"])) if isinstance(call, dict) and isinstance(call.get("function"), dict)
                                    else call for call in message["tool_calls"]]
        if message.get("reasoning") is not None:
            result["reasoning"] = result["reasoning_content"] = message["reasoning"]
    elif role == "tool" and "tool_call_id" in message:
        result["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        result["name"] = message["name"]
    if role == "developer":
        result["tools"] = None
    return result


def _decode_tool_call_arguments(conversation: list[dict[str, Any]]) -> None:
    for message in conversation:
        calls = message.get("tool_calls")
        if message["role"] != "assistant" or not isinstance(calls, list):
            continue
        if not calls:
            del message["tool_calls"]
            continue
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    arguments = None
            function["arguments"] = arguments if isinstance(arguments, dict) else {}


def _names_developer_role(chat_template: str) -> bool:
    return '"developer"' in chat_template or "'developer'" in chat_template


def _consolidate_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    systems, others, merge = [], [], False
    for i, message in enumerate(conversation):
        if message["role"] != "system":
            others.append(message)
            continue
        merge = merge or i > 0 or bool(systems)
        content = message.get("content", "")
        if isinstance(content, list):
            content = "\n".join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
        if content:
            systems.append(content)
    if not merge:
        return conversation
    return [{"role": "system", "content": "\n\n".join(systems)}, *others]


@lru_cache(maxsize=8)
def content_format(chat_template: str) -> ContentFormat:
    """"openai" when the template loops over a message's content (vLLM's detection, without its
    macro-argument tracking), else "string"."""
    try:
        import jinja2.nodes
        from transformers.utils.chat_template_utils import _compile_jinja_template

        root = _compile_jinja_template(chat_template).environment.parse(chat_template)
    except Exception:  # vLLM falls back to "string" for a template it cannot parse
        return "string"

    def loads(node: Any, name: str, key: str | None = None) -> bool:
        if isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)):
            return node.node is not None and loads(node.node, name, key)
        if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
            return loads(node.node, name, key)
        if key is None:
            return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name
        if isinstance(node, jinja2.nodes.Getitem):
            return loads(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
        return isinstance(node, jinja2.nodes.Getattr) and loads(node.node, name) and node.attr == key

    lists, pending = ["messages"], ["messages"]
    while pending:
        name = pending.pop()
        for assign in root.find_all(jinja2.nodes.Assign):
            if isinstance(assign.target, jinja2.nodes.Name) and loads(assign.node, name) and assign.target.name not in lists:
                lists.append(assign.target.name)
                pending.append(assign.target.name)
    loops = list(root.find_all(jinja2.nodes.For))
    items = [loop.target.name for loop in loops if isinstance(loop.target, jinja2.nodes.Name) and any(loads(loop.iter, n) for n in lists)]
    in_macros = {id(loop) for macro in root.find_all(jinja2.nodes.Macro) for loop in macro.find_all(jinja2.nodes.For)}
    for loop in loops:
        if any(loads(loop.iter, item, "content") for item in items):
            return "openai"
        if id(loop) not in in_macros and isinstance(loop.iter, jinja2.nodes.Name) and loop.iter.name == "content":
            return "openai"
    return "string"
