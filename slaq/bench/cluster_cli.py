"""`slaq bench cluster`: a pool of simulated pods behind a router, scaled by each signal in turn."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from slaq.bench.cluster_router import ROUTERS
from slaq.bench.cluster_signals import SIGNALS
from slaq.bench.cluster_workloads import WORKLOADS


def _nonnegative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more seconds, got {text!r}")
    return value


def add_cluster_parser(commands: argparse._SubParsersAction) -> None:
    cluster = commands.add_parser(
        "cluster", help="a pool of simulated pods behind a router, autoscaled by the HPA algorithm on each signal",
        description="Simulate a pool (each pod the pod as it ships: the sidecar core in front of slaq's scheduler, or stock "
                    "vLLM pods with --stock) behind a router, scaled by the Kubernetes HPA algorithm on each signal in turn, "
                    "on the same workload; report per-tier attainment, replicas, GPU-hours and scale events.")
    cluster.add_argument("--workload", choices=WORKLOADS, default="wva-ramp", help="named workload (default wva-ramp)")
    cluster.add_argument("--signals", default=",".join(SIGNALS), help=f"comma-separated, from {', '.join(SIGNALS)} (default all)")
    cluster.add_argument("--router", choices=ROUTERS, default="service", help="service (round-robin), least-request, gateway "
                         "(queue + KV from scraped metrics), gateway-risk (and slaq_sla_risk); default service")
    cluster.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    cluster.add_argument("--fail-pod", type=_nonnegative, default=None, metavar="AT_S",
                         help="fail the busiest ready pod at this simulated second (its requests are lost; it is replaced)")
    cluster.add_argument("--seed", type=int, default=1, help="seed of the Poisson arrivals and tier assignment")
    cluster.add_argument("--time-scale", type=float, default=1.0, help="shorten every stage of the ramp (0.1: a tenth; default 1)")
    cluster.add_argument("--min-replicas", type=int, default=1, help="the pool's spec.replicas.min (default 1)")
    cluster.add_argument("--max-replicas", type=int, default=8, help="the pool's spec.replicas.max, also the static size (default 8)")
    cluster.add_argument("--pending", type=_nonnegative, default=None, metavar="SECONDS", help="cold start: seconds Pending (default 30)")
    cluster.add_argument("--loading", type=_nonnegative, default=None, metavar="SECONDS",
                         help="cold start: seconds Running but not Ready while the engine loads (default 120)")
    cluster.add_argument("--stock", action="store_true", help="stock vLLM pods (priority scheduling, no sidecar) instead of slaq pods")
    cluster.add_argument("--profile", default=None, help="pool profile (default: the workload's, h100x2-qwen3-32b)")
    cluster.add_argument("--quiet", action="store_true", help="no progress")
    cluster.set_defaults(handler=_cluster)


def _cluster(args: argparse.Namespace) -> int:
    from slaq.bench.errors import BenchError

    try:
        return run_cluster_command(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run_cluster_command(args: argparse.Namespace) -> int:
    from slaq.bench.cluster_report import format_table, signal_figures
    from slaq.bench.cluster_router import make_router
    from slaq.bench.cluster_signals import bench_pool, make_signal, parse_signals
    from slaq.bench.cluster_sim import DEFAULT_LOADING_S, DEFAULT_PENDING_S, ClusterOptions, ClusterSimulator
    from slaq.bench.cluster_workloads import cluster_workload
    from slaq.bench.errors import WorkloadError
    from slaq.bench.policies import policy
    from slaq.bench.pool_profile import load_profile
    from slaq.bench.progress import ProgressBar

    names = parse_signals(args.signals)
    if not 1 <= args.min_replicas <= args.max_replicas:
        raise WorkloadError(f"--min-replicas {args.min_replicas} and --max-replicas {args.max_replicas}: need 1 <= min <= max")
    workload = cluster_workload(args.workload, seed=args.seed, time_scale=args.time_scale)
    profile = load_profile(args.profile or workload.profile)
    pool = bench_pool(args.max_replicas, min_replicas=args.min_replicas)
    spec = policy("priority" if args.stock else "slaq")
    options = ClusterOptions(
        spec=spec, profile=profile,
        pending_s=DEFAULT_PENDING_S if args.pending is None else args.pending,
        loading_s=DEFAULT_LOADING_S if args.loading is None else args.loading,
        fail_at_s=args.fail_pod,
    )
    print(f"{len(workload.requests)} requests ({workload.name}, seed {args.seed}, time scale {args.time_scale:g}); profile {profile.name}; "
          f"pods {'stock vLLM (priority)' if args.stock else 'slaq (sidecar core + SLAScheduler)'}; router {args.router}; "
          f"cold start {options.pending_s:g} s pending + {options.loading_s:g} s loading; replicas {args.min_replicas}..{args.max_replicas}")
    signals: dict[str, Any] = {}
    for name in names:
        signal = make_signal(name, pool)
        bar = None if args.quiet else ProgressBar(f"{name}")
        started = time.perf_counter()
        result = ClusterSimulator(workload.requests, workload.objectives, signal, make_router(args.router), options,
                                  progress=bar).run()
        wall = time.perf_counter() - started
        figures = signal_figures(result, workload, signal.initial_replicas, wall_s=wall)
        if bar is not None:
            bar.close(f"attainment {100 * figures['attainment']:.1f}%, {figures['replicas']['mean']:.2f} replicas, {wall:.0f} s")
        signals[name] = figures
    print()
    print(format_table(signals))
    for name, figures in signals.items():
        if "failure" in figures:
            f = figures["failure"]
            print(f"{name}: pod {f['pod']} failed at {f['at_s']:g} s, lost {f['lost']} ({f.get('lost_by_tier')}); recovery s {f['recovery_s']}")
    report = {
        "workload": {"name": workload.name, "requests": len(workload.requests), "seed": args.seed, "time_scale": args.time_scale,
                     "stages": [{"start_s": a, "end_s": b, "rate_rps": r} for a, b, r in workload.stages],
                     "objectives": {t.value: {"ttft_s": o.ttft_s, "tpot_s": o.tpot_s} for t, o in workload.objectives.items()}},
        "profile": profile.name,
        "pods": "stock" if args.stock else "slaq",
        "router": args.router,
        "cold_start_s": {"pending": options.pending_s, "loading": options.loading_s},
        "replicas": {"min": args.min_replicas, "max": args.max_replicas},
        "simulated": True,
        "signals": signals,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"\nreport: {args.out}")
    return 0
