"""What `slaq up --demo` prints and writes: per-tenant figures, the scenario-4.5 block, the JSON, the PNG.

Pure functions of the measured outcomes (no processes, no HTTP), so each is tested alone.
TTFTs are reported two ways: as the client saw them (the load generator, a process at the
lowest CPU priority), and as the sidecar measured them (`slaq_ttft_seconds`, arrival at the
sidecar to the first byte back; read from its histogram, so its percentiles are interpolated
within buckets). Stock vLLM has no sidecar, so it has only the client's figures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from slaq.bench.metrics import percentile
from slaq.local.loadgen import Outcome
from slaq.local.scenario45 import REPORT_ANSWER, REPORT_ORDER, ScenarioRun

Buckets = list[tuple[float, float]]  # cumulative (upper bound, count), +inf last


@dataclass
class TenantFigures:
    """One tenant's requests in one loaded run."""

    objective_s: float | None
    outcomes: list[Outcome] = field(default_factory=list)
    sidecar_buckets: Buckets | None = None  # None: no sidecar in this system

    @property
    def sent(self) -> int:
        return len(self.outcomes)

    @property
    def done(self) -> int:
        return sum(o.finished for o in self.outcomes)

    @property
    def refused(self) -> int:
        return sum(o.status is not None and o.status != 200 for o in self.outcomes)

    @property
    def ttfts_s(self) -> list[float]:
        return [o.ttft_s for o in self.outcomes if o.ttft_s is not None]

    @property
    def attainment(self) -> float | None:
        """Finished with the first token within the objective, over all sent (a refusal is a miss); None without an objective."""
        if self.objective_s is None or not self.outcomes:
            return None
        met = sum(o.finished and o.ttft_s is not None and o.ttft_s <= self.objective_s for o in self.outcomes)
        return met / len(self.outcomes)

    def ttft_ms(self, pct: float) -> float | None:
        return _ms(percentile(self.ttfts_s, pct))

    def sidecar_ttft_ms(self, pct: float) -> float | None:
        return None if self.sidecar_buckets is None else _ms(histogram_quantile(pct / 100.0, self.sidecar_buckets))

    def client_late_ms(self, pct: float) -> float | None:
        return late_ms(self.outcomes, pct)

    def as_json(self) -> dict[str, Any]:
        return {"attainment": self.attainment, "objective_ms": _ms(self.objective_s),
                "ttft_p50_ms": self.ttft_ms(50), "ttft_p90_ms": self.ttft_ms(90), "ttft_p99_ms": self.ttft_ms(99),
                "sidecar_ttft_p50_ms": self.sidecar_ttft_ms(50), "sidecar_ttft_p99_ms": self.sidecar_ttft_ms(99),
                "client_late_p99_ms": self.client_late_ms(99), "done": self.done, "sent": self.sent, "refused": self.refused}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


# ---------------------------------------------------------------- the sidecar's histogram


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket holding the q-th observation."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # beyond the last finite bucket: its bound is all that is known
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return buckets[-1][0]


def buckets_by_label(metrics_text: str, family: str, label: str) -> dict[str, Buckets]:
    """A histogram's cumulative buckets, one list per value of `label`, from Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Buckets] = {}
    for metric in text_string_to_metric_families(metrics_text):
        if metric.name != family:
            continue
        for sample in metric.samples:
            if sample.name == family + "_bucket":
                out.setdefault(sample.labels[label], []).append((float(sample.labels["le"]), sample.value))
    return {key: sorted(values) for key, values in out.items()}


def bucket_delta(after: Buckets, before: Buckets | None) -> Buckets:
    """The observations between two readings of one cumulative histogram."""
    earlier = dict(before or [])
    return [(bound, count - earlier.get(bound, 0.0)) for bound, count in after]


# ---------------------------------------------------------------- text


def _cell(value: float | None, width: int, fmt: str = "{:.0f}") -> str:
    return f"{'—' if value is None else fmt.format(value):>{width}}"


def load_table(runs: Mapping[str, Mapping[str, TenantFigures]], labels: Mapping[str, str]) -> str:
    """Per tenant, per system: client TTFT p50/p99, the sidecar's p99, SLO met, done/sent."""
    names = list(runs)
    head1 = f"{'tenant':<14} {'objective':>9} │ " + " │ ".join(f"{n:^40}" for n in names)
    head2 = f"{'':<14} {'TTFT ms':>9} │ " + " │ ".join(f"{'p50':>6} {'p99':>6} {'sc p99':>7} {'SLO met':>8} {'done':>9}" for _ in names)
    lines = [head1, head2, "─" * len(head2)]
    for letter, label in labels.items():
        first = runs[names[0]][letter]
        cells = []
        for name in names:
            row = runs[name][letter]
            met = "no SLO" if row.attainment is None else f"{100 * row.attainment:.0f}%"
            cells.append(f"{_cell(row.ttft_ms(50), 6)} {_cell(row.ttft_ms(99), 6)} {_cell(row.sidecar_ttft_ms(99), 7)} "
                         f"{met:>8} {f'{row.done}/{row.sent}':>9}")
        lines.append(f"{label:<14} {_cell(_ms(first.objective_s), 9)} │ " + " │ ".join(cells))
    return "\n".join(lines)


def late_ms(outcomes: Iterable[Outcome], pct: float) -> float | None:
    """How late the client sent these requests against the plan (its own wait for the CPU), in ms."""
    return _ms(percentile([o.late_s for o in outcomes], pct))


def client_late_ms(rows: Mapping[str, TenantFigures], pct: float = 99) -> float:
    """`late_ms` over one system's requests, all tenants."""
    return late_ms((o for row in rows.values() for o in row.outcomes), pct) or 0.0


def refusal_lines(runs: Mapping[str, Mapping[str, TenantFigures]]) -> str:
    """Requests refused with an HTTP status, per system and tenant ("" when none was)."""
    lines = []
    for system, rows in runs.items():
        for letter, row in rows.items():
            codes = sorted({o.status for o in row.outcomes if o.status is not None and o.status != 200})
            if codes:
                lines.append(f"  {system}: {row.refused} of {letter}'s {row.sent} requests refused (HTTP {', '.join(map(str, codes))})")
    return "\n".join(lines)


# ---------------------------------------------------------------- the handover (the sidecar's access log)

PIPE_GROUPS = ((0, 2), (3, 7), (8, None))  # requests released ahead and not started: few, some, many


def access_records(lines: Iterable[str], since_epoch_s: float) -> list[dict[str, Any]]:
    """The sidecar's access lines (`event` request) for requests that arrived at or after `since_epoch_s`."""
    from datetime import datetime

    out = []
    for line in lines:
        if not line.startswith("{") or '"event":"request"' not in line:
            continue
        try:
            record = json.loads(line)
            if datetime.fromisoformat(record["time"].replace("Z", "+00:00")).timestamp() >= since_epoch_s:
                out.append(record)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def handover_figures(records: Iterable[Mapping[str, Any]], tier_labels: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Release → the engine's first byte (`handover_s`) by tier label, p50 / p90 in ms, and the VIP-style
    breakdown by the pipe ahead at release (`pipe_ahead`) for every tier."""
    out: dict[str, dict[str, Any]] = {}
    for tier, label in tier_labels.items():
        rows = [(r["handover_s"], r.get("pipe_ahead") or 0) for r in records if r.get("tier") == tier and r.get("handover_s") is not None]
        by_pipe = {}
        for low, high in PIPE_GROUPS:
            values = [h for h, ahead in rows if ahead >= low and (high is None or ahead <= high)]
            by_pipe[f"{low}-{high}" if high is not None else f"{low}+"] = {"n": len(values), "p50_ms": _ms(percentile(values, 50)),
                                                                              "p90_ms": _ms(percentile(values, 90))}
        values = [h for h, _ in rows]
        out[label] = {"n": len(values), "p50_ms": _ms(percentile(values, 50)), "p90_ms": _ms(percentile(values, 90)),
                      "pipe_ahead_max": max((a for _, a in rows), default=None), "by_pipe_ahead": by_pipe}
    return out


def handover_lines(figures: Mapping[str, Mapping[str, Any]]) -> str:
    lines = ["  the handover under slaq (release to the engine → its first byte, from the sidecar's access log; "
             "p50 / p90 ms (n), and by the requests released ahead and not yet started):"]
    for label, row in figures.items():
        pipes = "  ".join(f"{group} ahead: {_cell(g['p50_ms'], 0)} / {_cell(g['p90_ms'], 0)} ({g['n']})"
                          for group, g in row["by_pipe_ahead"].items() if g["n"])
        lines.append(f"    {label:<13} {_cell(row['p50_ms'], 0)} / {_cell(row['p90_ms'], 0)} ({row['n']}); most ahead "
                     f"{row['pipe_ahead_max']}; {pipes}")
    return "\n".join(lines)


def scenario_block(runs: Sequence[ScenarioRun]) -> str:
    lines = [f"  {'system':<23} {'started':<11} {'TTFT ms: A':>10} {'B':>6} {'C':>6}   report's answer"]
    for run in runs:
        ttfts = " ".join(_cell(run.ttft_ms(x), 6) for x in "ABC")
        unfinished = [x for x in "ABC" if not run.finished(x)]
        note = f"  (not finished: {', '.join(unfinished)})" if unfinished else ""
        lines.append(f"  {SYSTEM_NAMES[run.system]:<23} {order_text(run.groups):<11} {ttfts:>24}   "
                     f"{', '.join(REPORT_ORDER[run.system])}: {REPORT_ANSWER[run.system]}{note}")
    return "\n".join(lines)


def order_text(groups: Sequence[Sequence[str]]) -> str:
    """`A, [B C]`: brackets hold requests whose first tokens came back together."""
    return ", ".join(group[0] if len(group) == 1 else "[" + " ".join(group) + "]" for group in groups)


SYSTEM_NAMES = {"fcfs": "stock vLLM, FCFS", "priority": "stock vLLM, priority", "slaq": "slaq (sidecar + engine)"}


# ---------------------------------------------------------------- files


def demo_json(scenario: Sequence[ScenarioRun], load: Mapping[str, Mapping[str, TenantFigures]],
              extra: Mapping[str, Any]) -> dict[str, Any]:
    return {"scenario_45": {run.system: run.as_json() for run in scenario},
            "load": {system: {letter: row.as_json() for letter, row in rows.items()} for system, rows in load.items()},
            **extra}


def write_json(report: Mapping[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return path


def write_png(load: Mapping[str, Mapping[str, TenantFigures]], tiers: Mapping[str, str], path: Path, title: str) -> Path:
    """TTFT CDF per tenant (one panel per tier), one line per system, objectives dashed (the bench's plot)."""
    from slaq.bench.plots import ttft_cdf

    ttfts = {system: {tiers[letter]: row.ttfts_s for letter, row in rows.items()} for system, rows in load.items()}
    first = next(iter(load.values()))
    objectives = {tiers[letter]: row.objective_s for letter, row in first.items()}
    return ttft_cdf(ttfts, objectives, path, title)
