"""PNG plots of a report: TTFT CDF per tier per policy (one file per load), attainment vs load, and a
`slaq bench cluster` report's timeline:

    python -m slaq.bench.plots cluster-timeline docs/results/cluster-wva-ramp.json --out timeline.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from slaq.api.common import Tier


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ttft_cdf(ttfts: Mapping[str, Mapping[str, Sequence[float]]], objectives: Mapping[str, float | None],
             path: Path, title: str) -> Path:
    """`ttfts[policy][tier]`: TTFTs of the requests that got a first token."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(Tier), figsize=(5 * len(Tier), 4), squeeze=False)
    for ax, tier in zip(axes[0], Tier):
        for policy, by_tier in ttfts.items():
            values = sorted(by_tier.get(tier.value, ()))
            if values:
                ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=policy)
        goal = objectives.get(tier.value)
        if goal:
            ax.axvline(goal, color="grey", linestyle="--", linewidth=1, label="objective")
        ax.set_xscale("log")
        ax.set_title(f"{tier.value}")
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def attainment_vs_load(sweep: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    plt = _pyplot()
    names = list(sweep[0]["policies"]) if sweep else []
    fig, axes = plt.subplots(1, len(Tier), figsize=(5 * len(Tier), 4), squeeze=False)
    for ax, tier in zip(axes[0], Tier):
        for name in names:
            points = [(entry["load"], entry["policies"][name]["tiers"][tier.value]["attainment"])
                      for entry in sweep if "error" not in entry["policies"][name]]
            if points:
                ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
        ax.set_title(tier.value)
        ax.set_xlabel("load (x measured capacity)")
        ax.set_ylabel("SLO attainment")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cluster_timeline(report: Mapping[str, Any], path: Path, title: str | None = None) -> Path:
    """A `slaq bench cluster` report over time, one line per signal: the offered load, the replicas
    (the scale target's count), the mean per-pod signals the slaq pods export, and each tier's
    attainment of the requests that arrived in each 15 s window."""
    plt = _pyplot()
    signals = report["signals"]
    tiers = [t.value for t in Tier if any(t.value in f["tiers"] for f in signals.values())]
    fig, axes = plt.subplots(3 + len(tiers), 1, figsize=(11, 2.2 * (3 + len(tiers))), sharex=True, squeeze=False)
    axes = [row[0] for row in axes]
    first = next(iter(signals.values()))["timeline"]
    axes[0].step([p["t_s"] for p in first], [p["rate_rps"] for p in first], where="post", color="black")
    axes[0].set_ylabel("offered req/s")
    for name, figures in signals.items():
        points = figures["timeline"]
        t = [p["t_s"] for p in points]
        axes[1].step(t, [p["replicas"] for p in points], where="post", label=f"{name} ({figures['replicas']['mean']:.2f} mean)")
        loads = [(p["t_s"], p.get("mean_protected_load")) for p in points if p.get("mean_protected_load") is not None]
        if loads:
            axes[2].plot([x for x, _ in loads], [y for _, y in loads], label=f"{name}: slaq_protected_load")
        for ax, tier in zip(axes[3:], tiers):
            window = [(p["t_s"], p["attainment"].get(tier)) for p in points if p["attainment"].get(tier) is not None]
            ax.plot([x for x, _ in window], [y for _, y in window], label=name)
    axes[1].set_ylabel("replicas")
    axes[2].set_ylabel("mean per pod")
    axes[2].set_yscale("symlog", linthresh=1.0)
    for ax, tier in zip(axes[3:], tiers):
        ax.set_ylabel(f"{tier} attained")
        ax.set_ylim(-0.02, 1.02)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("simulated time (s)")
    workload = report["workload"]
    fig.suptitle(title or f"slaq bench cluster: {workload['name']} (simulated), router {report['router']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slaq.bench.plots", description="Plot a benchmark report.")
    commands = parser.add_subparsers(dest="command", required=True)
    timeline = commands.add_parser("cluster-timeline", help="a `slaq bench cluster --out` report over time")
    timeline.add_argument("report", type=Path)
    timeline.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    try:
        report = json.loads(args.report.read_text(encoding="utf-8"))
        signals = report["signals"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        print(f"error: {args.report} is not a `slaq bench cluster` report ({exc})", file=sys.stderr)
        return 2
    if not signals:
        print(f"error: {args.report} holds no signal", file=sys.stderr)
        return 2
    print(cluster_timeline(report, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
