"""Figures of `slaq bench cluster` runs (pure functions of a `ClusterResult`).

- `attainment`: the share of all requests (every tier has an objective) that finished within
  their tier's TTFT and mean-TPOT objectives; lost and refused requests count as missed;
- `replicas.mean`: the scale target's replica count (pods not being deleted, starting ones
  included) averaged over time from 0 to the end of the workload's last stage; `replicas.peak`
  its maximum;
- `gpu_hours`: every pod's GPUs from its creation to its end (cold start and drain included);
- `timeline`: every 15 s, the arrival rate of the stage, the replicas, ready and draining pods,
  the mean `slaq_sla_risk` of the last scrapes, and per tier the attainment of the requests that
  arrived in that window;
- with a failed pod, `failure`: what was lost (per tier) and, per tier, how long after the
  failure until the windows' attainment held at or above its level before the failure (the
  mean of the 120 s before it, capped at 0.95) for 60 s running.
"""

from __future__ import annotations

from typing import Any, Sequence

from slaq.api.common import Tier
from slaq.bench.cluster_sim import ClusterResult
from slaq.bench.cluster_workloads import ClusterWorkload
from slaq.bench.metrics import attained
from slaq.bench.simulator import RequestRecord

WINDOW_S = 15.0


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def replica_figures(scale_events: Sequence[dict[str, Any]], initial: int, until_s: float) -> dict[str, Any]:
    count, last_t, area, peak = initial, 0.0, 0.0, initial
    for event in scale_events:
        t = min(event["at_s"], until_s)
        area += count * (t - last_t)
        last_t, count = t, event["to"]
        peak = max(peak, count)
    area += count * max(0.0, until_s - last_t)
    return {"mean": round(area / until_s, 3) if until_s > 0 else float(initial), "peak": peak}


def _windows(records: Sequence[RequestRecord], workload: ClusterWorkload, lost: set[str], end_s: float) -> list[dict[str, Any]]:
    buckets: dict[int, dict[Tier, list[int]]] = {}
    for record in records:
        index = int(record.arrival_s // WINDOW_S)
        ok = record.request_id not in lost and attained(record, workload.objectives[record.tier])
        counts = buckets.setdefault(index, {}).setdefault(record.tier, [0, 0])
        counts[0] += ok
        counts[1] += 1
    rows = []
    for index in range(int(end_s // WINDOW_S) + 1):
        tiers = buckets.get(index, {})
        rows.append({t.value: _ratio(*tiers[t]) for t in Tier if t in tiers})
    return rows


def _recovery(windows: list[dict[str, Any]], fail_at_s: float) -> dict[str, float | None]:
    first_after = int(fail_at_s // WINDOW_S)
    before = windows[max(0, first_after - int(120 / WINDOW_S)):first_after]
    hold = int(60 / WINDOW_S)
    recovery: dict[str, float | None] = {}
    for tier in Tier:
        history = [w[tier.value] for w in before if w.get(tier.value) is not None]
        if not history:
            continue
        level = min(0.95, sum(history) / len(history))
        if level <= 0.0:
            recovery[tier.value] = None  # nothing attained before the failure: nothing to recover to
            continue
        after = [w.get(tier.value) for w in windows[first_after:]]
        recovered = None
        for start in range(len(after)):
            run = [v for v in after[start:start + hold] if v is not None]
            if run and all(v >= level for v in run):
                recovered = round(max(0.0, (first_after + start) * WINDOW_S - fail_at_s), 1)
                break
        recovery[tier.value] = recovered
    return recovery


def signal_figures(result: ClusterResult, workload: ClusterWorkload, initial_replicas: int, *, wall_s: float | None = None) -> dict[str, Any]:
    records = result.records
    lost = set(result.lost)
    objectives = workload.objectives
    good = [r for r in records if r.request_id not in lost and attained(r, objectives[r.tier])]
    tiers: dict[str, Any] = {}
    for tier in Tier:
        mine = [r for r in records if r.tier is tier]
        if not mine:
            continue
        tiers[tier.value] = {
            "requests": len(mine),
            "attainment": _ratio(sum(1 for r in mine if r.request_id not in lost and attained(r, objectives[tier])), len(mine)),
            "lost": sum(1 for r in mine if r.request_id in lost),
            "refused": sum(1 for r in mine if r.refused_status is not None),
        }
    workload_end = workload.stages[-1][1]
    windows = _windows(records, workload, lost, result.end_s)
    timeline = []
    for sample in result.timeline:
        index = int(sample["t_s"] // WINDOW_S)
        timeline.append({**sample, "rate_rps": workload.rate_at(sample["t_s"]),
                         "attainment": windows[index] if index < len(windows) else {}})
    lost_reasons: dict[str, int] = {}
    for why in result.lost.values():
        lost_reasons[why] = lost_reasons.get(why, 0) + 1
    figures: dict[str, Any] = {
        "requests": len(records),
        "attainment": _ratio(len(good), len(records)),
        "tiers": tiers,
        "replicas": replica_figures([e for e in result.scale_events if "replaced" not in e], initial_replicas, workload_end),
        "gpu_hours": round(result.gpu_seconds / 3600.0, 3),
        "scale_events": result.scale_events,
        "lost": {"total": len(result.lost), "by_reason": lost_reasons},
        "unfinished": sum(1 for r in records if not r.finished and r.request_id not in lost and r.refused_status is None),
        "pods": result.pods,
        "end_s": round(result.end_s, 3),
        "stop_reason": result.stop_reason,
        "timeline": timeline,
    }
    if result.failure is not None:
        figures["failure"] = {**result.failure, "recovery_s": _recovery(windows, result.failure["at_s"])}
    if wall_s is not None:
        figures["wall_s"] = round(wall_s, 1)
    return figures


def format_table(signals: dict[str, dict[str, Any]]) -> str:
    tiers = [t.value for t in Tier if any(t.value in f["tiers"] for f in signals.values())]
    head = f"{'signal':<12} {'attain':>7} " + " ".join(f"{t:>9}" for t in tiers) + f" {'repl.mean':>9} {'peak':>5} {'GPU-h':>7} {'events':>6} {'lost':>5} {'wall s':>7}"
    lines = [head]
    for name, f in signals.items():
        cells = " ".join(f"{f['tiers'][t]['attainment']:>9.3f}" if t in f["tiers"] else f"{'-':>9}" for t in tiers)
        lines.append(f"{name:<12} {f['attainment']:>7.3f} {cells} {f['replicas']['mean']:>9.2f} {f['replicas']['peak']:>5} "
                     f"{f['gpu_hours']:>7.2f} {len(f['scale_events']):>6} {f['lost']['total']:>5} {f.get('wall_s', 0):>7.0f}")
    return "\n".join(lines)
