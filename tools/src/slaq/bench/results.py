"""docs/results.md, rendered from the benchmarks' JSON reports in docs/results/.

    python -m slaq.bench.results            # (re)write docs/results.md from docs/results/*.json
    python -m slaq.bench.results --check    # exit 1 when docs/results.md is not what the reports give

Every report is the JSON a benchmark wrote with `--out` (`slaq bench sim`, sched_overhead.py,
sidecar_latency.py, operator_scale.py, quota_skew.py, quota_store.py, `slaq bench cluster`, e2e/demo_loop.py, e2e/test_quota_skew.py's
`--quota-skew-report`), the run's envelope first (`slaq.bench.envelope`: command
line, UTC date, commit). The page holds no figure that is not in a report: one section per report,
headed by the report's file name (`docs/results.md#pod-1500` for `docs/results/pod-1500.json`;
`#pod-6000-load15` for `pod-6000-load1.5.json`, as GitHub drops the dot),
with the command that produced it, its date and commit. A report without its command or date is
refused, naming the file. Rendering is a pure function of the reports (`render`), so the page is
stale exactly when re-rendering changes it (tests/test_results_page.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from slaq.bench.envelope import ENVELOPE_KEY, REPO_ROOT

REPORTS = REPO_ROOT / "docs" / "results"
PAGE = REPO_ROOT / "docs" / "results.md"
TIERS = ("critical", "standard", "batch")

HEADER = """# Results

The benchmark figures the READMEs point to, rendered from the benchmarks' own JSON reports in
`docs/results/` by `python -m slaq.bench.results` (do not edit this page by hand: rerun the
command; tests/test_results_page.py fails when the page and the reports disagree). Each
section is one report: the command line that wrote it (run it to reproduce the figure), the UTC date
and the commit it ran at ("+ local changes" when tracked files differed from that commit).

The simulator (`slaq bench sim`, tools/src/slaq/bench/README.md) runs the real vLLM 0.32 scheduler
classes in simulated time on an H200 / Llama-3-8B step-time model that is not calibrated against a
real H200: read its comparisons, not its absolute figures. Its attainment figures are deterministic
(same command, same figures); wall-clock figures (scheduler cost, sidecar latency, operator
convergence) depend on the machine and what else ran on it.
"""


class ResultsError(ValueError):
    """A report the page cannot be rendered from; the message names the file and what is wrong."""


def load_reports(directory: Path = REPORTS) -> dict[str, dict[str, Any]]:
    """name (file stem) -> report, for every `*.json` in `directory`, each checked for its envelope."""
    if not directory.is_dir():
        raise ResultsError(f"no report directory {directory}")
    reports: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ResultsError(f"{path}: not JSON ({exc})") from None
        check_report(path.name, report)
        reports[path.stem] = report
    if not reports:
        raise ResultsError(f"no reports (*.json) in {directory}")
    return reports


def check_report(name: str, report: Any) -> None:
    """Raise ResultsError unless `report` carries a known schema and an envelope with its command and date."""
    if not isinstance(report, dict):
        raise ResultsError(f"{name}: a report is a JSON object, got {type(report).__name__}")
    run = report.get(ENVELOPE_KEY)
    if not isinstance(run, dict):
        raise ResultsError(f"{name}: no {ENVELOPE_KEY!r} envelope (command line, date, commit): "
                           "rerun the benchmark with --out, which writes it")
    for key in ("command", "date"):
        if not isinstance(run.get(key), str) or not run[key].strip():
            raise ResultsError(f"{name}: the envelope has no {key!r}: rerun the benchmark with --out, which writes it")
    if report.get("schema") not in RENDERERS:
        raise ResultsError(f"{name}: unknown schema {report.get('schema')!r} (known: {', '.join(sorted(RENDERERS))})")


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(row) + " |" for row in rows)]


def _sim_loads(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    if report.get("sweep"):
        return report["sweep"]
    return [{"load": report["load"], "rate_rps": report["rate_rps"], "policies": report["policies"]}]


def _sim_workload(report: Mapping[str, Any]) -> str:
    workload, capacity = report["workload"], report["capacity"]
    generator = workload.get("generator")
    if generator:
        source = (f"`{generator['name']}` (synthetic, profile `{report['profile']['name']}`; prompts mean {workload['prompt_tokens_mean']:,.0f}, "
                  f"median {workload['prompt_tokens_p50']:,}, max {workload['prompt_tokens_max']:,} tokens; outputs mean {workload['output_tokens_mean']:,.0f})")
    else:
        source = f"`{Path(workload['trace']).name if workload.get('trace') else 'synthetic'}`"
    mode = "the pod (slaq behind the sidecar core; stock policies without one)" if report.get("mode") == "pod" \
        else "the engine alone (no sidecar)"
    shape = ""
    if workload.get("window_s"):
        shape += f", its densest {workload['window_s']:g} s ({workload['window_density']:.2f}× the trace's mean density)"
    if workload.get("bursts"):
        bursts = workload["bursts"]
        shape += f", bursts at {bursts['factor']:g}× the mean rate for {bursts['burst_s']:g} s of every {bursts['period_s']:g} s"
    return (f"{workload['requests']:,} requests of {source}, seed {workload['seed']}, arrivals {workload['arrivals']}{shape}; "
            f"{mode}; capacity {capacity['requests_per_s']:.2f} requests/s ({capacity['method']}).")


def render_sim(report: Mapping[str, Any]) -> list[str]:
    """Per load, per policy: attainment per tier, critical TTFT p99, throughput (and × stock fcfs), refusals."""
    lines = [_sim_workload(report), ""]
    if "slo_capacity" in report:
        return lines + render_slo_capacity(report)
    pod = report.get("mode") == "pod"
    header = ["load", "policy", "critical / standard / batch attained", "critical TTFT p99", "throughput",
              "× stock `fcfs`", "refused"] + (["held in the sidecar, p99 (critical / standard / batch)"] if pod else [])
    rows = []
    for entry in _sim_loads(report):
        policies = entry["policies"]
        fcfs = policies.get("fcfs", {}).get("throughput_tok_s")
        for name, figures in policies.items():
            if "error" in figures:
                rows.append([f"{entry['load']:g}", f"`{name}`", f"failed: {figures['error']}"] + [""] * (len(header) - 3))
                continue
            tiers = figures["tiers"]
            attained = " / ".join(_pct(tiers[t]["attainment"]) if t in tiers else "—" for t in TIERS)
            ratio = f"{figures['throughput_tok_s'] / fcfs:.3f}×" if fcfs else "—"
            rows.append([f"{entry['load']:g}", f"`{name}`", attained, _seconds(tiers.get("critical", {}).get("ttft_p99_s")),
                         f"{figures['throughput_tok_s']:,.0f} tok/s", ratio, f"{figures.get('refused') or 0:,}"]
                        + ([_held(figures)] if pod else []))
    lines += _table(header, rows)
    return lines + ["", *_preemption_lines(report)]


def _preemption_lines(report: Mapping[str, Any]) -> list[str]:
    """Per policy: each protected tier's TTFT and TPOT attainment apart (which objective a miss missed), preemptions,
    recompute tax, and what its KV connector swapped instead of recomputing."""
    lines = []
    for entry in _sim_loads(report):
        for name, figures in entry["policies"].items():
            if "error" in figures:
                continue
            tiers = figures["tiers"]
            parts = [f"{t} TTFT {_pct(tiers[t].get('ttft_attainment'))} / TPOT {_pct(tiers[t].get('tpot_attainment'))}"
                     for t in ("critical", "standard") if t in tiers]
            lines.append(f"- load {entry['load']:g}, `{name}`: {', '.join(parts)}; {figures['preemptions']:,} preemptions, "
                         f"recompute tax {_tax(figures)}{_kv_swap(figures.get('kv_swap'))}")
    return lines


def _tax(figures: Mapping[str, Any]) -> str:
    """The recompute tax in percent (hundredths of a percent tell swapping from recomputing) and the tokens behind it."""
    tax, tokens = figures.get("recompute_tax"), figures.get("recomputed_tokens")
    return "—" if tax is None else f"{tax * 100:.2f} %" + ("" if tokens is None else f" ({tokens:,} tokens)")


SWAP_REFUSALS = {"recompute": "recompute cheaper", "refused": "no room or nothing to save"}


def _kv_swap(swap: Mapping[str, Any] | None) -> str:
    """The KV connector's account: victims swapped and recomputed (and why), host transfer time, the rule's prices."""
    if not swap:
        return "; no KV swap (victims recomputed)"
    if not swap["victims"]:
        return f"; KV swap on, no victims ({swap['host_cache_gib']:g} GiB host cache)"
    reasons = ", ".join(f"{SWAP_REFUSALS.get(reason, reason)}: {n:,}" for reason, n in sorted((swap.get("refusals") or {}).items()) if n)
    seal = f"{swap['host_seal_gb_s']:g} GB/s" if swap.get("host_seal_gb_s") else "not counted"
    rule = swap.get("rule") or {}
    prices = (f"; per token {rule['seal_and_open_s_per_token'] * 1e6:,.1f} µs out and back against "
              f"{rule['recompute_s_per_token'] * 1e6:,.1f} µs to recompute"
              if rule.get("seal_and_open_s_per_token") is not None and rule.get("recompute_s_per_token") is not None else "")
    return (f"; KV swap: {swap['swapped_victims']:,} of {swap['victims']:,} victims swapped, {swap['recomputed_victims']:,} "
            f"recomputed{f' ({reasons})' if reasons else ''}, {swap['transfer_s']:.3f} s of host transfers "
            f"({swap['host_cache_gib']:g} GiB host cache, {swap['host_link_gb_s']:g} GB/s link, sealing {seal}{prices})")


def _held(figures: Mapping[str, Any]) -> str:
    """p99 of the time each tier's requests waited in the sidecar, or "no sidecar" for a stock pod."""
    if not figures.get("behind_sidecar"):
        return "no sidecar"
    tiers = figures["tiers"]
    return " / ".join(_seconds(tiers.get(t, {}).get("sidecar_wait_p99_s")) for t in TIERS)


def render_slo_capacity(report: Mapping[str, Any]) -> list[str]:
    targets = " and ".join(f"{tier} ≥ {target:g}" for tier, target in report["slo_targets"].items())
    found = report["slo_capacity"]
    reference = found.get("priority", {}).get("slo_capacity")
    rows = []
    for name, entry in found.items():
        capacity = entry["slo_capacity"]
        probes = ", ".join(f"{p['load']:g} {'✓' if p['meets'] else '✗'} ("
                           + " / ".join(_pct(p.get(tier)) for tier in report["slo_targets"]) + ")" for p in entry["probes"])
        rows.append([f"`{name}`", f"{capacity:g}" + ("" if entry["bounded"] else "+"),
                     f"{capacity / reference:.2f}" if reference else "—", probes])
    return [f"SLO capacity: the highest load with {targets}.", "",
            *_table(["policy", "SLO capacity", "× stock `priority`",
                     f"loads probed (✓ met, ✗ not; {' / '.join(report['slo_targets'])} attained)"], rows)]


def render_sched_overhead(report: Mapping[str, Any]) -> list[str]:
    rows = [[row["scenario"], f"{row['waiting']:,}", f"{row['stock_mean_us']:,.0f} / {row['slaq_mean_us']:,.0f}",
             f"{row['stock_p50_us']:,.0f} / {row['slaq_p50_us']:,.0f}", f"{row['ratio_mean']:.2f}", f"{row['ratio_p50']:.2f}",
             f"{row['stock_admitting_share']:.0%} / {row['slaq_admitting_share']:.0%}"] for row in report["rows"]]
    return [f"`schedule()` per step, stock vLLM `AsyncScheduler` against slaq's `SLAScheduler`, stepped in turn; "
            f"max_num_seqs {report['max_num_seqs']}, max_num_batched_tokens {report['max_num_batched_tokens']}, "
            f"{report['steps']} steps, the quietest of {report['repeats']} repeats (wall clock on the machine that ran it).", "",
            *_table(["scenario", "waiting", "mean µs (stock / slaq)", "p50 µs (stock / slaq)", "slaq ÷ stock, mean",
                     "slaq ÷ stock, p50", "steps admitting (stock / slaq)"], rows)]


def render_sidecar_latency(report: Mapping[str, Any]) -> list[str]:
    rows = [[f"{row['streams']:,}", f"{row['requests']:,}", f"{row['direct_p50_ms']:.2f} / {row['direct_p99_ms']:.2f}",
             f"{row['sidecar_p50_ms']:.2f} / {row['sidecar_p99_ms']:.2f}", f"{row['added_p50_ms']:.2f} / {row['added_p99_ms']:.2f}",
             f"≤ {row['own_p50_ms_at_most']:g} / ≤ {row['own_p99_ms_at_most']:g}"] for row in report["rows"]]
    prompt = ""
    if report.get("prompt_tokens"):  # reports from before 2026-12-05 hold no prompt (the default, 'hello ' x 50)
        counted = f"counted by the sidecar with the `{report['tokenizer']}` tokenizer" if report.get("tokenizer") else "estimated by the sidecar (no tokenizer)"
        prompt = f", a prompt of {report['prompt_tokens']:,} tokens ({report['prompt_chars']:,} characters) {counted}"
    # Reports from before 2026-12-07 ran every request straight to the engine, then every one through the sidecar.
    order = "alternately (one request each way, in turn)" if report.get("paired") else "one path after the other"
    return [f"TTFT straight to a fake engine ({report['tokens']} tokens, the first after {report['token_delay_ms']:g} ms{prompt}) and "
            f"through the real sidecar, {order}, {report['requests_per_stream']} requests per stream each way; {report['cpus']} CPUs, load "
            f"average {report['load_average_before']:.1f} before the run (wall clock: other processes add to both columns).", "",
            *_table(["streams", "requests", "direct p50 / p99 ms", "through the sidecar p50 / p99 ms", "added p50 / p99 ms",
                     "sidecar's own work p50 / p99 ms (`slaq_sidecar_added_seconds`)"], rows)]


def render_quota_store(report: Mapping[str, Any]) -> list[str]:
    """quota_store.py: an admission's round trip to the shared store, and each decision after the store was killed or stalled."""
    r = report["reservation"]
    rows = [[f"answering (one after another, {report['skew']:.0%} on one replica)", f"{r['requests']:,}",
             f"p50 {r['p50_ms']:.2f}, p99 {r['p99_ms']:.2f}, max {r['max_ms']:.2f}", f"{r['in_store']:,} in the store"]]
    for kind, label in (("killed", "killed (SIGKILL: connections refused)"), ("stalled", "stalled (SIGSTOP: nothing answers)")):
        f = report[kind]
        ms = f["decision_ms"]
        rows.append([label, f"{f['decisions']:,}", "each: " + ", ".join(f"{v:g}" for v in ms),
                     f"{f['admitted_on_shares']:,} on the replica's share, {f['refused']:,} refused; breaker {f['breaker_after']}"])
    return [f"Two replicas' quota gates (`SharedQuotaGate`) on one redis-server {report['redis']} on 127.0.0.1, the sidecar's store "
            f"settings (timeout {report['timeout_s'] * 1e3:g} ms, the breaker open after {report['failures_to_open']} failures in a row); "
            f"each admission reserves {report['reserved_tokens']} tokens and is settled at {report['used_tokens']} before the next. "
            "Time from the admission call to its decision (wall clock on the machine that ran it).", "",
            *_table(["store", "admissions", "time to the decision, ms", "decided"], rows)]


def render_kv_security_cost(report: Mapping[str, Any]) -> list[str]:
    """Sealing and opening a swapped block, erasing a freed one, on the machine the report names."""
    seal, erase, g = report["seal"], report["erase"], report["geometry"]
    rows = [[report["device"], report["dtype"], f"{seal['seal_gb_s']:g} / {seal['open_gb_s']:g}",
             f"{seal['seal_s_per_block'] * 1e3:.2f} / {seal['open_s_per_block'] * 1e3:.2f}", f"{seal['out_and_back_us_per_token']:g}",
             f"{erase['seconds_per_block_all_layers'] * 1e3:.3f} ({'Triton' if erase['triton'] else 'torch reference'})"]]
    return [f"A Llama-3-8B block ({g['layers']} layers x {g['block_size']} tokens x {g['kv_heads']} KV heads of {g['head_dim']}, "
            f"{seal['block_bytes'] / 2**20:g} MiB); medians of {report['repeats']} rounds; wall clock on the machine below.", ""] + \
        _table(["device", "dtype", "seal / open GB/s", "seal / open ms per block", "µs per token out and back",
                "erase ms per block (all layers)"], rows)


def render_operator_scale(report: Mapping[str, Any]) -> list[str]:
    row = [f"{report['tenants']:,}", f"{report['pools']:,}", f"{report['models']:,}", f"{report['table_secrets']:,}",
           f"{report['converge_s']:g} s", "—" if report.get("statuses_s") is None else f"{report['statuses_s']:g} s",
           f"{report['change_s']:g} s", f"{report['affected_pools']:,}", f"{report['calls_per_change']:,} (bound {report['calls_bound']:,})"]
    return ["The real operator (kopf, lightkube) against the API emulator: cold-start convergence (every table holds its "
            "tenants; then every tenant's status written, both from the operator's start; — where the report predates "
            "`statuses_s`) and one tenant's quota change (wall clock on the machine that ran it).", "",
            *_table(["tenants", "pools", "models", "table Secrets", "converge", "tenant statuses", "quota change", "pools affected",
                     "API calls for the change"], [row])] + \
        ([] if report.get("rotate_s") is None else
         ["", f"- The same tenant's key Secret patched with a new key: {report['rotate_s']:g} s until every table of its pools held "
              f"the new key's hash instead of the old one, API calls for it: {report['calls_per_rotation']:,} (the operator's part of a "
              "rotation; the kubelet's Secret-volume sync to the sidecars comes on top in a cluster)."])


def render_quota_skew(report: Mapping[str, Any]) -> list[str]:
    rows = [[f"{row['propagation_s']:g} s", row["split"], f"{row['admitted']:.3f}", " ".join(f"{r:.3f}" for r in row["runs"])]
            for row in report["rows"]]
    skew = " / ".join(f"{s:.0%}" for s in report["skew"])
    return [f"A tenant sending exactly its quota ({report['rpm']:,} requests per minute, "
            f"{'evenly spaced' if report['even'] else 'Poisson'}) through a router that sends {skew} of its requests to "
            f"{len(report['skew'])} replicas; the operator's split re-planned every {report['tick_s']:g} s; the fraction "
            f"admitted over the last {report['measure_s']:g} s of {report['minutes']:g} simulated minutes, mean of "
            f"{report['seeds']} seeds.", "",
            *_table(["table propagation", "split", "admitted", "runs"], rows)]


def render_quota_routing(report: Mapping[str, Any]) -> list[str]:
    def signed(value: float | None) -> str:
        return "-" if value is None else f"{value:+.3f}"

    rows = [[row["router"], f"{row['propagation_s']:g} s", row["split"], f"{row['admitted']:.3f}", signed(row["error_max"]),
             signed(row["error_mean"]), signed(row["after_scale_mean"]), signed(row["after_scale_min"])] for row in report["rows"]]
    schedule = ", ".join(f"{n} from {t:g} s" for t, n in report["schedule"])
    return [f"A tenant sending exactly its quota ({report['rpm']:,} requests per minute, Poisson) through each router "
            f"while its pool scales ({schedule}); least-request holds a request open for an exponential "
            f"{report['service_s']:g} s on average, affinity hashes {report['sessions']} Zipf({report['zipf']:g})-popular client "
            f"sessions onto the pods; the split re-planned every {report['tick_s']:g} s over {report['minutes']:g} simulated "
            f"minutes, {report['seeds']} seeds. Error: admitted per minute / quota − 1 (max and mean over every minute; "
            f"mean and lowest in the minute after each scale event).", "",
            *_table(["router", "table propagation", "split", "admitted", "error max", "error mean", "after scale mean",
                     "after scale lowest"], rows)]


def render_quota_skew_live(report: Mapping[str, Any]) -> list[str]:
    """e2e/test_quota_skew.py's figures: per mode (per-pod shares, the shared store) the overload's ε and the exact
    phase's admitted fraction, the store's calls, and what a killed store cost."""
    setup, limits, figures = report["setup"], report["thresholds"], report["figures"]
    names = [pod["name"] for pod in setup["pods"]]
    quota = setup["quota_rpm"]
    weights = "/".join(f"{pod['weight']:g}" for pod in setup["pods"])
    rows = []
    for mode, label in (("local", "per-pod shares (no store)"), ("store", "shared store (`--quota-store`, redis)")):
        f = figures.get(mode)
        if f is None:
            continue
        per_pod = {key: [f[key.format(name)] for name in names] for key in ("share_{}", "exact_{}_sent", "exact_{}_refused")}
        admitted = f["exact_sent"] - sum(per_pod["exact_{}_refused"])  # every answer was 200 or 429 (the test checks)
        rows.append([label, f"{f.get('overload_s', setup['overload_s']):g} s", f"{f['window_s']:g} s", f"{f['window_admitted']:,} / {f['window_quota']:g}", f"{f['epsilon']:+.4f}",
                     f"{admitted:,} of {f['exact_sent']:,} ({f['exact_admitted_fraction']:.3f})",
                     " / ".join(f"{n:,}" for n in per_pod["exact_{}_sent"]), " / ".join(f"{n:,}" for n in per_pod["exact_{}_refused"]),
                     " / ".join(f"{share:.2f}" for share in per_pod["share_{}"])])
    pods = " / ".join(f"`{name}`" for name in names)
    failed = report["failed"]
    load = "" if report.get("load_average_end") is None else f"; load average {report['load_average_end']:g} at the end"
    longer = "" if "max_overload_s" not in setup else \
        f" or on, up to {setup['max_overload_s']:g} s, until both pods have refused for {setup['min_window_s']:g} s"
    lines = [f"The live test (marked `engine`, {report['duration_s']:,} s with two tiny CPU engine starts{load}): two pods of "
             f"one pool ({pods}), each its own engine and sidecar as the operator rendered them, behind HAProxy weighted {weights}; the operator against the API emulator splits a tenant's "
             f"{quota:,} rpm from both pods' usage. Each mode: an overload at {setup['overload']:g}× the quota for "
             f"{setup['overload_s']:g} s{longer}, ε = admitted / refilled − 1 from the moment both pods have refused to its end; then, "
             f"after {setup['pause_s']:g} s without traffic, exactly the quota for {setup['exact_s']:g} s. "
             + ("Every test of the run passed." if not failed else f"{failed} test(s) of the run FAILED: read these figures as a failure's."), "",
             *_table(["mode", "overload", "window (both pods refusing)", "admitted / refilled", "ε", "exact phase admitted",
                      f"sent per pod ({pods})", "refused per pod", "table shares, rpm"], rows), ""]
    calls = figures.get("store_calls")
    if calls:
        answered, missed = calls["answered"], calls["fallen_back"]
        lines.append("- Store calls in the shared-store mode (both sidecars) answered / decided on the local shares after a timeout: "
                     + ", ".join(f"{op} {answered[op]:,.0f} / {missed.get(op, 0):,.0f}" for op in answered) + ".")
    kill = figures.get("kill")
    if kill:
        lines.append(f"- The store killed (SIGKILL) {kill['kill_at_s']:g} s into traffic through the leastconn frontend: "
                     f"{kill['admitted_after_kill']:,} of the {kill['requests_after_kill']:,} requests sent after the kill admitted "
                     f"on the local shares, the first answered {kill['first_token_after_kill_s'] * 1e3:,.0f} ms after it; "
                     f"{kill['long_streams_ended_after_kill']} of the streams the store had admitted finished after the kill; "
                     f"{kill['fallbacks']:,.0f} store calls had fallen back by then (the store was gone for them).")
    lines.append(f"- The test asserts: shares within {limits['split_tolerance']:.0%} of the quota of the {weights} split, exact phase "
                 f"admitted ≥ {limits['local_admitted']:g} on per-pod shares and ≥ {limits['store_admitted']:g} with the store, "
                 f"ε ≤ {limits['epsilon']:g}; after the kill, every request admitted.")
    return lines


def render_demo_loop(report: Mapping[str, Any]) -> list[str]:
    summary = report["summary"]

    def cell(key: str, fmt: Callable[[float], str]) -> str:
        figures = summary.get(key)
        return "—" if figures is None else " / ".join(fmt(figures[k]) for k in ("min", "median", "max"))

    percent = lambda v: f"{v:.0%}"  # noqa: E731
    rows = [[label, cell(key, fmt)] for key, label, fmt in (
        ("slaq_vip_met", "slaq VIP SLO met", percent), ("stock_vip_met", "stock VIP SLO met", percent),
        ("slaq_standard_met", "slaq standard SLO met", percent), ("stock_standard_met", "stock standard SLO met", percent),
        ("vip_handover_p90_ms", "slaq VIP handover p90 (ms)", lambda v: f"{v:.0f}"),
        ("capacity_rps", "stock capacity measured (requests/s)", lambda v: f"{v:.1f}"))]
    saturated = summary["front_end_saturated"]
    return [f"`slaq up --demo{' --quick' if report.get('quick') else ''}` run {summary['runs']} times in a row: "
            f"{summary['exited_0']} exited 0, scenario 4.5 in the report's order (under slaq) in {summary['scenario_in_order']}; "
            f"the front end was saturated (the demo's verdict) in {saturated['stock']} of stock's loaded runs and "
            f"{saturated['slaq']} of slaq's.", "", *_table(["figure", "min / median / max"], rows)]


def _hpa_settings(report: Mapping[str, Any]) -> str:
    """The slaq signal's HPA target and every HPA's scale-down window, when the report names them (reports
    before the flags used the CRD's 0.5 and 300 s)."""
    target = report.get("target_protected_load")
    window = report.get("scale_down_window_s")
    return ("" if target is None else f", `targetProtectedLoad` {target:g}") + ("" if window is None else f", `scaleDownStabilizationSeconds` {window}")


def _clairvoyant(report: Mapping[str, Any]) -> str:
    bound = report.get("clairvoyant")
    if bound is None:
        return ""
    due = "of the stage running, ordered when it starts" if bound["lead_s"] == 0 else f"of the highest rate due within {bound['lead_s']:g} s"
    return (f" `clairvoyant` is a bound, not a scaler: it knows the stages, keeps one pod per {bound['pod_rps']:g} requests/s "
            f"{due}, and scales down when a stage ends.")


def render_cluster(report: Mapping[str, Any]) -> list[str]:
    """Per signal: attainment (all, per tier), replicas (mean, peak), GPU-hours, scale events, lost requests, the run's wall
    clock (the simulator's speed on the machine that ran it, with what else ran there), a failure's cost."""
    workload, cold = report["workload"], report["cold_start_s"]
    stages = ", ".join(f"{s['rate_rps']:g}" for s in workload["stages"])
    lines = [f"`slaq bench cluster`, simulated (not hardware): {workload['requests']:,} requests of `{workload['name']}` (seed "
             f"{workload['seed']}, time scale {workload['time_scale']:g}; stages of {stages} requests/s) on `{report['profile']}`; "
             f"{report['pods']} pods behind the `{report['router']}` router, replicas {report['replicas']['min']}..{report['replicas']['max']}"
             f"{_hpa_settings(report)}, cold start {cold['pending']:g} s Pending + {cold['loading']:g} s loading.{_clairvoyant(report)}", ""]
    tiers = [t for t in TIERS if any(t in f.get("tiers", {}) for f in report["signals"].values())]
    rows = []
    for name, f in report["signals"].items():
        rows.append([f"`{name}`", _pct(f["attainment"]), " / ".join(_pct(f["tiers"][t]["attainment"]) if t in f["tiers"] else "—" for t in tiers),
                     f"{f['replicas']['mean']:.2f}", str(f["replicas"]["peak"]), f"{f['gpu_hours']:.2f}", str(len(f["scale_events"])),
                     f"{f['lost']['total']:,}", "—" if f.get("wall_s") is None else f"{f['wall_s']:,.0f} s"])
    lines += _table(["signal", "attainment", " / ".join(tiers) + " attained", "replicas mean", "peak", "GPU-hours", "scale events",
                     "lost", "simulator's wall clock"], rows)
    for name, f in report["signals"].items():
        failure = f.get("failure")
        if failure:
            lost = ", ".join(f"{tier} {n}" for tier, n in (failure.get("lost_by_tier") or {}).items() if n)
            recovery = ", ".join(f"{tier} {'not recovered' if s is None else f'{s:g} s'}" for tier, s in failure["recovery_s"].items())
            lines += ["", f"`{name}`: pod {failure['pod']} failed at {failure['at_s']:g} s, {failure['lost']:,} requests lost"
                          f"{f' ({lost})' if lost else ''}; back to the attainment before the failure after: {recovery or '—'}."]
    return lines


RENDERERS: dict[str, Callable[[Mapping[str, Any]], list[str]]] = {
    "slaq.bench.cluster/v1": render_cluster,
    "slaq.bench.sim/v1": render_sim,
    "slaq.bench.sched_overhead/v1": render_sched_overhead,
    "slaq.bench.sidecar_latency/v1": render_sidecar_latency,
    "slaq.bench.operator_scale/v1": render_operator_scale,
    "slaq.bench.kv_security_cost/v1": render_kv_security_cost,
    "slaq.bench.quota_skew/v1": render_quota_skew,
    "slaq.bench.quota_store/v1": render_quota_store,
    "slaq.bench.quota_routing/v1": render_quota_routing,
    "slaq.e2e.demo_loop/v1": render_demo_loop,
    "slaq.e2e.quota_skew/v1": render_quota_skew_live,
}


def anchor(name: str) -> str:
    """The fragment GitHub gives the section `## name`: lower case, punctuation but `-` and `_` dropped."""
    return re.sub(r"[^\w\- ]", "", name.lower()).replace(" ", "-")


def _provenance(run: Mapping[str, Any]) -> str:
    commit = run.get("commit")
    at = f"commit `{commit[:12]}`" + (" + local changes" if run.get("dirty") else "") if commit else "no git commit recorded"
    load = f", load average {run['load_average']:g} on {run['cpus']} CPUs at the start" if run.get("load_average") is not None \
        and run.get("cpus") else (f", load average {run['load_average']:g} at the start" if run.get("load_average") is not None else "")
    return f"Run {run['date']}, {at}{load}."


def render_section(name: str, report: Mapping[str, Any]) -> list[str]:
    check_report(name, report)
    run = report[ENVELOPE_KEY]
    return [f"## {name}", "", "```bash", run["command"], "```", "", _provenance(run), "", *RENDERERS[report["schema"]](report), ""]


def render(reports: Mapping[str, Mapping[str, Any]]) -> str:
    """The page for these reports (name -> report), sections in name order."""
    lines = [HEADER, "Reports: " + ", ".join(f"[{name}](#{anchor(name)})" for name in sorted(reports)) + ".", ""]
    for name in sorted(reports):
        lines += render_section(name, reports[name])
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slaq.bench.results", description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=Path, default=REPORTS, help=f"the reports' directory (default {REPORTS})")
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the page (default {PAGE})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page is not what the reports give")
    args = parser.parse_args(argv)
    try:
        reports = load_reports(args.reports)
        page = render(reports)
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    current = args.page.read_text(encoding="utf-8") if args.page.exists() else None
    if args.check:
        if current != page:
            print(f"{args.page} is stale against {args.reports}: run python -m slaq.bench.results", file=sys.stderr)
            return 1
        return 0
    if current != page:
        args.page.write_text(page, encoding="utf-8")
    print(f"{args.page}: {len(reports)} reports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
