"""The `slaq` command.

Each component adds its own subcommands: its pyproject.toml names a `register(subparsers)` function in
the `slaq.commands` entry-point group. A component that is not installed adds none (its capability is
absent, not faked). Heavy imports (vLLM, kopf) happen inside the handlers, so `slaq --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Sequence

COMMANDS_GROUP = "slaq.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slaq", description="SLA-aware priority scheduling for multi-tenant LLM inference.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        entry.load()(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


def passthrough_args(values: Sequence[str]) -> list[str]:
    """An `argparse.REMAINDER` list without the `--` that separates it from slaq's own flags."""
    values = list(values)
    return values[1:] if values and values[0] == "--" else values


def repo_root() -> Path:
    """The source checkout this package runs from (crds/, helm/ live there): core/src/slaq/cli.py is four levels down."""
    return Path(__file__).resolve().parents[3]


if __name__ == "__main__":
    sys.exit(main())
