"""`slaq crds` and `slaq validate`: the API's own subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    crds = subparsers.add_parser("crds", help="write the CRDs generated from the API models")
    crds.add_argument("--out", type=Path, default=None, help="directory to write into (default: crds/ of the checkout)")
    crds.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files differ from a fresh generation")
    crds.set_defaults(handler=_crds)

    validate = subparsers.add_parser("validate", help="validate manifests against the API models")
    validate.add_argument("files", nargs="+", type=Path, help="YAML files or directories")
    validate.set_defaults(handler=_validate)


def _crds(args: argparse.Namespace) -> int:
    from slaq.api.crdgen import render_crd_files
    from slaq.cli import repo_root

    out = args.out or repo_root() / "crds"
    stale = []
    for name, text in render_crd_files().items():
        target = out / name
        if args.check:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(str(target))
            continue
        out.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")
    for path in stale:
        print(f"stale: {path} (run `slaq crds`)", file=sys.stderr)
    return 1 if stale else 0


def _validate(args: argparse.Namespace) -> int:
    from slaq.manifests import validate_paths

    missing = [str(p) for p in args.files if not p.exists()]
    if missing:
        print(f"no such file: {', '.join(missing)}", file=sys.stderr)
        return 1
    try:
        count, errors = validate_paths(args.files)
    except Exception as exc:  # YAML syntax errors and unreadable files
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for error in errors:
        print(error, file=sys.stderr)
    print(f"{count} document(s) checked, {len(errors)} error(s)")
    return 1 if errors else 0
