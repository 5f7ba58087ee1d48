"""The `slaq bench sim` pipeline: workload, capacity, one simulation per policy and load, report."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from slaq.api.common import Tier
from slaq.bench.capacity import Capacity, measure_capacity
from slaq.bench.errors import PolicyUnavailable, WorkloadError
from slaq.bench.metrics import policy_figures
from slaq.bench.pod import PodConfig
from slaq.bench.policies import PolicySpec
from slaq.bench.pool_profile import PoolProfile
from slaq.bench.report import SCHEMA
from slaq.bench.runner import run_policy
from slaq.bench.simulator import ProgressCallback, RunResult
from slaq.bench.traces import TraceRow, densest_window, read_trace, trace_attribution
from slaq.bench.workload import (
    DEFAULT_MIX,
    DEFAULT_OBJECTIVES,
    SYNTHETIC_SHAPES,
    SYNTHETIC_WORKLOADS,
    BenchRequest,
    BurstSpec,
    TierObjectives,
    assign_tenants,
    poisson_rows,
    scale_to_rate,
    with_bursts,
)


@dataclass
class WorkloadSpec:
    trace: Path | None = None
    requests: int = 1500
    arrivals: str = "trace"  # or "poisson"
    window_s: float | None = None
    seed: int = 1
    mix: dict[Tier, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    tenants_per_tier: int = 3
    objectives: dict[Tier, TierObjectives] = field(default_factory=lambda: dict(DEFAULT_OBJECTIVES))
    bursts: BurstSpec | None = None  # applied after scaling to the target rate (periods in real seconds)
    # A synthetic workload of our own by name (`SYNTHETIC_WORKLOADS`, `--workload`), in place of a trace;
    # its prompts are bounded by the profile's context, `max_model_len`.
    generator: str | None = None
    max_model_len: int | None = None
    # Mean rate of the whole trace when the workload is a window of it (see scale_to_rate).
    reference_rate: float | None = field(default=None, init=False)

    def rows(self) -> list[TraceRow]:
        if self.requests < 2:
            raise WorkloadError(f"--requests must be >= 2, got {self.requests}")
        if self.generator is not None:
            return self._generated()
        if self.trace is None:
            if self.arrivals != "poisson":
                raise WorkloadError("without --trace the arrivals are synthetic: use --arrivals poisson")
            return poisson_rows(self.requests, seed=self.seed)
        if self.window_s is not None:
            whole = read_trace(self.trace)
            if len(whole) < 2 or whole[-1].arrival_s <= 0:
                raise WorkloadError(f"{self.trace}: too few requests to cut a window from")
            self.reference_rate = (len(whole) - 1) / whole[-1].arrival_s
            rows = densest_window(whole, self.window_s)[: self.requests]
        else:
            rows = read_trace(self.trace, limit=self.requests)
        if self.arrivals == "poisson":
            return poisson_rows(len(rows), seed=self.seed, lengths=rows)
        if self.arrivals != "trace":
            raise WorkloadError(f"--arrivals must be trace or poisson, got {self.arrivals!r}")
        return rows

    def _generated(self) -> list[TraceRow]:
        generate = SYNTHETIC_WORKLOADS.get(self.generator or "")
        if generate is None:
            raise WorkloadError(f"unknown workload {self.generator!r} (one of: {', '.join(SYNTHETIC_WORKLOADS)})")
        if self.trace is not None or self.window_s is not None or self.arrivals != "poisson":
            raise WorkloadError(f"--workload {self.generator} has its own lengths and Poisson arrivals: drop --trace, --window, --arrivals trace")
        if self.max_model_len is None:
            raise WorkloadError(f"--workload {self.generator} needs the profile's max_model_len (--profile)")
        return generate(self.requests, seed=self.seed, max_model_len=self.max_model_len)

    def build(self) -> list[BenchRequest]:
        return assign_tenants(self.rows(), seed=self.seed, mix=self.mix, tenants_per_tier=self.tenants_per_tier)

    def at_rate(self, requests: Sequence[BenchRequest], rate_rps: float) -> list[BenchRequest]:
        """The workload's arrivals scaled to `rate_rps`, then modulated by its bursts (if any)."""
        return with_bursts(scale_to_rate(requests, rate_rps, reference_rate=self.reference_rate), self.bursts)

    def describe(self, requests: Sequence[BenchRequest]) -> dict[str, Any]:
        return {
            "trace": str(self.trace) if self.trace else None,
            "trace_attribution": trace_attribution(self.trace) if self.trace else None,
            # A synthetic workload of our own (`--workload`): its name and the parameters of its lengths.
            "generator": None if self.generator is None else {"name": self.generator, "max_model_len": self.max_model_len,
                                                              **SYNTHETIC_SHAPES[self.generator].describe()},
            "arrivals": self.arrivals,
            "window_s": self.window_s,
            "bursts": None if self.bursts is None else {"factor": self.bursts.factor, "period_s": self.bursts.period_s,
                                                        "burst_s": round(self.bursts.burst_s, 6)},
            # A window's arrival rate over the whole trace's: how much denser the slice is.
            "window_density": None if self.reference_rate is None or len(requests) < 2
            else round((len(requests) - 1) / max(requests[-1].arrival_s - requests[0].arrival_s, 1e-9) / self.reference_rate, 4),
            "requests": len(requests),
            "seed": self.seed,
            "mix": {t.value: round(v, 6) for t, v in self.mix.items()},
            "tenants_per_tier": self.tenants_per_tier,
            "objectives": {t.value: {"ttft_s": o.ttft_s, "tpot_s": o.tpot_s} for t, o in self.objectives.items()},
            "prompt_tokens_mean": round(sum(r.prompt_tokens for r in requests) / len(requests), 3),
            "output_tokens_mean": round(sum(r.output_tokens for r in requests) / len(requests), 3),
            **_prompt_quantiles(requests),
        }


def _prompt_quantiles(requests: Sequence[BenchRequest]) -> dict[str, int]:
    prompts = sorted(r.prompt_tokens for r in requests)
    return {"prompt_tokens_p50": prompts[len(prompts) // 2], "prompt_tokens_p99": prompts[min(len(prompts) - 1, (99 * len(prompts)) // 100)],
            "prompt_tokens_max": prompts[-1]}


KV_SWAP_MODES = ("on", "off", "both")
NO_SWAP_SUFFIX = "-noswap"


def swap_variants(policies: Sequence[PolicySpec], mode: str) -> list[tuple[PolicySpec, bool]]:
    """(policy, KV swap on) runs for `--kv-swap` `mode`: with `both`, a policy whose engine ships
    slaq's KV connector runs twice, the second time named `<name>-noswap` and recomputing its victims."""
    if mode not in KV_SWAP_MODES:
        raise WorkloadError(f"--kv-swap must be one of {', '.join(KV_SWAP_MODES)}, got {mode!r}")
    runs: list[tuple[PolicySpec, bool]] = []
    for spec in policies:
        runs.append((spec, mode != "off"))
        if mode == "both" and spec.ships_kv_connector:
            runs.append((replace(spec, name=spec.name + NO_SWAP_SUFFIX), False))
    return runs


RunObserver = Callable[[PolicySpec, float], ProgressCallback | None]
RunDone = Callable[[PolicySpec, float, dict[str, Any]], None]


def run_benchmark(workload: WorkloadSpec, profile: PoolProfile, policies: Sequence[PolicySpec], loads: Sequence[float], *,
                  capacity_rps: float | None = None, max_drain_s: float = 1800.0,
                  on_start: RunObserver | None = None, on_done: RunDone | None = None,
                  keep_results: list[tuple[float, RunResult]] | None = None, pod: PodConfig | None = None,
                  kv_swap: str = "on") -> dict[str, Any]:
    """Every policy at every load; the report (single load: top-level `policies`; several: `sweep`).
    With `pod`, the policies whose pod ships the sidecar run behind its real core (`slaq.bench.pod`);
    `kv_swap` (on, off, both: see `swap_variants`) for those whose engine ships slaq's KV connector."""
    runs = swap_variants(policies, kv_swap)
    if not loads or any(not (x > 0) for x in loads):
        raise WorkloadError(f"loads must be positive numbers, got {list(loads)}")
    requests = workload.build()
    capacity = _capacity(requests, profile, workload, capacity_rps)
    report = _report_head(workload, requests, profile, capacity, pod, kv_swap)
    entries = []
    for load in loads:
        rate = load * capacity.requests_per_s
        scaled = workload.at_rate(requests, rate)
        results: dict[str, Any] = {}
        for spec, swap in runs:
            progress = on_start(spec, load) if on_start else None
            try:
                result = run_policy(spec, scaled, profile, workload.objectives, max_drain_s=max_drain_s, progress=progress, pod=pod,
                                    kv_swap=swap)
            except PolicyUnavailable:
                raise
            except Exception as exc:  # a scheduler that crashes is a result: report it, run the others
                figures = {"scheduler": spec.summary, "error": f"{type(exc).__name__}: {exc}",
                           "error_at": "".join(traceback.format_exception(exc)[-3:]).strip()}
                results[spec.name] = figures
                if on_done:
                    on_done(spec, load, figures)
                continue
            figures = policy_figures(result, workload.objectives)
            figures["scheduler"] = spec.summary
            results[spec.name] = figures
            if keep_results is not None:
                keep_results.append((load, result))
            if on_done:
                on_done(spec, load, figures)
        entries.append({"load": load, "rate_rps": round(rate, 6), "policies": results})
    if len(entries) == 1:
        report.update(entries[0])
    else:
        report["sweep"] = entries
    return report



def _capacity(requests: Sequence[BenchRequest], profile: PoolProfile, workload: WorkloadSpec, capacity_rps: float | None) -> Capacity:
    if capacity_rps is None:
        return measure_capacity(requests, profile, workload.objectives)
    if not capacity_rps > 0:
        raise WorkloadError(f"--capacity-rps must be positive, got {capacity_rps}")
    return Capacity(capacity_rps, float("nan"), method="given on the command line")


def _report_head(workload: WorkloadSpec, requests: Sequence[BenchRequest], profile: PoolProfile, capacity: Capacity,
                 pod: PodConfig | None, kv_swap: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        # engine: every policy drives the engine scheduler alone; pod: as the pod ships (see slaq.bench.pod)
        "mode": "pod" if pod is not None else "engine",
        "pod": None if pod is None else pod.describe(),
        "kv_swap": kv_swap,  # per policy, `kv_swap` holds what its connector moved (null: no swap)
        "workload": workload.describe(requests),
        "profile": {"name": profile.name, **profile.model_dump(mode="json", exclude={"name"}), "num_gpu_blocks": profile.num_gpu_blocks},
        "capacity": {
            "requests_per_s": round(capacity.requests_per_s, 6),
            "output_tokens_per_s": None if capacity.output_tokens_per_s != capacity.output_tokens_per_s else round(capacity.output_tokens_per_s, 3),
            "method": capacity.method,
        },
    }


ProbeDone = Callable[[str, float, dict[str, float]], None]


def run_slo_capacity(workload: WorkloadSpec, profile: PoolProfile, policies: Sequence[PolicySpec], *,
                     capacity_rps: float | None = None, max_drain_s: float = 1800.0, pod: PodConfig | None = None,
                     kv_swap: str = "on", resolution: float = 0.1, on_probe: ProbeDone | None = None) -> dict[str, Any]:
    """Each policy's SLO capacity (`slaq.bench.slo_capacity.search`): the report's `slo_capacity`
    holds, per policy, the highest load meeting the targets and every load probed."""
    from slaq.bench.slo_capacity import DEFAULT_TARGETS, search

    requests = workload.build()
    capacity = _capacity(requests, profile, workload, capacity_rps)
    report = _report_head(workload, requests, profile, capacity, pod, kv_swap)
    found: dict[str, Any] = {}
    for spec, swap in swap_variants(policies, kv_swap):
        def probe(load: float, spec: PolicySpec = spec, swap: bool = swap) -> dict[str, float]:
            scaled = workload.at_rate(requests, load * capacity.requests_per_s)
            result = run_policy(spec, scaled, profile, workload.objectives, max_drain_s=max_drain_s, pod=pod, kv_swap=swap)
            tiers = policy_figures(result, workload.objectives)["tiers"]
            attainment = {tier: figures["attainment"] for tier, figures in tiers.items()}
            if on_probe:
                on_probe(spec.name, load, attainment)
            return attainment

        found[spec.name] = search(probe, resolution=resolution).describe()
    report["slo_targets"] = {tier.value: target for tier, target in DEFAULT_TARGETS.items()}
    report["slo_capacity"] = found
    return report
