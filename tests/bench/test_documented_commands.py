"""Every `slaq bench sim` command the docs show runs from a clone as written, on a few requests.

A command is taken from a code block (with its `\\` continuation lines, `#` comments dropped) or
from a backticked span of prose. It runs in-process through the real CLI with `--requests` set
to a few requests; `--capacity-rps` is added where the command has none, since measuring
capacity simulates 2,560 requests whatever `--requests` says (tests/bench/test_cli.py runs it).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from slaq.bench.traces import BUNDLED_TRACES
from slaq.cli import main
from tests.support.docs import REPO_ROOT, Line, inline_spans, repository_docs, split_code

COMMAND = re.compile(r"^(?:python -m )?slaq bench sim(?=\s|$)")
FEW_REQUESTS = "12"


def documented_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line, arguments after `slaq bench sim`) of each command in a Markdown text."""
    code, prose = split_code(text)
    found: list[tuple[int, str]] = []
    pending: list[Line] = []
    for line in code:
        stripped = line.text.strip()
        if pending or COMMAND.match(stripped):
            if pending and line.number != pending[-1].number + 1:
                pending = []
                if not COMMAND.match(stripped):
                    continue
            pending.append(Line(line.number, stripped))
            if not stripped.endswith("\\"):
                found.append((pending[0].number, " ".join(p.text.removesuffix("\\") for p in pending)))
                pending = []
    found += [(span.number, span.text) for span in inline_spans(prose) if COMMAND.match(span.text)]
    commands = []
    for number, command in sorted(found):
        words = shlex.split(command, comments=True)
        commands.append((number, words[words.index("sim") + 1:]))
    return commands


def runnable(arguments: list[str]) -> list[str]:
    """The arguments with a few requests, a pinned capacity where none is given, and no progress bar."""
    arguments = list(arguments)
    if "--requests" in arguments:
        arguments[arguments.index("--requests") + 1] = FEW_REQUESTS
    else:
        arguments += ["--requests", FEW_REQUESTS]
    if "--capacity-rps" not in arguments:
        arguments += ["--capacity-rps", "20"]
    return arguments if "--quiet" in arguments else [*arguments, "--quiet"]


def _all_commands() -> dict[tuple[str, ...], str]:
    """Each distinct documented command, with the first place the docs show it."""
    commands: dict[tuple[str, ...], str] = {}
    for doc in repository_docs():
        for number, arguments in documented_commands(doc.read_text()):
            commands.setdefault(tuple(arguments), f"{doc.relative_to(REPO_ROOT)}:{number}")
    return commands


COMMANDS = _all_commands()


def test_commands_are_found_in_code_blocks_and_prose() -> None:
    text = "\n".join([
        "Run `slaq bench sim --pod",
        "--seed 2` or `slaq bench live --rate 1`:",
        "",
        "```bash",
        "python -m slaq bench sim --requests 1500 \\",
        "    --load 1.5          # and --load 2.0",
        "slaq bench live --url http://x",
        "```",
        "",
        "    slaq bench sim --window 600",
    ])
    assert documented_commands(text) == [(1, ["--pod", "--seed", "2"]), (5, ["--requests", "1500", "--load", "1.5"]),
                                         (10, ["--window", "600"])]
    assert runnable(["--requests", "1500", "--capacity-rps", "19.95"]) == ["--requests", "12", "--capacity-rps", "19.95", "--quiet"]


def test_the_readmes_show_commands() -> None:
    places = {place.split(":")[0] for place in COMMANDS.values()}
    assert {"README.md", "slaq/bench/README.md"} <= places, places


@pytest.mark.timeout(120)
@pytest.mark.parametrize("arguments", list(COMMANDS), ids=list(COMMANDS.values()))
def test_documented_command_runs_from_a_clone(arguments: tuple[str, ...], tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # where `--out report.json` or `--plots plots/` land
    status = main(["bench", "sim", *runnable(list(arguments))])
    out, err = capsys.readouterr()
    assert status == 0, f"{COMMANDS[arguments]}: slaq bench sim {shlex.join(arguments)}\n{err}"
    named = arguments[arguments.index("--trace") + 1] if "--trace" in arguments else "conv"
    source = "synthetic" if "--synthetic" in arguments else str(BUNDLED_TRACES.get(named, named))
    assert f"requests ({source}, arrivals" in out
