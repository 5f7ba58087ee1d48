"""One line of a server-sent-event stream as OpenAI-compatible servers write it (vLLM, the sidecar).

Every client of a streamed completion in this project (the demo's load generator, the live
benchmark, the e2e traffic, the engine tests) reads its lines through `sse_data`.
"""

from __future__ import annotations

import json
from typing import Any, Final


class _Done:
    def __repr__(self) -> str:
        return "DONE"


DONE: Final = _Done()  # the stream's closing `data: [DONE]`


def sse_data(line: str | bytes) -> Any:
    """The parsed JSON of a `data:` line; DONE for `data: [DONE]`; None for any other line
    (blank lines between events, `:` comments, other fields). Malformed JSON raises ValueError."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return DONE
    return json.loads(payload)
