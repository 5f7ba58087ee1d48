"""`slaq bench live`: the argument parser and handler (the HTTP work is in slaq.bench.live)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Callable


def add_live_parser(commands: argparse._SubParsersAction, workload_arguments: Callable[[argparse.ArgumentParser], None]) -> None:
    live = commands.add_parser("live", help="replay the trace against a running OpenAI-compatible endpoint (sidecar or engine)",
                               description="Send the workload's requests at their arrival times as streaming /v1/completions "
                                           "calls, one API key per tenant, and report TTFT/TPOT/attainment per tier.")
    workload_arguments(live)
    live.set_defaults(requests=100)
    live.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    live.add_argument("--model", required=True, help="model name the endpoint serves")
    live.add_argument("--rate", type=float, required=True, help="mean arrival rate in requests/s (the trace's pattern is kept)")
    live.add_argument("--token-scale", type=float, default=1.0,
                      help="multiply prompt and output lengths by this (e.g. 0.05 for a CPU tiny model)")
    live.add_argument("--max-prompt", type=int, default=None, help="cap prompt tokens")
    live.add_argument("--max-output", type=int, default=None, help="cap output tokens")
    live.add_argument("--key", action="append", default=[], metavar="TIER[/TENANT]=KEY", help="API key for a tier (repeatable)")
    live.add_argument("--tenants", type=Path, nargs="+", default=None, metavar="FILE",
                      help="TenantSLA manifests and the Secrets with their keys (objectives then come from the tenants)")
    live.add_argument("--label", default="live", help="name of this run in the report (e.g. slaq or stock)")
    live.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    live.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    live.set_defaults(handler=_live)


def _live(args: argparse.Namespace) -> int:
    from slaq.bench.errors import BenchError

    try:
        return _run_live(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run_live(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from slaq.bench.cli import workload_from_args
    from slaq.bench.errors import LiveError
    from slaq.bench.live import LiveSettings, bind_tenants, credentials_from_keys, credentials_from_manifests, run_live
    from slaq.bench.metrics import policy_figures
    from slaq.bench.report import SCHEMA, format_table, write_report
    from slaq.bench.workload import scale_to_rate, with_bursts

    if not args.key and not args.tenants:
        raise LiveError("give API keys: --key TIER=KEY for each tier, or --tenants FILE...")
    if not args.token_scale > 0:
        raise LiveError(f"--token-scale must be positive, got {args.token_scale}")
    credentials = credentials_from_keys(args.key) + (credentials_from_manifests(args.tenants) if args.tenants else [])
    workload = workload_from_args(args)
    requests = workload.build()

    def shrink(n: int, cap: int | None) -> int:
        value = max(1, round(n * args.token_scale))
        return min(value, cap) if cap else value

    requests = [replace(r, prompt_tokens=shrink(r.prompt_tokens, args.max_prompt), output_tokens=shrink(r.output_tokens, args.max_output)) for r in requests]
    requests = with_bursts(scale_to_rate(requests, args.rate), workload.bursts)
    bound = bind_tenants(requests, credentials)
    objectives = dict(workload.objectives)
    for credential in credentials:
        if credential.objectives is not None:
            objectives[credential.tier] = credential.objectives
    settings = LiveSettings(url=args.url, model=args.model, timeout_s=args.timeout)
    print(f"sending {len(bound)} requests to {args.url} at {args.rate:g} req/s ...", file=sys.stderr)
    result, outcomes = asyncio.run(run_live(bound, settings, label=args.label))
    figures = policy_figures(result, objectives)
    statuses: dict[str, int] = {}
    for outcome in outcomes:
        key = str(outcome.status) if outcome.status is not None else "no response"
        statuses[key] = statuses.get(key, 0) + 1
    figures["http_status"] = statuses
    errors = [o.error for o in outcomes if o.error]
    figures["errors_sample"] = errors[:5]
    report = {
        "schema": SCHEMA.replace(".sim/", ".live/"),
        "endpoint": {"url": args.url, "model": args.model},
        "workload": {**workload.describe(requests), "rate_rps": args.rate, "token_scale": args.token_scale},
        "objectives": {t.value: {"ttft_s": o.ttft_s, "tpot_s": o.tpot_s} for t, o in objectives.items()},
        "policies": {args.label: figures},
    }
    print(format_table(report["policies"], title=f"live: {args.url} at {args.rate:g} req/s"))
    print(f"HTTP status: {statuses}")
    if args.out:
        write_report(report, args.out)
        print(f"report: {args.out}")
    return 0 if not errors else 1
