"""The docs speak of the project as it is: no word of how it was written, no file or module that is not there.

Checked in every doc (tests/support/docs.py says which files those are):
- "session" only as a technical term (an HTTP or TLS session, a pytest session), never about
  the work ("this session", "session 7");
- every repository path it names exists: a path whose first folder is one of the repository's
  top-level entries or of the doc's own folder, a path relative to the doc (`../x`), and a bare
  file name (`queue.py`) of a kind the repository holds, looked up in the part of the repository
  the doc describes (its own folder; for docs/NAME.md the folder NAME/ when there is one; the
  whole repository for the others);
- every dotted `slaq.…` name resolves to a package, a module, or a name a module defines.

Decision records (docs/decisions/NNNN-title.md) are docs like the others, their bare file names
looked up in the whole repository (a superseded record's paths are those of the layout it describes,
and are not checked); each has a `# NNNN: title` heading and the sections Context,
Decision, Consequences and Measurement, in that order, and docs/decisions/README.md lists each.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests.support.docs import NOT_DOCS, REPO_ROOT, inline_spans, repository_docs, split_code
from tests.support.layout import COMPONENTS, module_path

WORK_SESSION = re.compile(r"\bsessions?\b", re.IGNORECASE)
TECHNICAL_SESSION = re.compile(
    r"\b(?:https?|tls|ssl|ssh|tcp|grpc|pytest|browser|login|user|client)[ -]sessions?\b"
    r"|\bsessions?[ -](?:affinity|cookies?|tokens?|tickets?|keys?|resumption|scope[sd]?|fixtures?|ids?)\b"
    r"|scope=[\"']?session", re.IGNORECASE)
CHECKED_SUFFIXES = (".py", ".md", ".sh", ".toml", ".txt", ".csv", ".tpl")
PROSE_PATH = re.compile(r"(?<![\w./-])(?:\.\.?/)?[\w.-]+/[\w./{},-]*\.\w+")
DOTTED = re.compile(r"(?<![\w./-])slaq(?:\.[A-Za-z_]\w*)+")
API_GROUP = "slaq.dev"  # the CRDs' API group, a domain name, not a module
COMMANDS_GROUP = "slaq.commands"  # the entry-point group of the `slaq` command's subcommands, not a module
DECISIONS = REPO_ROOT / "docs" / "decisions"
RECORD_NAME = re.compile(r"^(\d{4})-[a-z0-9]+(?:-[a-z0-9]+)*\.md$")
SUPERSEDED = re.compile(r"^Status: superseded", re.MULTILINE)
RECORD_SECTIONS = ("Context", "Decision", "Consequences", "Measurement")


def _top_level_entries() -> set[str]:
    return {p.name for p in REPO_ROOT.iterdir() if p.name not in NOT_DOCS and not p.name.startswith(".")}


def _scopes(doc: Path) -> list[Path]:
    if doc.parent == DECISIONS:
        return [REPO_ROOT]  # a decision record may name a file of any component
    if doc.parent == REPO_ROOT / "docs":
        component = REPO_ROOT / doc.stem
        return [doc.parent, component] if doc.stem in COMPONENTS else [REPO_ROOT]
    return [doc.parent]


@functools.cache
def _names_under(folder: Path) -> frozenset[str]:
    return frozenset(p.name for p in folder.rglob("*") if not NOT_DOCS & set(p.relative_to(REPO_ROOT).parts))


def _expand_braces(token: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", token)
    if not match:
        return [token]
    return [expanded for choice in match.group(1).split(",")
            for expanded in _expand_braces(token[:match.start()] + choice + token[match.end():])]


def missing_path(doc: Path, token: str) -> str | None:
    """The reason `token`, as `doc` names it, is not a file or folder of the repository (None: it is, or it is no repository path)."""
    token = re.sub(r"[`'\",;:.)\]]+$", "", re.sub(r"^[`'\"(\[]+", "", token))
    token = re.sub(r":\d+(?:-\d+)?$", "", token)
    if not token or "://" in token or token.startswith(("/", "~", "$", "-")) or any(c in token for c in "<>*=|"):
        return None
    for name in _expand_braces(token):
        path = name.rstrip("/")
        if path.startswith(("./", "../")):
            # beside the doc, or from the repository root, where the docs' commands run
            targets = [(doc.parent / path).resolve(), (REPO_ROOT / path).resolve()]
            if not any(t.is_relative_to(REPO_ROOT) for t in targets):
                return f"{name} is outside the repository"
            if not any(t.is_relative_to(REPO_ROOT) and t.exists() for t in targets):
                return f"{name} does not exist"
        elif "/" in path:
            first = path.split("/", 1)[0]
            if first in _top_level_entries():
                if not (REPO_ROOT / path).exists():
                    return f"{name} does not exist"
            elif (doc.parent / first).exists() and not (doc.parent / path).exists():
                return f"{name} does not exist beside {doc.relative_to(REPO_ROOT)}"
            elif not (doc.parent / first).exists() and first == "slaq":
                return f"{name} does not exist: the code is in the components' folders (core/src/slaq/, engine/src/slaq/, …)"
        elif path.endswith(CHECKED_SUFFIXES) and not any(path in _names_under(scope) for scope in _scopes(doc)):
            where = ", ".join(f"{scope.relative_to(REPO_ROOT)}/" if scope != REPO_ROOT else "the repository" for scope in _scopes(doc))
            return f"{name} is in no folder the doc describes ({where})"
    return None


@functools.cache
def _defined_names(module: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.parse(module.read_text(), str(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return frozenset(names)


def unresolved_module(dotted: str) -> str | None:
    """Why `slaq.x.y` names no package, module or module-level name of the repository (None: it does)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        if (path := module_path(".".join(parts[:cut]))) is not None:
            break
    else:
        return f"{dotted}: no module {'.'.join(parts[:2])}"
    rest = parts[cut:]
    if not rest or rest[0] in _defined_names(path):
        return None
    if path.name == "__init__.py":
        return f"{dotted}: no module {'.'.join(parts[:cut + 1])}"
    return f"{dotted}: {path.relative_to(REPO_ROOT)} defines no {rest[0]}"


def problems(doc: Path) -> list[str]:
    text = doc.read_text()
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        technical = {m.span() for m in TECHNICAL_SESSION.finditer(line)}
        for match in WORK_SESSION.finditer(line):
            if not any(start <= match.start() < end for start, end in technical):
                found.append(f"{number}: says {line[max(0, match.start() - 20):match.end() + 10].strip()!r}")
        for match in DOTTED.finditer(line):
            name = match.group(0)
            if name not in (API_GROUP, COMMANDS_GROUP) and not name.startswith(API_GROUP + ".") and (reason := unresolved_module(name)):
                found.append(f"{number}: {reason}")
    if doc.parent == DECISIONS and SUPERSEDED.search(text):
        return sorted(set(found), key=lambda item: int(item.split(":")[0]))  # the paths of a layout that is gone
    code, prose = split_code(text)
    candidates = [(line.number, token) for line in [*code, *inline_spans(prose)] for token in line.text.split()]
    candidates += [(line.number, m.group(0)) for line in prose for m in PROSE_PATH.finditer(line.text)]
    for number, token in candidates:
        if reason := missing_path(doc, token):
            found.append(f"{number}: {reason}")
    return sorted(set(found), key=lambda item: int(item.split(":")[0]))


@pytest.mark.parametrize("doc", repository_docs(), ids=lambda doc: str(doc.relative_to(REPO_ROOT)))
def test_doc_speaks_of_the_project_as_it_is(doc: Path) -> None:
    assert not problems(doc), f"{doc.relative_to(REPO_ROOT)}:\n" + "\n".join(problems(doc))


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    engine_doc = REPO_ROOT / "engine" / "README.md"
    assert missing_path(engine_doc, "`fairness.py`") == "fairness.py is in no folder the doc describes (engine/)"
    assert missing_path(engine_doc, "planner.py") is None  # engine/src/slaq/engine/kv_security/planner.py
    assert missing_path(REPO_ROOT / "README.md", "engine/src/slaq/engine/fairness.py") == "engine/src/slaq/engine/fairness.py does not exist"
    assert missing_path(REPO_ROOT / "README.md", "engine/blocks.py") == "engine/blocks.py does not exist"
    assert missing_path(REPO_ROOT / "README.md", "slaq/engine/blocks.py") == (
        "slaq/engine/blocks.py does not exist: the code is in the components' folders (core/src/slaq/, engine/src/slaq/, …)")
    assert missing_path(REPO_ROOT / "README.md", "(tools/src/slaq/bench/README.md).") is None
    assert missing_path(REPO_ROOT / "docs" / "DESIGN.md", "../../shared/traces/x.csv") == "../../shared/traces/x.csv is outside the repository"
    assert missing_path(REPO_ROOT / "sidecar" / "README.md", "tests/sidecar/test_{queue,nothing}.py") == "tests/sidecar/test_nothing.py does not exist"
    assert missing_path(REPO_ROOT / "operator" / "README.md", "handlers.py") is None  # operator/src/slaq/operator/handlers.py
    assert missing_path(REPO_ROOT / "README.md", "autoscaling/v2") is None and missing_path(REPO_ROOT / "README.md", "/etc/slaq") is None
    assert unresolved_module("slaq.scoring") == "slaq.scoring: no module slaq.scoring"
    assert unresolved_module("slaq.api.contract.RequestSLA.to_xargs") is None
    assert unresolved_module("slaq.api.contract.NoSuchThing") == "slaq.api.contract.NoSuchThing: core/src/slaq/api/contract.py defines no NoSuchThing"
    assert unresolved_module("slaq.engine.kv_security.seal_cost") is None and unresolved_module("slaq.operator") is None
    said = ["(session 7)", "Until this session the", "in Session 5,"]
    technical = ["an HTTP session", "a TLS session ticket", 'scope="session"', "session affinity", "aiohttp's ClientSession"]
    assert all(WORK_SESSION.search(s) and not TECHNICAL_SESSION.search(s) for s in said)
    assert all(not WORK_SESSION.search(s) or TECHNICAL_SESSION.search(s) for s in technical)


def decision_records() -> list[Path]:
    return sorted(path for path in DECISIONS.glob("*.md") if path.name != "README.md")


def record_problems(record: Path) -> list[str]:
    """What keeps `record` from being a decision record (its name, heading, sections)."""
    name = RECORD_NAME.match(record.name)
    if not name:
        return [f"{record.name}: not named NNNN-title.md (lower case, words joined by -)"]
    lines = record.read_text().splitlines()
    found = []
    if not lines or not lines[0].startswith(f"# {name.group(1)}: "):
        found.append(f"{record.name}: the first line is not '# {name.group(1)}: <the decision>'")
    sections = [line[3:].strip() for line in lines if line.startswith("## ")]
    if sections != list(RECORD_SECTIONS):
        found.append(f"{record.name}: sections {sections}, not {list(RECORD_SECTIONS)}")
    return found


def test_there_are_decision_records() -> None:
    assert len(decision_records()) >= 4, decision_records()


@pytest.mark.parametrize("record", decision_records(), ids=lambda record: record.name)
def test_decision_record_has_its_heading_and_sections(record: Path) -> None:
    assert not record_problems(record), "\n".join(record_problems(record))


def test_decision_records_are_numbered_once_each_and_all_in_the_index() -> None:
    numbers = [record.name[:4] for record in decision_records()]
    assert numbers == [f"{n:04d}" for n in range(1, len(numbers) + 1)], numbers
    index = (DECISIONS / "README.md").read_text()
    linked = set(re.findall(r"\]\(([^)]+\.md)\)", index))
    assert linked == {record.name for record in decision_records()}, linked ^ {record.name for record in decision_records()}


def test_the_record_checks_find_what_they_look_for(tmp_path: Path) -> None:
    assert missing_path(DECISIONS / "0001-x.md", "queue.py") is None  # engine/src/slaq/engine/queue.py, sidecar/src/slaq/sidecar/queue.py
    assert missing_path(DECISIONS / "0001-x.md", "nowhere.py") == "nowhere.py is in no folder the doc describes (the repository)"
    good = tmp_path / "0007-one-rule.md"
    good.write_text("# 0007: One rule\n\n## Context\n\n## Decision\n\n## Consequences\n\n## Measurement\n")
    assert record_problems(good) == []
    bad = tmp_path / "0008-Two_Rules.md"
    bad.write_text("# Two rules\n\n## Context\n\n## Decision\n")
    assert record_problems(bad) == ["0008-Two_Rules.md: not named NNNN-title.md (lower case, words joined by -)"]
    renamed = tmp_path / "0008-two-rules.md"
    renamed.write_text(bad.read_text())
    assert record_problems(renamed) == [
        "0008-two-rules.md: the first line is not '# 0008: <the decision>'",
        "0008-two-rules.md: sections ['Context', 'Decision'], not ['Context', 'Decision', 'Consequences', 'Measurement']",
    ]


FIRST_SCREEN_LINES = 30


def test_the_readme_first_screen_says_what_it_is_how_to_try_install_and_what_it_costs() -> None:
    first_screen = "\n".join((REPO_ROOT / "README.md").read_text().splitlines()[:FIRST_SCREEN_LINES])
    answers = {
        "what it is": "SLA-aware priority scheduling",
        "how to try it": "slaq up --demo",
        "how to install it on a cluster": "helm install slaq ./helm/slaq",
        "what it costs in latency": "**What it costs**",
        "the picture": "](docs/demo-ttft.png)",
    }
    missing = [question for question, text in answers.items() if text not in first_screen]
    assert not missing, f"README.md's first {FIRST_SCREEN_LINES} lines do not say {', '.join(missing)}"
    assert re.search(r"\*\*What it costs\*\*[^\n]*\n?[^\n]*\d+(?:\.\d+)? ms", first_screen), "the cost line gives no figure in ms"
