"""`slaq operator`: run the kopf operator (in the cluster, or against the current kubeconfig)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slaq.operator.pod import QuotaStoreRef
    from slaq.operator.images import PoolImages


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("operator", help="run the operator that reconciles InferencePools and TenantSLAs")
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "slaq-system"),
                        help="the operator's own namespace, where it keeps the cache-salt key Secret "
                             "(default: $POD_NAMESPACE or slaq-system)")
    parser.add_argument("--observe-interval", type=float, default=15.0, metavar="SECONDS",
                        help="how often each pool's sidecars are asked for usage and quotas re-split (default: 15)")
    parser.add_argument("--attainment-window", type=float, default=600.0, metavar="SECONDS",
                        help="TenantSLA.status.attainment is met/(met+missed) over this many seconds (default: 600)")
    parser.add_argument("--attainment-min-requests", type=int, default=20, metavar="N",
                        help="fewer finished requests with objectives in the window leave AtRisk Unknown (default: 20)")
    parser.add_argument("--key-secret-namespaces", default="", metavar="NS[,NS...]",
                        help="namespaces beside its own where TenantSLAs' API-key Secrets may live (default: none; "
                             "the chart passes rbac.secretNamespaces, where it may read Secrets)")
    parser.add_argument("--open-namespaces", default="", metavar="NS[,NS...]",
                        help="namespaces open to every tenant: their InferencePools receive the tenants that name them (or no "
                             "pools) without listing them in spec.tenants (default: none)")
    parser.add_argument("--monitoring-namespaces", default="monitoring", metavar="NS[,NS...]",
                        help="namespaces admitted to every pool's metrics port by the pool's NetworkPolicy, beside the "
                             "operator's own (default: monitoring; empty: none)")
    parser.add_argument("--no-network-policies", dest="network_policies", action="store_false",
                        help="render no NetworkPolicy for pools (default: one per pool; policies made before stay "
                             "until their pool is deleted)")
    parser.add_argument("--quota-store", default=None, metavar="URL",
                        help="the install's Redis (redis://host:port/db): every pool's sidecars count tenants' whole quotas there "
                             "(default: none: each replica keeps to its share)")
    parser.add_argument("--quota-store-password-secret", default=None, metavar="NAME[:KEY]",
                        help="the Secret (in each pool's namespace) whose KEY (default: password) holds the store's password")
    add_default_image_arguments(parser)
    parser.add_argument("--liveness", default=None, metavar="URL",
                        help="serve kopf's liveness probe here, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.set_defaults(handler=_run)


def add_default_image_arguments(parser: argparse.ArgumentParser) -> None:
    """The images pools run when they name none (images.PoolImages; the chart's pools.images)."""
    for device in ("gpu", "cpu"):
        parser.add_argument(f"--default-{device}-image", default=None, metavar="IMAGE",
                            help=f"the engine image of {device} pools that name no spec.engine.image (engine/Dockerfile, "
                                 f"target {device}); without it such a pool is refused on its status")
    parser.add_argument("--default-sidecar-image", default=None, metavar="IMAGE",
                        help="the sidecar image of pools that name no image at all (sidecar/Dockerfile); "
                             "default: their engine image, which carries the sidecar")


def default_images(args: argparse.Namespace) -> PoolImages:
    from slaq.operator.images import PoolImages

    return PoolImages(gpu=args.default_gpu_image or None, cpu=args.default_cpu_image or None,
                      sidecar=args.default_sidecar_image or None)


def _names(listed: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in listed.split(",") if name.strip())


def _quota_store(url: str | None, secret: str | None) -> QuotaStoreRef | None:
    from urllib.parse import urlsplit

    from slaq.operator.pod import QuotaStoreRef

    if not url:
        if secret:
            raise SystemExit("--quota-store-password-secret needs --quota-store")
        return None
    if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise SystemExit(f"--quota-store {url!r}: the scheme must be redis://, rediss:// or unix://")
    if urlsplit(url).password:
        raise SystemExit("--quota-store: the URL holds a password (it would show in every pod spec); use --quota-store-password-secret")
    if not secret:
        return QuotaStoreRef(url)
    name, _, key = secret.partition(":")
    return QuotaStoreRef(url, password_secret=name, password_key=key or "password")


def _run(args: argparse.Namespace) -> int:
    if args.observe_interval <= 0:
        raise SystemExit("--observe-interval must be > 0 seconds")
    if args.attainment_window <= args.observe_interval:
        raise SystemExit("--attainment-window must be longer than --observe-interval (it needs two readings)")
    if args.attainment_min_requests < 1:
        raise SystemExit("--attainment-min-requests must be >= 1")
    import re

    from slaq.api.common import DNS_LABEL

    for flag in ("key_secret_namespaces", "open_namespaces", "monitoring_namespaces"):
        if bad := [name for name in _names(getattr(args, flag)) if not re.fullmatch(DNS_LABEL, name)]:
            raise SystemExit(f"--{flag.replace('_', '-')}: {', '.join(map(repr, bad))} is not a namespace name (a DNS label)")
    from slaq.operator.client import load_connection
    from slaq.operator.runner import OperatorOptions, main

    options = OperatorOptions(quota_store=_quota_store(args.quota_store, args.quota_store_password_secret), namespace=args.namespace, observe_interval_s=args.observe_interval, liveness_endpoint=args.liveness,
                              attainment_window_s=args.attainment_window, attainment_min_requests=args.attainment_min_requests,
                              key_secret_namespaces=_names(args.key_secret_namespaces), open_namespaces=_names(args.open_namespaces),
                              images=default_images(args),
                              network_policies=args.network_policies, monitoring_namespaces=_names(args.monitoring_namespaces))
    return main(load_connection(), options, verbose=args.verbose)
