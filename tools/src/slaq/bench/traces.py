"""Reading request traces in the Azure LLM inference format (`TIMESTAMP,ContextTokens,GeneratedTokens`).

The bundled traces (`BUNDLED_TRACES`, package data in `tools/src/slaq/bench/traces/`) are the Azure LLM inference
traces 2023 of the conversation service (`conv`, the default: `BUNDLED_TRACE`) and of the
code-completion service (`code`: prompts of 2k tokens on average, outputs of tens) (Azure/AzurePublicDataset,
CC-BY 4.0; Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting",
ISCA 2024). Anything derived from them keeps that attribution.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from slaq.bench.errors import TraceError

TRACE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
# The folder `traces/` beside this module holds the data; `slaq.bench.traces` stays this module.
_TRACES = Path(__file__).resolve().parent / "traces"
BUNDLED_TRACES = {"conv": _TRACES / "azure_llm_conv_2023.csv", "code": _TRACES / "azure_llm_code_2023.csv"}
BUNDLED_TRACE = BUNDLED_TRACES["conv"]
TRACE_ATTRIBUTION = (
    "Azure LLM inference trace 2023 (Azure/AzurePublicDataset, CC-BY 4.0); Patel et al., "
    "\"Splitwise: Efficient generative LLM inference using phase splitting\", ISCA 2024."
)


def trace_attribution(path: str | Path) -> str:
    """What a report says of the trace that ran: a bundled trace's source and licence, or the path
    of one given with `--trace PATH` (whose source and licence slaq does not know)."""
    resolved = Path(path).resolve()
    for name, bundled in BUNDLED_TRACES.items():
        if resolved == bundled:
            return f"{bundled.name} (`--trace {name}`): {TRACE_ATTRIBUTION}"
    return f"{path}: a trace given by path; its source and licence are its owner's"


def trace_path(text: str) -> Path:
    """`--trace`: a bundled trace by name (`conv`, `code`), or the path of a CSV."""
    return BUNDLED_TRACES.get(text) or Path(text)


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace: arrival in seconds after the trace's first request, token counts."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def _parse_timestamp(text: str) -> float:
    # The Azure trace carries 7 fractional digits, more than datetime accepts.
    head, _, fraction = text.strip().partition(".")
    stamp = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return stamp + (float("0." + fraction) if fraction else 0.0)


def read_trace(path: str | Path, *, limit: int | None = None) -> list[TraceRow]:
    """The first `limit` rows of a trace, sorted by arrival, arrivals relative to the first row."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    stamps: list[tuple[float, int, int]] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; expected header {','.join(TRACE_COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            if not any((value or "").strip() for value in row.values()):
                continue
            try:
                stamp = _parse_timestamp(row["TIMESTAMP"])
                prompt, output = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (ValueError, TypeError) as exc:
                raise TraceError(f"{path}:{line}: cannot read row {row!r}: {exc}") from exc
            if prompt < 1 or output < 1:
                raise TraceError(f"{path}:{line}: ContextTokens and GeneratedTokens must be >= 1, got {prompt}, {output}")
            stamps.append((stamp, prompt, output))
            if limit is not None and len(stamps) >= limit:
                break
    if not stamps:
        raise TraceError(f"{path}: no requests")
    stamps.sort(key=lambda s: s[0])
    first = stamps[0][0]
    return [TraceRow(round(s - first, 6), p, o) for s, p, o in stamps]


def densest_window(rows: list[TraceRow], window_s: float) -> list[TraceRow]:
    """The rows inside the `window_s`-second window holding the most arrivals, re-based to start at 0."""
    if window_s <= 0:
        raise TraceError(f"window must be positive, got {window_s}")
    best_start, best_count, left = 0, 0, 0
    for right, row in enumerate(rows):
        while row.arrival_s - rows[left].arrival_s > window_s:
            left += 1
        if right - left + 1 > best_count:
            best_start, best_count = left, right - left + 1
    chosen = rows[best_start : best_start + best_count]
    origin = chosen[0].arrival_s
    return [TraceRow(round(r.arrival_s - origin, 6), r.prompt_tokens, r.output_tokens) for r in chosen]
