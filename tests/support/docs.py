"""The repository's docs as tests read them: which files, and their code apart from their prose.

A doc is any Markdown file of the checkout outside build output, caches and virtual environments
(README.md, docs/, each component's README.md, helm/slaq/README.md, test data READMEs).
`split_code(text)` separates code (fenced blocks and 4-space indented lines) from prose;
`inline_spans(prose)` gives the backticked spans of the prose, a span may wrap across lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NOT_DOCS = {".git", ".cache", ".hypothesis", ".pytest_cache", ".venv", "build", "dist", "node_modules", "out"}
INLINE_SPAN = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, in the doc
    text: str


def repository_docs(root: Path = REPO_ROOT) -> list[Path]:
    return sorted(path for path in root.rglob("*.md")
                  if not NOT_DOCS & set(path.relative_to(root).parts) and not any(p.endswith(".egg-info") for p in path.parts))


def split_code(text: str) -> tuple[list[Line], list[Line]]:
    """(code lines, prose lines) of a Markdown text."""
    code: list[Line] = []
    prose: list[Line] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        (code if fenced or line.startswith("    ") and line.strip() else prose).append(Line(number, line))
    return code, prose


def inline_spans(prose: list[Line]) -> list[Line]:
    """Backticked spans of the prose, whitespace collapsed, each with the line it starts on; a blank
    line or code ends a paragraph, so a span never crosses one."""
    spans: list[Line] = []
    paragraph: list[Line] = []
    for line in [*prose, Line(0, "")]:
        if line.text.strip() and (not paragraph or line.number == paragraph[-1].number + 1):
            paragraph.append(line)
            continue
        joined = "\n".join(p.text for p in paragraph)
        for match in INLINE_SPAN.finditer(joined):
            start = paragraph[0].number + joined.count("\n", 0, match.start())
            spans.append(Line(start, " ".join(match.group(1).split())))
        paragraph = [line] if line.text.strip() else []
    return spans
