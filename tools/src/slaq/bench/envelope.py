"""The envelope a benchmark writes around its JSON report: how, when and from which commit it ran.

    {"command": "slaq bench sim --pod --requests 1500 ...", "date": "2026-12-04T17:40:12Z",
     "commit": "263a624…" | null, "dirty": true | false | null, "load_average": 1.7 | null, "cpus": 2}

`command` is the command line as it was run (what a reader types to reproduce the figure),
`date` the UTC time the run started, `commit` the checkout's `git rev-parse HEAD` (null outside a
git checkout), `dirty` whether tracked files differed from that commit, and `load_average` the
machine's one-minute load average as the run started and `cpus` its CPU count (wall-clock figures
depend on both). docs/results.md is
rendered from reports that carry one (`slaq.bench.results`).
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

ENVELOPE_KEY = "run"
REPO_ROOT = Path(__file__).resolve().parents[4]


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command line as typed: `slaq ...` for the CLI, `python <path from the repository root> ...` for a script."""
    argv = list(sys.argv if argv is None else argv)
    program, rest = Path(argv[0]), argv[1:]
    if program.name == "__main__.py" and program.parent.name == "slaq":
        head = ["slaq"]
    elif program.suffix == ".py":
        try:
            head = ["python", program.resolve().relative_to(REPO_ROOT).as_posix()]
        except ValueError:
            head = ["python", program.name]
    else:
        head = [program.name]
    return shlex.join(head + rest)


def git_commit(cwd: Path = REPO_ROOT) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it), or (None, None) outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None, None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head.stdout.strip(), (bool(status.stdout.strip()) if status.returncode == 0 else None)


def envelope(argv: Sequence[str] | None = None, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """The envelope for a run started now (or at `now`) with `argv` (default: this process's)."""
    started = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    commit, dirty = git_commit()
    try:
        load_average: float | None = round(os.getloadavg()[0], 2)
    except OSError:  # not available on this platform
        load_average = None
    return {"command": command_line(argv), "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit, "dirty": dirty,
            "load_average": load_average, "cpus": os.cpu_count()}


def with_envelope(report: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The report with the envelope first, under "run"."""
    return {ENVELOPE_KEY: run, **{k: v for k, v in report.items() if k != ENVELOPE_KEY}}
