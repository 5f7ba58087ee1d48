"""The benchmark report: a JSON document and the terminal table that compares policies.

Shape (single load):
    {"schema", "workload": {...}, "profile": {...}, "capacity": {...}, "load", "rate_rps",
     "policies": {<name>: {"attainment", "goodput_rps", "throughput_tok_s", "recompute_tax", "kv_swap", ...,
                           "tiers": {"critical"|"standard"|"batch": {"attainment", "goodput_rps",
                                     "ttft_p99_s", "completed_fraction", "max_wait_s", ...}}}}}
With --load-sweep the per-load parts move into "sweep": [{"load", "rate_rps", "policies"}, ...].
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from slaq.api.common import Tier

SCHEMA = "slaq.bench.sim/v1"


def write_report(report: dict[str, Any], path: str | Path, run: dict[str, Any] | None = None) -> None:
    """Write the report as JSON; `run` (slaq.bench.envelope) goes first, under "run"."""
    if run is not None:
        from slaq.bench.envelope import with_envelope

        report = with_envelope(report, run)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "—"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "s":
        return f"{value:.3g}s" if value < 100 else f"{value:.0f}s"
    if kind == "ms":
        return f"{1000 * value:.0f}ms"
    if kind == "rps":
        return f"{value:.2f}"
    if kind == "tok":
        return f"{value:,.0f}"
    return str(value)


TABLE_COLUMNS = (
    ("tier", None, ""),
    ("attain", "attainment", "pct"),
    ("TTFT p50", "ttft_p50_s", "s"),
    ("TTFT p99", "ttft_p99_s", "s"),
    ("TPOT p50", "tpot_p50_s", "ms"),
    ("TPOT p99", "tpot_p99_s", "ms"),
    ("goodput/s", "goodput_rps", "rps"),
    ("done", "completed_fraction", "pct"),
    ("max wait", "max_wait_s", "s"),
    ("fair", "jain_fairness", "rps"),
)


def _refused(figures: dict[str, Any]) -> str:
    """`3 refused by the sidecar (429 request_rate: 3), ` or nothing."""
    retried = f"{figures['client_retries']} client retries, " if figures.get("client_retries") else ""
    if not figures.get("refused"):
        return retried
    reasons = ", ".join(f"{reason}: {n}" for reason, n in figures["refusals"].items())
    return f"{retried}{figures['refused']} refused by the sidecar ({reasons}), "


def _swap(figures: dict[str, Any]) -> str:
    """`, KV swapped for 70 of 72 victims (recompute: 2; 0.4 s of host transfers)` or nothing."""
    swap = figures.get("kv_swap")
    if not swap:
        return ""
    refusals = "".join(f"{reason}: {n}; " for reason, n in swap["refusals"].items())
    return f", KV swapped for {swap['swapped_victims']} of {swap['victims']} victims ({refusals}{swap['transfer_s']:.2g} s of host transfers)"


def format_table(policies: dict[str, Any], *, title: str = "") -> str:
    """Policies side by side: one block per policy, one row per tier, plus the policy's totals."""
    rows: list[list[str]] = []
    baseline = policies.get("fcfs")
    if baseline is not None and "error" in baseline:
        baseline = None
    for name, figures in policies.items():
        if "error" in figures:
            rows.append([f"{name}: FAILED: {figures['error']}"])
            continue
        ratio = ""
        if baseline and name != "fcfs" and baseline["goodput_rps"] > 0:
            ratio = f"  goodput {figures['goodput_rps'] / baseline['goodput_rps']:.2f}x fcfs, throughput {figures['throughput_tok_s'] / baseline['throughput_tok_s']:.3f}x"
        rows.append([f"{name}: attainment {_fmt(figures['attainment'], 'pct')}, {figures['throughput_tok_s']:,.0f} tok/s, "
                     f"{figures['unfinished']} unfinished, {_refused(figures)}{figures['preemptions']} preemptions, "
                     f"recompute tax {_fmt(figures.get('recompute_tax'), 'pct')}{_swap(figures)}{ratio}"])
        for tier in Tier:
            tier_figures = figures["tiers"][tier.value]
            rows.append([f"  {tier.value}"] + [_fmt(tier_figures.get(key), kind) for _, key, kind in TABLE_COLUMNS[1:]])
    widths = [max([len(c[0]), *(len(r[i]) for r in rows if len(r) > 1)]) for i, c in enumerate(TABLE_COLUMNS)]
    header = "  ".join(c[0].rjust(w) if i else c[0].ljust(w) for i, (c, w) in enumerate(zip(TABLE_COLUMNS, widths)))
    lines = [title] if title else []
    lines.append(header)
    for row in rows:
        if len(row) == 1:
            lines.append(row[0])
        else:
            lines.append("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def sweep_table(sweep: Sequence[dict[str, Any]]) -> str:
    """Attainment per tier at each load, one row per policy: where each policy breaks."""
    names = list(sweep[0]["policies"]) if sweep else []
    lines = ["attainment (critical / standard / batch) by load"]
    lines.append("policy".ljust(10) + "".join(f"load {entry['load']:g}".rjust(22) for entry in sweep))
    for name in names:
        cells = []
        for entry in sweep:
            figures = entry["policies"][name]
            if "error" in figures:
                cells.append("failed".rjust(22))
                continue
            cells.append(" / ".join(f"{100 * figures['tiers'][t.value]['attainment']:.0f}" for t in Tier).rjust(22))
        lines.append(name.ljust(10) + "".join(cells))
    return "\n".join(lines)


def slo_capacity_table(found: dict[str, Any], targets: dict[str, float]) -> str:
    """One line per policy: its SLO capacity, as a multiple of stock `priority`'s when that ran."""
    goal = " and ".join(f"{tier} >= {target:g}" for tier, target in targets.items())
    reference = found.get("priority", {}).get("slo_capacity")
    lines = [f"SLO capacity (highest load with {goal}):", f"{'policy':<14} {'capacity':>9} {'x priority':>11}  loads probed"]
    for name, entry in found.items():
        capacity = entry["slo_capacity"]
        shown = f"{capacity:g}" + ("" if entry["bounded"] else "+")
        ratio = f"{capacity / reference:.2f}" if reference else "-"
        probes = " ".join(f"{p['load']:g}{'✓' if p['meets'] else '✗'}" for p in entry["probes"])
        lines.append(f"{name:<14} {shown:>9} {ratio:>11}  {probes}")
    return "\n".join(lines)
