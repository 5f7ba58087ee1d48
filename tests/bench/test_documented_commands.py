"""Every `slaq bench sim`, `slaq render` and `slaq validate` command the docs show runs from a
clone as written.

A command is taken from a code block (with its `\\` continuation lines, `#` comments dropped) or
from a backticked span of prose. `slaq bench sim` runs in-process through the real CLI with
`--requests` set to a few requests; `--capacity-rps` is added where the command has none, since
measuring capacity simulates 2,560 requests whatever `--requests` says (tests/bench/test_cli.py
runs it). `slaq render` and `slaq validate` run with the doc's arguments unchanged, in a
subprocess, in a directory that looks like the repository root (its entries linked in) and holds
the files the doc has the reader make first; a shell's `> FILE` writes the output there.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slaq.bench.traces import BUNDLED_TRACES
from slaq.cli import main
from tests.support.docs import REPO_ROOT, Line, inline_spans, repository_docs, split_code

COMMAND = re.compile(r"^(?:python -m )?slaq bench sim(?=\s|$)")
# `slaq render` or `slaq validate` with arguments; a bare `slaq render` in prose names the command.
CLI_COMMAND = re.compile(r"^(?:python -m )?slaq(?=\s+(?:render|validate)\s+\S)")
FEW_REQUESTS = "12"


def documented_commands(text: str, command: re.Pattern[str] = COMMAND) -> list[tuple[int, list[str]]]:
    """(line, arguments after what `command` matches) of each command in a Markdown text."""
    code, prose = split_code(text)
    found: list[tuple[int, str]] = []
    pending: list[Line] = []
    for line in code:
        stripped = line.text.strip()
        if pending or command.match(stripped):
            if pending and line.number != pending[-1].number + 1:
                pending = []
                if not command.match(stripped):
                    continue
            pending.append(Line(line.number, stripped))
            if not stripped.endswith("\\"):
                found.append((pending[0].number, " ".join(p.text.removesuffix("\\") for p in pending)))
                pending = []
    found += [(span.number, span.text) for span in inline_spans(prose) if command.match(span.text)]
    commands = []
    for number, line_text in sorted(found):
        words = shlex.split(line_text, comments=True)
        commands.append((number, words[len(command.match(line_text).group(0).split()):]))
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


def _all_commands(command: re.Pattern[str] = COMMAND) -> dict[tuple[str, ...], str]:
    """Each distinct documented command, with the first place the docs show it."""
    commands: dict[tuple[str, ...], str] = {}
    for doc in repository_docs():
        for number, arguments in documented_commands(doc.read_text(), command):
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
    assert {"README.md", "tools/src/slaq/bench/README.md"} <= places, places


@pytest.mark.timeout(120)
@pytest.mark.parametrize("arguments", list(COMMANDS), ids=list(COMMANDS.values()))
def test_documented_command_runs_from_a_clone(arguments: tuple[str, ...], tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # where `--out report.json` or `--plots plots/` land
    status = main(["bench", "sim", *runnable(list(arguments))])
    out, err = capsys.readouterr()
    assert status == 0, f"{COMMANDS[arguments]}: slaq bench sim {shlex.join(arguments)}\n{err}"
    named = arguments[arguments.index("--trace") + 1] if "--trace" in arguments else "conv"
    if "--workload" in arguments:  # a synthetic workload of our own: named, with its prompt lengths
        assert f"requests (workload {arguments[arguments.index('--workload') + 1]}, prompts mean " in out
        return
    source = "synthetic" if "--synthetic" in arguments else str(BUNDLED_TRACES.get(named, named))
    assert f"requests ({source}, arrivals" in out


# -- slaq render, slaq validate ----------------------------------------------------------------
CLI_COMMANDS = _all_commands(CLI_COMMAND)
# Files a doc has the reader make before its command. operator/README.md takes `salt.key` from the
# cluster (`kubectl get secret ... slaq-cache-salt-key ... | base64 -d > salt.key`): raw bytes,
# at least 16; any 32 stand in for the cluster's here.
READER_FILES = {"salt.key": bytes(range(32))}
# Documented command lines that are not run, each with why (a test checks each is still documented).
NOT_RUN = {
    ("render", "...", "|", "kubectl", "apply", "--dry-run=server", "-f", "-"):
        "operator/README.md: `...` stands for the arguments shown above it, and kubectl's server-side dry run needs a cluster",
}


def a_clone_root(where: Path) -> Path:
    """`where` made to look like the repository root (each top-level entry linked in), so a doc's
    relative paths resolve there and what the reader writes (a key, a redirected output) stays there."""
    for entry in REPO_ROOT.iterdir():
        if entry.name != ".git":
            (where / entry.name).symlink_to(entry)
    return where


def run_cli(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`slaq ARGUMENTS` run in a subprocess in `cwd`; a trailing shell `> FILE` also writes what it
    printed to FILE in `cwd`, as the shell would."""
    redirect = None
    if ">" in arguments:
        at = arguments.index(">")
        arguments, (redirect,) = arguments[:at], arguments[at + 1:]
    result = subprocess.run([sys.executable, "-m", "slaq", *arguments], cwd=cwd, capture_output=True, text=True, timeout=60)
    if redirect is not None:
        (cwd / redirect).write_text(result.stdout)
    return result


def test_render_and_validate_commands_are_found_with_their_arguments() -> None:
    text = "\n".join([
        "## `slaq render`: review it",
        "",
        "Run `slaq validate",
        "crds/examples/` first.",
        "",
        "```bash",
        "python -m slaq render pool.yaml \\",
        "    --tenants crds/examples/ > out.yaml   # the stream",
        "slaq crds",
        "```",
    ])
    assert documented_commands(text, CLI_COMMAND) == [(3, ["validate", "crds/examples/"]),
                                                      (7, ["render", "pool.yaml", "--tenants", "crds/examples/", ">", "out.yaml"])]


def test_the_docs_show_render_and_validate_commands() -> None:
    places = {place.split(":")[0] for place in CLI_COMMANDS.values()}
    assert {"README.md", "operator/README.md"} <= places, places
    assert {arguments[0] for arguments in CLI_COMMANDS} == {"render", "validate"}
    assert set(NOT_RUN) <= set(CLI_COMMANDS), "a command NOT_RUN names is no longer in the docs"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("arguments", list(CLI_COMMANDS), ids=list(CLI_COMMANDS.values()))
def test_documented_render_or_validate_command_runs_from_a_clone(arguments: tuple[str, ...], tmp_path: Path) -> None:
    if arguments in NOT_RUN:
        pytest.skip(NOT_RUN[arguments])
    assert "|" not in arguments, f"{CLI_COMMANDS[arguments]}: a pipe cannot run here; list the line in NOT_RUN with why"
    root = a_clone_root(tmp_path)
    for name in READER_FILES.keys() & set(arguments):
        (root / name).write_bytes(READER_FILES[name])
    result = run_cli(list(arguments), root)
    assert result.returncode == 0, f"{CLI_COMMANDS[arguments]}: slaq {shlex.join(arguments)}\n{result.stderr}"
    assert result.stdout.strip(), f"{CLI_COMMANDS[arguments]}: slaq {shlex.join(arguments)} printed nothing"
    if "--salt-key-file" in arguments:
        assert "random key" not in result.stderr  # the reader's key file was read


def test_a_broken_render_or_validate_command_fails_the_run(tmp_path: Path) -> None:
    root = a_clone_root(tmp_path)
    assert run_cli(["validate", "crds/examples/"], root).returncode == 0
    broken = [["render", "crds/examples/no-such-pool.yaml", "--tenants", "crds/examples/"],
              ["validate", "crds/examples/", "--no-such-flag"],
              # the doc's salt.key line, without the key file the reader makes first
              ["render", "crds/examples/pool-cpu.yaml", "--tenants", "crds/examples/", "--salt-key-file", "salt.key"]]
    assert [run_cli(arguments, root).returncode for arguments in broken] == [1, 2, 1]
    redirected = run_cli(["render", "crds/examples/pool-cpu.yaml", "--tenants", "crds/examples/", "--default-cpu-image", "r/e:cpu",
                          ">", "tiny-cpu.yaml"], root)
    assert redirected.returncode == 0 and "kind: Deployment" in (root / "tiny-cpu.yaml").read_text()
    assert not (REPO_ROOT / "tiny-cpu.yaml").exists()
