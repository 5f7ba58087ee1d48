"""PNG plots of a report: TTFT CDF per tier per policy (one file per load), attainment vs load."""

from __future__ import annotations

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
