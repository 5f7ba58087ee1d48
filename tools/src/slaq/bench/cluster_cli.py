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
    cluster.add_argument("--signals", default=",".join(SIGNALS), help=f"comma-separated, from {', '.join(SIGNALS)} (default all), "
                         "and the bound clairvoyant (named only: it knows the ramp; cluster_signals.py)")
    cluster.add_argument("--router", choices=ROUTERS, default="service", help="service (round-robin), least-request, gateway "
                         "(queue + KV from scraped metrics), gateway-risk (and slaq_sla_risk), gateway-slaq (queue on "
                         "slaq_protected_prompts_pending, no KV scorer: docs/gateway.md); default service")
    cluster.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    cluster.add_argument("--fail-pod", type=_nonnegative, default=None, metavar="AT_S",
                         help="fail the busiest ready pod at this simulated second (its requests are lost; it is replaced)")
    cluster.add_argument("--seed", type=int, default=1, help="seed of the Poisson arrivals and tier assignment")
    cluster.add_argument("--time-scale", type=float, default=1.0, help="shorten every stage of the ramp (0.1: a tenth; default 1)")
    cluster.add_argument("--min-replicas", type=int, default=1, help="the pool's spec.replicas.min (default 1)")
    cluster.add_argument("--max-replicas", type=int, default=8, help="the pool's spec.replicas.max, also the static size (default 8)")
    cluster.add_argument("--target-protected-load", type=float, default=None, metavar="X",
                         help="the pool's spec.autoscaling.targetProtectedLoad, the slaq signal's target (default: the CRD's, 0.5)")
    cluster.add_argument("--scale-down-window", type=int, default=None, metavar="SECONDS",
                         help="the pool's spec.autoscaling.scaleDownStabilizationSeconds, for every HPA signal "
                              "(default: the CRD's, 300)")
    cluster.add_argument("--clairvoyant-pod-rps", type=float, default=None, metavar="RPS",
                         help="the clairvoyant bound's requests/s per pod (default 1.25: the static pool's load per pod at the peak)")
    cluster.add_argument("--clairvoyant-lead", type=_nonnegative, default=None, metavar="SECONDS",
                         help="how far ahead of a stage the clairvoyant bound orders its pods (default: the cold start and a sync period)")
    cluster.add_argument("--pending", type=_nonnegative, default=None, metavar="SECONDS", help="cold start: seconds Pending (default 30)")
    cluster.add_argument("--loading", type=_nonnegative, default=None, metavar="SECONDS",
                         help="cold start: seconds Running but not Ready while the engine loads (default 120)")
    cluster.add_argument("--stock", action="store_true", help="stock vLLM pods (priority scheduling, no sidecar) instead of slaq pods")
    cluster.add_argument("--profile", default=None, help="pool profile (default: the workload's, h100x2-qwen3-32b)")
    cluster.add_argument("--jobs", type=int, default=1, help="simulate this many signals at once, one process each (default 1)")
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
    from slaq.bench.cluster_report import format_table
    from slaq.bench.cluster_hpa import SYNC_PERIOD_S
    from slaq.bench.cluster_signals import (DEFAULT_CLAIRVOYANT_POD_RPS, DEFAULT_SCALE_DOWN_WINDOW_S, DEFAULT_TARGET_PROTECTED_LOAD,
                                            ClairvoyantSignal, parse_signals)
    from slaq.bench.cluster_sim import DEFAULT_LOADING_S, DEFAULT_PENDING_S
    from slaq.bench.cluster_workloads import cluster_workload
    from slaq.bench.envelope import envelope, with_envelope
    from slaq.bench.errors import WorkloadError
    from slaq.bench.pool_profile import load_profile

    run = envelope()  # the command line, the start time and the commit, for the report
    names = parse_signals(args.signals)
    if not 1 <= args.min_replicas <= args.max_replicas:
        raise WorkloadError(f"--min-replicas {args.min_replicas} and --max-replicas {args.max_replicas}: need 1 <= min <= max")
    target = DEFAULT_TARGET_PROTECTED_LOAD if args.target_protected_load is None else args.target_protected_load
    if not 0 < target <= 2:  # the CRD's bounds
        raise WorkloadError(f"--target-protected-load must be in (0, 2] (spec.autoscaling.targetProtectedLoad), got {target:g}")
    window = DEFAULT_SCALE_DOWN_WINDOW_S if args.scale_down_window is None else args.scale_down_window
    if not 0 <= window <= 3600:  # the CRD's bounds
        raise WorkloadError(f"--scale-down-window must be in [0, 3600] (spec.autoscaling.scaleDownStabilizationSeconds), got {window}")
    if args.stock and args.router == "gateway-slaq":
        raise WorkloadError("--router gateway-slaq reads slaq_protected_prompts_pending, which stock vLLM pods do not export")
    workload = cluster_workload(args.workload, seed=args.seed, time_scale=args.time_scale)
    profile = load_profile(args.profile or workload.profile)
    pending_s = DEFAULT_PENDING_S if args.pending is None else args.pending
    loading_s = DEFAULT_LOADING_S if args.loading is None else args.loading
    print(f"{len(workload.requests)} requests ({workload.name}, seed {args.seed}, time scale {args.time_scale:g}); profile {profile.name}; "
          f"pods {'stock vLLM (priority)' if args.stock else 'slaq (sidecar core + SLAScheduler)'}; router {args.router}; "
          f"cold start {pending_s:g} s pending + {loading_s:g} s loading; replicas {args.min_replicas}..{args.max_replicas}")
    if args.jobs < 1:
        raise WorkloadError(f"--jobs must be 1 or more, got {args.jobs}")
    pod_rps = DEFAULT_CLAIRVOYANT_POD_RPS if args.clairvoyant_pod_rps is None else args.clairvoyant_pod_rps
    lead_s = pending_s + loading_s + SYNC_PERIOD_S if args.clairvoyant_lead is None else args.clairvoyant_lead
    ClairvoyantSignal.check(pod_rps, lead_s)
    jobs = [(name, args.workload, args.seed, args.time_scale, args.max_replicas, args.min_replicas, profile.name if args.profile is None else args.profile,
             args.stock, pending_s, loading_s, args.fail_pod, args.router, not args.quiet and args.jobs == 1, target, pod_rps, lead_s, window)
            for name in names]
    if args.jobs == 1:
        results = [simulate_signal(*job) for job in jobs]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(args.jobs, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool_:
            results = list(pool_.map(simulate_signal, *zip(*jobs)))
    signals: dict[str, Any] = dict(zip(names, results))
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
        "cold_start_s": {"pending": pending_s, "loading": loading_s},
        "replicas": {"min": args.min_replicas, "max": args.max_replicas},
        "target_protected_load": target,
        "scale_down_window_s": window,
        **({"clairvoyant": {"pod_rps": pod_rps, "lead_s": lead_s}} if "clairvoyant" in names else {}),
        "simulated": True,
        "signals": signals,
    }
    report = with_envelope({"schema": "slaq.bench.cluster/v1", **report}, run)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"\nreport: {args.out}")
    return 0


def simulate_signal(name: str, workload_name: str, seed: int, time_scale: float, max_replicas: int, min_replicas: int, profile_name: str,
                    stock: bool, pending_s: float, loading_s: float, fail_at_s: float | None, router: str, show_progress: bool,
                    target_protected_load: float, pod_rps: float, lead_s: float,
                    scale_down_window_s: int) -> dict[str, Any]:
    """One signal's run and figures (a top-level function of plain arguments, so a worker process can run it)."""
    from slaq.bench.cluster_report import signal_figures
    from slaq.bench.cluster_router import make_router
    from slaq.bench.cluster_signals import bench_pool, make_signal
    from slaq.bench.cluster_sim import ClusterOptions, ClusterSimulator
    from slaq.bench.cluster_workloads import cluster_workload
    from slaq.bench.policies import policy
    from slaq.bench.pool_profile import load_profile
    from slaq.bench.progress import ProgressBar

    workload = cluster_workload(workload_name, seed=seed, time_scale=time_scale)
    options = ClusterOptions(spec=policy("priority" if stock else "slaq"), profile=load_profile(profile_name),
                             pending_s=pending_s, loading_s=loading_s, fail_at_s=fail_at_s)
    signal = make_signal(name, bench_pool(max_replicas, min_replicas=min_replicas, target_protected_load=target_protected_load,
                                               scale_down_stabilization_s=scale_down_window_s),
                         stages=workload.stages, lead_s=lead_s, pod_rps=pod_rps)
    bar = ProgressBar(name) if show_progress else None
    started = time.perf_counter()
    result = ClusterSimulator(workload.requests, workload.objectives, signal, make_router(router), options, progress=bar).run()
    wall = time.perf_counter() - started
    figures = signal_figures(result, workload, signal.initial_replicas, wall_s=wall)
    if bar is not None:
        bar.close(f"attainment {100 * figures['attainment']:.1f}%, {figures['replicas']['mean']:.2f} replicas, {wall:.0f} s")
    return figures
