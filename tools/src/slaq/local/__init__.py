"""`slaq up`: the whole system on one machine (engine + sidecar + tenants), and `slaq up --demo`.

Modules: `tenants` (manifests → tenant table, via the operator's plan_tables), `processes`
(child processes stopped by pid), `stack` (engine + sidecar lifecycle), `up` (serve until
interrupted), `demo` (the report's A/B/C scenario, stock vLLM vs slaq: `scenario45` the report's
three requests, `loadgen` the client in its own process, `demo_report` the table, JSON and PNG).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "up",
        help="run the engine and the sidecar on this machine (no cluster, no GPU needed)",
        description="Start `slaq engine` (the tiny built-in model on CPU unless --model) and `slaq sidecar` in front of it, "
        "serving the tenants of TenantSLA manifests and their key Secrets, until Ctrl-C. "
        "--demo instead runs the design report's A/B/C scenario once with stock vLLM and once with slaq and prints both.",
    )
    parser.add_argument("--tenants", type=Path, action="append", default=None, metavar="PATH",
                        help="TenantSLA manifests and their key Secrets, a file or a directory; repeatable (default: crds/examples/)")
    parser.add_argument("--port", type=_port, default=8000, help="the sidecar's port (default 8000; 0 picks a free one)")
    parser.add_argument("--metrics-port", type=_port, default=0,
                        help="the sidecar's metrics port: /metrics (sidecar and engine series) and /slaq/usage (default 0: a free one, printed at start)")
    parser.add_argument("--host", default="127.0.0.1", help="address the sidecar listens on (default 127.0.0.1)")
    parser.add_argument("--model", default=None, help="a real vLLM model (on GPU); default: the tiny built-in model on CPU")
    parser.add_argument("--scheduler-config", default=None, metavar="JSON|FILE",
                        help="the pool's spec.scheduler (wire JSON, or a file holding it), handed to the engine and the sidecar alike")
    parser.add_argument("--demo", action="store_true", help="run the A/B/C scenario, stock vLLM vs slaq, print the table, exit")
    parser.add_argument("--quick", action="store_true",
                        help="with --demo: fewer samples (48 VIP requests in the loaded run instead of 100), for CI")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", dest="json_path",
                        help="with --demo: also write every figure of the demo to FILE as JSON")
    parser.add_argument("engine_args", nargs=argparse.REMAINDER, help="-- then further `slaq engine` flags")
    parser.set_defaults(handler=_up)


def _up(args: argparse.Namespace) -> int:
    from slaq.cli import passthrough_args
    from slaq.local.up import UpOptions, default_tenants, main

    extra = passthrough_args(args.engine_args)
    tenants = tuple(args.tenants or [default_tenants()])
    scheduler_config = None
    if args.scheduler_config is not None:
        import sys

        from slaq.engine.config import SchedulerConfigError, read_scheduler_config_argument

        try:
            scheduler_config = read_scheduler_config_argument(args.scheduler_config)
        except SchedulerConfigError as exc:
            print(f"slaq up: {exc}", file=sys.stderr)
            return 2
    if args.demo and scheduler_config is not None:
        import sys

        print("slaq up: --scheduler-config is for serving; the demo compares stock vLLM with slaq's defaults", file=sys.stderr)
        return 2
    if args.demo:
        from slaq.local.demo import DemoOptions, run_demo_main

        make = DemoOptions.quick if args.quick else DemoOptions
        return run_demo_main(make(tenants=tenants, model=args.model, engine_args=tuple(extra), json_path=args.json_path))
    if args.quick or args.json_path:
        import sys

        print("slaq up: --quick and --json go with --demo", file=sys.stderr)
        return 2
    return main(UpOptions(tenants=tenants, host=args.host, port=args.port, metrics_port=args.metrics_port,
                          model=args.model, engine_args=tuple(extra), scheduler_config=scheduler_config))
