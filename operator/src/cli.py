"""`slaq operator`: run the kopf operator (in the cluster, or against the current kubeconfig)."""

from __future__ import annotations

import argparse
import os


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("operator", help="run the operator that reconciles InferencePools and TenantSLAs")
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "slaq-system"),
                        help="the operator's own namespace, where it keeps the cache-salt key Secret "
                             "(default: $POD_NAMESPACE or slaq-system)")
    parser.add_argument("--observe-interval", type=float, default=15.0, metavar="SECONDS",
                        help="how often each pool's sidecars are asked for usage and quotas re-split (default: 15)")
    parser.add_argument("--liveness", default=None, metavar="URL",
                        help="serve kopf's liveness probe here, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if args.observe_interval <= 0:
        raise SystemExit("--observe-interval must be > 0 seconds")
    from slaq.operator.client import load_connection
    from slaq.operator.runner import OperatorOptions, main

    options = OperatorOptions(namespace=args.namespace, observe_interval_s=args.observe_interval, liveness_endpoint=args.liveness)
    return main(load_connection(), options, verbose=args.verbose)
