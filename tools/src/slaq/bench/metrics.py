"""Per-policy, per-tier figures from a simulation's request records (pure functions).

Conventions: a request that never got its first token has TTFT +inf (a percentile that lands
on it is reported as null); TPOT is the mean time per output token after the first; a request
attains its SLO when it finished and met both its TTFT and its mean-TPOT objective; queue
wait is first scheduled minus arrival (never scheduled: simulation end minus arrival, a lower
bound). Goodput and throughput are over the run's makespan (first arrival to last token).
The recompute tax is the tokens computed a second time because a preemption threw their KV
away, as a share of all the workload's prompt tokens; KV swapped to host memory and loaded back
(`swapped_in_tokens`, slaq's KV connector) is not recomputed and not counted in it.

With `--pod`, a request the sidecar refused for good (quota 429, shedding 503, ... after the
client's retries) counts as not attained and not completed, and is counted under `refused` with
its reasons, apart from `unfinished`; its wait is left out of the wait figures. `client_retries`
counts the refusals that were retried. `sidecar_wait_*` is release to the engine minus arrival.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Iterable, Sequence

from slaq.api.common import Tier
from slaq.bench.simulator import RequestRecord, RunResult
from slaq.bench.workload import TierObjectives

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile; None for an empty list or a value that is +inf."""
    if not values:
        return None
    ordered = sorted(values)
    value = ordered[max(0, math.ceil(pct / 100.0 * len(ordered)) - 1)]
    return None if math.isinf(value) else round(value, 6)


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index (1.0: all equal); 1.0 for no values or all zeros."""
    xs = list(values)
    square_sum = sum(x * x for x in xs)
    if not xs or square_sum == 0:
        return 1.0
    return round(sum(xs) ** 2 / (len(xs) * square_sum), 6)


def attained(record: RequestRecord, goal: TierObjectives) -> bool:
    return record.finished and record.ttft_s is not None and goal.met(record.ttft_s, record.tpot_s or 0.0)


def _ratio(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 1.0


def group_figures(records: Sequence[RequestRecord], objectives: dict[Tier, TierObjectives],
                  makespan_s: float, end_s: float) -> dict[str, Any]:
    count = len(records)
    ttft = [r.ttft_s if r.ttft_s is not None else math.inf for r in records]
    tpot = [r.tpot_s if r.finished and r.tpot_s is not None else math.inf for r in records]
    waits = [r.queue_wait_s if r.queue_wait_s is not None else end_s - r.arrival_s for r in records if r.refused_reason is None]
    sidecar_waits = [r.sidecar_wait_s for r in records if r.sidecar_wait_s is not None]
    refusals: dict[str, int] = defaultdict(int)
    for record in records:
        if record.refused_reason is not None:
            refusals[f"{record.refused_status} {record.refused_reason}"] += 1
    good = [r for r in records if attained(r, objectives[r.tier])]
    ttft_ok = sum(1 for r in records if r.ttft_s is not None and (objectives[r.tier].ttft_s is None or r.ttft_s <= objectives[r.tier].ttft_s))
    tpot_ok = sum(1 for r in records if r.finished and (objectives[r.tier].tpot_s is None or (r.tpot_s or 0.0) <= objectives[r.tier].tpot_s))
    figures: dict[str, Any] = {"requests": count}
    for pct in PERCENTILES:
        figures[f"ttft_p{pct}_s"] = percentile(ttft, pct)
    for pct in PERCENTILES:
        figures[f"tpot_p{pct}_s"] = percentile(tpot, pct)
    span = makespan_s if makespan_s > 0 else math.inf
    figures.update(
        attainment=_ratio(len(good), count),
        ttft_attainment=_ratio(ttft_ok, count),
        tpot_attainment=_ratio(tpot_ok, count),
        goodput_rps=round(len(good) / span, 6),
        throughput_tok_s=round(sum(r.tokens_out for r in records) / span, 3),
        max_wait_s=round(max(waits), 6) if waits else None,
        wait_p99_s=percentile(waits, 99),
        completed_fraction=_ratio(sum(r.finished for r in records), count),
        refused=sum(refusals.values()),
        refusals=dict(sorted(refusals.items())),
        client_retries=sum(r.client_retries for r in records),
        sidecar_wait_p50_s=percentile(sidecar_waits, 50),
        sidecar_wait_p99_s=percentile(sidecar_waits, 99),
        preemptions=sum(r.preemptions for r in records),
        recomputed_tokens=sum(r.recomputed_tokens for r in records),
        swapped_in_tokens=sum(r.swapped_in_tokens for r in records),
        recompute_tax=recompute_tax(records),
    )
    return figures


def recompute_tax(records: Sequence[RequestRecord]) -> float:
    """Tokens recomputed after preemptions / prompt tokens of all requests (0 with no prompts)."""
    prompts = sum(r.prompt_tokens for r in records)
    return round(sum(r.recomputed_tokens for r in records) / prompts, 6) if prompts else 0.0


def policy_figures(result: RunResult, objectives: dict[Tier, TierObjectives]) -> dict[str, Any]:
    records = result.records
    end_s = result.end_s
    by_tier: dict[Tier, list[RequestRecord]] = defaultdict(list)
    for record in records:
        by_tier[record.tier].append(record)
    tiers: dict[str, Any] = {}
    for tier in Tier:
        group = by_tier.get(tier, [])
        figures = group_figures(group, objectives, result.makespan_s, end_s)
        by_tenant: dict[str, list[RequestRecord]] = defaultdict(list)
        for record in group:
            by_tenant[record.tenant].append(record)
        tenant_attainment = {
            tenant: _ratio(sum(attained(r, objectives[tier]) for r in rs), len(rs)) for tenant, rs in sorted(by_tenant.items())
        }
        figures["tenants"] = tenant_attainment
        figures["jain_fairness"] = jain_index(tenant_attainment.values())
        if not result.sees_kv:
            figures["recomputed_tokens"] = figures["recompute_tax"] = None
        tiers[tier.value] = figures
    overall = group_figures(records, objectives, result.makespan_s, end_s)
    expected = sum(r.output_tokens for r in records)
    delivered = sum(r.tokens_out for r in records)
    overhead_ms = [s * 1000.0 for s in result.overhead_s]
    return {
        "requests": overall["requests"],
        "attainment": overall["attainment"],
        "goodput_rps": overall["goodput_rps"],
        "throughput_tok_s": overall["throughput_tok_s"],
        "completed_fraction": overall["completed_fraction"],
        "unfinished": sum(not r.finished and r.refused_reason is None for r in records),
        "refused": overall["refused"],
        "refusals": overall["refusals"],
        "client_retries": overall["client_retries"],
        "behind_sidecar": result.behind_sidecar,
        "preemptions": overall["preemptions"],
        "recomputed_tokens": overall["recomputed_tokens"] if result.sees_kv else None,
        "recompute_tax": overall["recompute_tax"] if result.sees_kv else None,
        "kv_swap": result.kv_swap,
        "makespan_s": round(result.makespan_s, 6),
        "steps": result.steps,
        "gpu_busy_fraction": round(result.busy_s / result.makespan_s, 6) if result.makespan_s > 0 else 0.0,
        "stop_reason": result.stop_reason,
        "tokens": {"expected_output": expected, "delivered_output": delivered, "undelivered_output": expected - delivered},
        "tiers": tiers,
        # Wall-clock time of schedule() + update_from_output() on this machine: the only
        # figures in the report that differ between two runs with the same seed.
        "scheduler_overhead_ms": {
            "mean": round(statistics.fmean(overhead_ms), 4) if overhead_ms else None,
            "p50": percentile(overhead_ms, 50),
            "p99": percentile(overhead_ms, 99),
            "max": round(max(overhead_ms), 4) if overhead_ms else None,
        },
    }


WALL_CLOCK_KEYS = ("scheduler_overhead_ms",)
