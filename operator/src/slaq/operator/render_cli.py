"""`slaq render`: print the objects the operator would apply for a pool, as `helm template` does."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from slaq.operator.cli import add_default_image_arguments, default_images

MIN_SALT_KEY_BYTES = 16  # what the operator requires of its cache-salt key Secret


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "render", help="print the objects the operator would apply for InferencePools (YAML), for review",
        description="Print, as one YAML stream, the tenant-table Secret, Service, PodDisruptionBudget, Deployment and "
                    "HorizontalPodAutoscaler the operator would apply for each InferencePool in POOL, from the "
                    "TenantSLAs and key Secrets in --tenants. The tenant table is printed for review: key Secret "
                    "names and fingerprints of key hashes and cache salts, never keys, key hashes, their key or salts.")
    parser.add_argument("pools", nargs="+", type=Path, metavar="POOL", help="InferencePool manifest files or directories")
    parser.add_argument("--tenants", action="append", type=Path, required=True, metavar="PATH",
                        help="files or directories with the TenantSLAs and their key Secrets (repeatable); "
                             "InferencePools found there share tenants' quotas with the rendered pools")
    parser.add_argument("--salt-key-file", type=Path, default=None, metavar="FILE",
                        help="the operator's cache-salt key (raw bytes, e.g. `kubectl get secret -n slaq-system "
                             "slaq-cache-salt-key -o jsonpath='{.data.key}' | base64 -d`); without it the salts come "
                             "from a random key, so their fingerprints and the table revision differ from the cluster's and "
                             "between runs; the output never holds the key or anything derived from it but fingerprints")
    parser.add_argument("--allow-missing-keys", action="store_true",
                        help="render a tenant whose key Secret is not in the files without key hashes (a warning "
                             "names it) instead of failing")
    add_default_image_arguments(parser)  # as the operator is started with them (the chart's pools.images)
    parser.add_argument("--namespace", "-n", default="default",
                        help="namespace of pools whose manifest names none (default: default)")
    parser.set_defaults(handler=_render)


def read_salt_key(path: Path | None) -> tuple[bytes, bool]:
    """(key, given): the key from the file, or a random one when no file is given."""
    if path is None:
        return os.urandom(32), False
    from slaq.manifests import ManifestError

    try:
        key = path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"--salt-key-file {path}: {exc.strerror or exc}") from exc
    if len(key) < MIN_SALT_KEY_BYTES:
        raise ManifestError(f"--salt-key-file {path}: holds {len(key)} bytes; the operator's key is at least "
                            f"{MIN_SALT_KEY_BYTES} raw bytes (decode the Secret's data.key from base64)")
    return key, True


REVIEW_NOTE = ("slaq render: the tenant table for review (stringData.review.yaml): key Secret names and fingerprints "
               "stand for the key hashes, their key and the cache salts, which only the operator writes, in the cluster")


def render_yaml(objects: list[dict[str, Any]], secret_notes: Sequence[str] = ()) -> str:
    """A YAML stream, one document per object; `secret_notes` become comments above each Secret."""
    import yaml

    class Dumper(yaml.SafeDumper):
        """Multi-line strings (the table's review) as literal blocks, so a diff shows the changed lines."""

    Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
        "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))
    comment = "".join(f"# {note}\n" for note in secret_notes)
    return "".join(f"---\n{comment if obj.get('kind') == 'Secret' else ''}"
                   f"{yaml.dump(obj, Dumper=Dumper, sort_keys=False, default_flow_style=False)}" for obj in objects)


def _render(args: argparse.Namespace) -> int:
    from slaq.manifests import ManifestError, read_manifest_set
    from slaq.operator.offline import for_review, render_from_manifests, with_namespace

    try:
        salt_key, given = read_salt_key(args.salt_key_file)
        pools = [with_namespace(p, args.namespace) for p in read_manifest_set(args.pools).pools]
        if not pools:
            raise ManifestError(f"no InferencePool documents in {', '.join(map(str, args.pools))}")
        found = read_manifest_set(args.tenants)
        if not found.tenants:
            raise ManifestError(f"no TenantSLA documents in {', '.join(map(str, args.tenants))}")
        found = replace(found, pools=[with_namespace(p, args.namespace) for p in found.pools])
        rendering = for_review(render_from_manifests(pools, found, salt_key, allow_missing_keys=args.allow_missing_keys,
                                                     where=", ".join(map(str, args.tenants)), images=default_images(args)), found)
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    notes = [REVIEW_NOTE]
    if not given:
        note = ("cache salts come from a random key (no --salt-key-file): their fingerprints and the key fingerprints "
                "differ from the cluster's and between runs")
        rendering.warnings.append(note)
        notes.append(f"slaq render: {note}")
    for warning in rendering.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write(render_yaml(rendering.objects, notes))
    return 0
