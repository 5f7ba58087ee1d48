"""`slaq bench sim` (trace-driven simulator over real vLLM schedulers) and `slaq bench live` (HTTP)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slaq.arguments import positive_number, positive_numbers
from slaq.bench.traces import BUNDLED_TRACE, trace_path

DEFAULT_POLICIES = "fcfs,priority,slaq,oracle"


def _workload_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trace", type=trace_path, default=BUNDLED_TRACE, metavar="conv|code|PATH",
                        help="a bundled Azure LLM inference trace 2023 (tools/src/slaq/bench/traces/, CC-BY 4.0): conv (the conversation "
                             "service, the default) or code (code completion: long prompts, short outputs); or the path of "
                             "an Azure-format CSV (TIMESTAMP,ContextTokens,GeneratedTokens)")
    source.add_argument("--synthetic", action="store_true",
                        help="no trace: log-normal lengths with the conversation trace's means, Poisson arrivals")
    source.add_argument("--workload", choices=("long-context", "prefill-heavy"), default=None,
                        help="a synthetic workload of our own instead of a trace, Poisson arrivals: long-context (heavy-tailed "
                             "prompts up to the profile's max_model_len, outputs of a few hundred; slaq.bench.workload.LongContextShape; "
                             "use it with a long-context profile such as h200-llama3-8b-128k); prefill-heavy (every request 4,000 "
                             "prompt tokens and 1,000 output tokens: the requests of `slaq bench cluster`'s ramps, on one pod; use it "
                             "with h100x2-qwen3-32b)")
    parser.add_argument("--requests", type=int, default=1500, help="first N requests of the trace (default 1500)")
    parser.add_argument("--window", type=float, default=None, metavar="SECONDS",
                        help="take the trace's densest window of this many seconds (its bursts) instead of its start; "
                             "--load then scales the whole trace, so the window keeps its extra density")
    parser.add_argument("--arrivals", choices=("trace", "poisson"), default=None,
                        help="keep the trace's arrival pattern (default), or a Poisson process with the trace's lengths "
                             "(always with --synthetic)")
    parser.add_argument("--bursts", default=None, metavar="FACTOR:PERIOD_S[:DURATION_S]",
                        help="modulate arrivals: every PERIOD_S seconds a burst at FACTOR x the mean rate "
                             "(default duration PERIOD_S / (2 FACTOR)), quieter in between, same mean rate; deterministic")
    parser.add_argument("--seed", type=int, default=1, help="seed for tenant/tier assignment and Poisson arrivals")
    parser.add_argument("--mix", default="10,30,60", help="tier shares critical,standard,batch (default 10,30,60)")
    parser.add_argument("--tenants-per-tier", type=int, default=3, help="tenants per tier (for fairness figures)")
    parser.add_argument("--objective", action="append", default=[], metavar="TIER=TTFT_S[:TPOT_S]",
                        help="override a tier's objectives, e.g. critical=0.5:0.05 or batch=60")


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmark schedulers: simulated GPU (sim) or a live endpoint (live)")
    commands = bench.add_subparsers(dest="bench_command", metavar="MODE", required=True)

    sim = commands.add_parser("sim", help="trace-driven simulation of real vLLM schedulers on a GPU step-time model",
                              description="Drive stock vLLM (fcfs, priority), slaq's SLAScheduler and an oracle through "
                                          "schedule()/update_from_output() in simulated time and compare SLO attainment.")
    _workload_arguments(sim)
    loads = sim.add_mutually_exclusive_group()
    loads.add_argument("--load", type=positive_number, default=None, help="arrival rate as a multiple of the pool's measured capacity (default 1.0)")
    loads.add_argument("--load-sweep", type=positive_numbers, default=None, metavar="X,Y,...", help="several loads, e.g. 0.5,1.0,1.5,2.0")
    loads.add_argument("--slo-capacity", action="store_true",
                       help="search each policy's SLO capacity: the highest load with critical >= 0.99 and standard >= 0.95 "
                            "attainment (bracketing, then bisection over multiples of --slo-resolution)")
    sim.add_argument("--slo-resolution", type=positive_number, default=0.1, metavar="LOAD", help="with --slo-capacity: bisect over loads that are multiples of this step (default 0.1)")
    sim.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma-separated, from fcfs,priority,slaq,slaq-max-tokens,oracle (default {DEFAULT_POLICIES})")
    sim.add_argument("--profile", default="h200-llama3-8b", help="step-time model: a bundled name or a YAML path (default h200-llama3-8b)")
    sim.add_argument("--capacity-rps", type=float, default=None, help="skip measuring capacity and use this many requests/s")
    sim.add_argument("--max-drain", type=float, default=1800.0, metavar="SECONDS",
                     help="stop this long (simulated) after the last arrival; what has not finished is reported unfinished")
    sim.add_argument("--pod", action="store_true",
                     help="measure the pod as it ships: slaq runs behind the real sidecar core (admission, quotas, queue, release "
                          "rule, length prediction) in simulated time; fcfs and priority are stock vLLM pods with no sidecar")
    sim.add_argument("--quota", action="append", default=[], metavar="TENANT:rpm=N[,tpm=N][,concurrency=N]",
                     help="with --pod: a tenant's quota share on the pod (tenants are TIER-INDEX, e.g. batch-0); repeatable")
    sim.add_argument("--kv-swap", choices=("on", "off", "both"), default="on",
                     help="slaq's engine swaps preempted requests' KV to host memory and back when cheaper than recomputing it "
                          "(on, as it ships), recomputes it (off), or both: the slaq policy runs twice, the second as slaq-noswap")
    sim.add_argument("--kv-host-cache-gib", type=float, default=None, metavar="GIB",
                     help="host memory for swapped KV (default: the profile's engine.kv_host_cache_gib, or one max_model_len context's KV "
                          "when it sets none: 1 GiB on the 8k H200 profile, 16 GiB on h200-llama3-8b-128k)")
    sim.add_argument("--kv-seal-gb-s", default=None, metavar="GB_S|off",
                     help="host-side AES-GCM seal/open throughput of the KV connector, added to the host link's time "
                          "(default: the profile's gpu.host_seal_gb_s; off: not counted)")
    sim.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    sim.add_argument("--plots", type=Path, default=None, metavar="DIR", help="write PNG plots here (needs matplotlib)")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.set_defaults(handler=_sim)

    from slaq.bench.live_cli import add_live_parser

    add_live_parser(commands, _workload_arguments)

    from slaq.bench.cluster_cli import add_cluster_parser

    add_cluster_parser(commands)


def _objectives(overrides: list[str]) -> dict:
    from slaq.api.common import Tier
    from slaq.bench.errors import WorkloadError
    from slaq.bench.workload import DEFAULT_OBJECTIVES, TierObjectives

    objectives = dict(DEFAULT_OBJECTIVES)
    for text in overrides:
        name, _, values = text.partition("=")
        try:
            tier = Tier(name.strip())
            ttft, _, tpot = values.partition(":")
            objectives[tier] = TierObjectives(float(ttft) if ttft else None, float(tpot) if tpot else None)
        except ValueError as exc:
            raise WorkloadError(f"bad --objective {text!r} (use TIER=TTFT_S[:TPOT_S], tiers critical|standard|batch): {exc}") from exc
    return objectives


QUOTA_FIELDS = {"rpm": "requests_per_minute", "tpm": "tokens_per_minute", "concurrency": "max_concurrency"}


def parse_quotas(texts: list[str]) -> dict:  # tenant -> ReplicaShare
    from pydantic import ValidationError

    from slaq.api.table import ReplicaShare
    from slaq.bench.errors import WorkloadError

    quotas = {}
    for text in texts:
        tenant, _, fields = text.partition(":")
        values = {}
        for part in filter(None, (p.strip() for p in fields.split(","))):
            name, _, number = part.partition("=")
            if name.strip() not in QUOTA_FIELDS:
                raise WorkloadError(f"bad --quota {text!r}: unknown field {name.strip()!r} (use {', '.join(QUOTA_FIELDS)})")
            values[QUOTA_FIELDS[name.strip()]] = number.strip()
        if not tenant.strip() or not values:
            raise WorkloadError(f"bad --quota {text!r}: use TENANT:rpm=N[,tpm=N][,concurrency=N]")
        try:
            quotas[tenant.strip()] = ReplicaShare.model_validate(values)
        except ValidationError as exc:
            raise WorkloadError(f"bad --quota {text!r}: {exc.errors()[0]['loc'][0]} {exc.errors()[0]['msg']}") from None
    return quotas


def pod_from_args(args: argparse.Namespace):  # -> PodConfig | None
    from slaq.bench.errors import WorkloadError
    from slaq.bench.pod import PodConfig

    if not args.pod:
        if args.quota:
            raise WorkloadError("--quota needs --pod (quotas are the sidecar's)")
        return None
    return PodConfig(quotas=parse_quotas(args.quota))


def workload_from_args(args: argparse.Namespace):  # -> WorkloadSpec
    from slaq.bench.benchmark import WorkloadSpec
    from slaq.bench.errors import WorkloadError
    from slaq.bench.workload import parse_bursts, parse_mix

    generated = getattr(args, "workload", None)
    no_trace = "--synthetic" if args.synthetic else f"--workload {generated}" if generated else None
    if no_trace and (args.arrivals == "trace" or args.window is not None):
        raise WorkloadError(f"{no_trace} has no trace to keep arrivals or cut a window from: drop --arrivals trace / --window")
    trace = None if no_trace else args.trace
    arrivals = "poisson" if no_trace else args.arrivals or "trace"
    spec = WorkloadSpec(trace=trace, requests=args.requests, arrivals=arrivals, window_s=args.window, seed=args.seed,
                        mix=parse_mix(args.mix), tenants_per_tier=args.tenants_per_tier, objectives=_objectives(args.objective),
                        bursts=parse_bursts(args.bursts) if args.bursts else None, generator=generated)
    if generated:
        from slaq.bench.pool_profile import DEFAULT_PROFILE, load_profile

        spec.max_model_len = load_profile(getattr(args, "profile", None) or DEFAULT_PROFILE).model.max_model_len
    return spec


def _seal_rate(text: str | None) -> float | None:
    from slaq.bench.errors import ProfileError

    if text is None or text == "off":
        return None
    try:
        return float(text)
    except ValueError:
        raise ProfileError(f"--kv-seal-gb-s must be a number of GB/s or off, got {text!r}") from None


def _source(workload: dict) -> str:
    """`the conv trace` / `workload long-context` / `synthetic`, for the run's first line."""
    if workload.get("generator"):
        return f"workload {workload['generator']['name']}, prompts mean {workload['prompt_tokens_mean']:,.0f} / median {workload['prompt_tokens_p50']:,} / max {workload['prompt_tokens_max']:,} tokens"
    return workload["trace"] or "synthetic"


def _sim(args: argparse.Namespace) -> int:
    from slaq.bench.errors import BenchError

    try:
        return _run_sim(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run_sim(args: argparse.Namespace) -> int:
    from slaq.bench.benchmark import run_benchmark
    from slaq.bench.envelope import envelope
    from slaq.bench.policies import parse_policies
    from slaq.bench.pool_profile import load_profile, with_kv_swap
    from slaq.bench.progress import ProgressBar
    from slaq.bench.report import format_table, sweep_table, write_report

    policies = parse_policies(args.policies)
    for spec in policies:
        spec.load()  # fail before any simulation when a policy is not available
    loads = args.load_sweep or [args.load or 1.0]
    workload = workload_from_args(args)
    pod = pod_from_args(args)
    profile = load_profile(args.profile)
    profile = with_kv_swap(profile, host_cache_gib=args.kv_host_cache_gib, seal_gb_s=_seal_rate(args.kv_seal_gb_s),
                           seal_counted=args.kv_seal_gb_s != "off")
    run = envelope()  # the command line, the start time and the commit, for the report
    if args.slo_capacity:
        return _run_slo_capacity(args, workload, profile, policies, pod, run)
    bars: dict[tuple[str, float], ProgressBar] = {}

    def on_start(spec, load):
        if args.quiet:
            return None
        bars[(spec.name, load)] = bar = ProgressBar(f"{spec.name} @ load {load:g}")
        return bar

    def on_done(spec, load, figures):
        bar = bars.pop((spec.name, load), None)
        if bar is not None:
            if "error" in figures:
                bar.close(f"FAILED: {figures['error']}")
            else:
                bar.close(f"attainment {100 * figures['attainment']:.1f}%, {figures['throughput_tok_s']:,.0f} tok/s")

    if not args.quiet and args.capacity_rps is None:
        print("measuring capacity...", file=sys.stderr)
    kept: list = [] if args.plots else None
    report = run_benchmark(workload, profile, policies, loads, capacity_rps=args.capacity_rps, max_drain_s=args.max_drain,
                           on_start=on_start, on_done=on_done, keep_results=kept, pod=pod, kv_swap=args.kv_swap)
    entries = report.get("sweep") or [{"load": report["load"], "rate_rps": report["rate_rps"], "policies": report["policies"]}]
    capacity = report["capacity"]["requests_per_s"]
    workload_info = report["workload"]
    print(f"{workload_info['requests']} requests ({_source(workload_info)}, arrivals {workload_info['arrivals']}, seed {workload_info['seed']}); "
          f"profile {profile.name}; capacity {capacity:.2f} req/s ({report['capacity']['method']})")
    print("mode: pod (slaq behind the sidecar core; fcfs/priority stock vLLM without one; oracle the engine alone)" if pod is not None
          else "mode: engine (every policy drives the engine scheduler alone, no sidecar)")
    seal = f"{profile.gpu.host_seal_gb_s:g} GB/s" if profile.gpu.host_seal_gb_s else "not counted"
    print(f"KV swap {args.kv_swap} (slaq's KV connector, {profile.host_cache_gib:g} GiB of host cache, "
          f"{profile.gpu.host_link_gb_s:g} GB/s host link, sealing {seal}; stock vLLM recomputes its victims)")
    for entry in entries:
        print()
        print(format_table(entry["policies"], title=f"load {entry['load']:g} ({entry['rate_rps']:.2f} req/s)"))
    if len(entries) > 1:
        print()
        print(sweep_table(entries))
    if args.out:
        write_report(report, args.out, run)
        print(f"\nreport: {args.out}")
    if args.plots:
        from slaq.bench.plots import attainment_vs_load, ttft_cdf

        args.plots.mkdir(parents=True, exist_ok=True)
        written = []
        objectives = {t: o["ttft_s"] for t, o in workload_info["objectives"].items()}
        for entry in entries:
            ttfts = {}
            for load, result in kept:
                if load == entry["load"]:
                    by_tier: dict[str, list[float]] = {}
                    for record in result.records:
                        if record.ttft_s is not None:
                            by_tier.setdefault(record.tier.value, []).append(record.ttft_s)
                    ttfts[result.policy] = by_tier
            written.append(ttft_cdf(ttfts, objectives, args.plots / f"ttft_cdf_load{entry['load']:g}.png", f"TTFT CDF at load {entry['load']:g}"))
        written.append(attainment_vs_load(entries, args.plots / "attainment_vs_load.png", "SLO attainment vs load"))
        print("plots: " + ", ".join(str(p) for p in written))
    failed = sorted({name for entry in entries for name, figures in entry["policies"].items() if "error" in figures})
    if failed:
        print(f"\nfailed policies (their scheduler raised; see the report's `error`): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _run_slo_capacity(args: argparse.Namespace, workload, profile, policies, pod, run: dict) -> int:
    from slaq.bench.benchmark import run_slo_capacity
    from slaq.bench.report import slo_capacity_table, write_report

    def on_probe(name: str, load: float, attainment: dict[str, float]) -> None:
        if not args.quiet:
            figures = ", ".join(f"{tier} {value:.3f}" for tier, value in attainment.items())
            print(f"  {name} @ load {load:g}: {figures}", file=sys.stderr)

    if not args.quiet and args.capacity_rps is None:
        print("measuring capacity...", file=sys.stderr)
    report = run_slo_capacity(workload, profile, policies, capacity_rps=args.capacity_rps, max_drain_s=args.max_drain, pod=pod,
                              kv_swap=args.kv_swap, resolution=args.slo_resolution, on_probe=on_probe)
    info = report["workload"]
    print(f"{info['requests']} requests ({_source(info)}, arrivals {info['arrivals']}, seed {info['seed']}); "
          f"profile {profile.name}; capacity {report['capacity']['requests_per_s']:.2f} req/s ({report['capacity']['method']}); "
          f"mode {report['mode']}")
    print(slo_capacity_table(report["slo_capacity"], report["slo_targets"]))
    if args.out:
        write_report(report, args.out, run)
        print(f"\nreport: {args.out}")
    return 0
