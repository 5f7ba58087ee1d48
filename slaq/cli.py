"""The `slaq` command.

Each capability registers its own subcommands: a module listed in SUBCOMMAND_MODULES exposes
`register(subparsers)`. A listed module that is not part of this build is left out of the
command (its capability is absent, not faked). Heavy imports (vLLM, kopf) happen inside the
handlers, so `slaq --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Sequence

SUBCOMMAND_MODULES = (
    "slaq.cli_api",  # crds, validate
    "slaq.engine.cli",  # engine
    "slaq.sidecar.cli",  # sidecar
    "slaq.operator.cli",  # operator
    "slaq.operator.render_cli",  # render
    "slaq.bench.cli",  # bench
    "slaq.local",  # up
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slaq", description="SLA-aware priority scheduling for multi-tenant LLM inference.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


def passthrough_args(values: Sequence[str]) -> list[str]:
    """An `argparse.REMAINDER` list without the `--` that separates it from slaq's own flags."""
    values = list(values)
    return values[1:] if values and values[0] == "--" else values


def repo_root() -> Path:
    """The source checkout this package runs from (crds/, helm/ live there)."""
    return Path(__file__).resolve().parent.parent


if __name__ == "__main__":
    sys.exit(main())
