"""Named workloads of `slaq bench cluster`.

- `wva-ramp`: llm-d workload-variant-autoscaler's published benchmark: inference-perf's
  "prefill-heavy" shape (4,000 prompt tokens, 1,000 output tokens, streaming) at 2, 4, 6, 8, 10,
  4 and 1 requests/s held for 330, 360, 360, 360, 360, 360 and 300 s (12,480 requests expected),
  one class with TTFT <= 3 s and TPOT <= 100 ms. Arrivals are a Poisson process at each stage's
  rate (seeded); llm-d ran it on Qwen3-32B with TP=2 on H100s (profile `h100x2-qwen3-32b`).
- `wva-ramp-tiers`: the same arrivals, each request given a tier by slaq's default mix (10 %
  critical, 30 % standard, 60 % batch) with the default objectives (critical 0.5 s + 50 ms,
  standard 2 s + 100 ms, batch 60 s TTFT).

`time_scale` shortens every hold (0.1: a tenth of the ramp, same rates) for quick runs and tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from slaq.api.common import Tier
from slaq.bench.errors import WorkloadError
from slaq.bench.traces import TraceRow
from slaq.bench.workload import DEFAULT_MIX, DEFAULT_OBJECTIVES, PREFILL_HEAVY, BenchRequest, TierObjectives, assign_tenants

WVA_RATES_RPS = (2.0, 4.0, 6.0, 8.0, 10.0, 4.0, 1.0)
WVA_HOLDS_S = (330.0, 360.0, 360.0, 360.0, 360.0, 360.0, 300.0)
WVA_PROMPT_TOKENS = PREFILL_HEAVY.prompt_tokens  # 4,000
WVA_OUTPUT_TOKENS = PREFILL_HEAVY.output_tokens  # 1,000
WVA_OBJECTIVES = TierObjectives(ttft_s=3.0, tpot_s=0.100)
WVA_PROFILE = "h100x2-qwen3-32b"
WORKLOADS = ("wva-ramp", "wva-ramp-tiers")


@dataclass(frozen=True)
class ClusterWorkload:
    name: str
    requests: list[BenchRequest]
    objectives: dict[Tier, TierObjectives]
    profile: str
    stages: tuple[tuple[float, float, float], ...]  # (start s, end s, rate req/s)

    def rate_at(self, t: float) -> float:
        for start, end, rate in self.stages:
            if start <= t < end:
                return rate
        return 0.0


def ramp_rows(rates: tuple[float, ...], holds: tuple[float, ...], *, seed: int, prompt: int, output: int) -> tuple[list[TraceRow], tuple]:
    rng = random.Random(f"ramp:{seed}")
    rows, stages, start = [], [], 0.0
    for rate, hold in zip(rates, holds):
        end = start + hold
        t = start + rng.expovariate(rate)
        while t < end:
            rows.append(TraceRow(round(t, 6), prompt, output))
            t += rng.expovariate(rate)
        stages.append((start, end, rate))
        start = end
    return rows, tuple(stages)


def cluster_workload(name: str, *, seed: int = 1, time_scale: float = 1.0) -> ClusterWorkload:
    if not 0 < time_scale <= 1.0:
        raise WorkloadError(f"--time-scale must be in (0, 1], got {time_scale}")
    if name not in WORKLOADS:
        raise WorkloadError(f"unknown cluster workload {name!r} (known: {', '.join(WORKLOADS)})")
    holds = tuple(h * time_scale for h in WVA_HOLDS_S)
    rows, stages = ramp_rows(WVA_RATES_RPS, holds, seed=seed, prompt=WVA_PROMPT_TOKENS, output=WVA_OUTPUT_TOKENS)
    if name == "wva-ramp":
        requests = [BenchRequest(f"r{i:06d}", row.arrival_s, row.prompt_tokens, row.output_tokens, "standard-0", Tier.STANDARD)
                    for i, row in enumerate(rows)]
        objectives = {**DEFAULT_OBJECTIVES, Tier.STANDARD: WVA_OBJECTIVES}
    else:
        requests = assign_tenants(rows, seed=seed, mix=DEFAULT_MIX)
        objectives = dict(DEFAULT_OBJECTIVES)
    return ClusterWorkload(name, requests, objectives, WVA_PROFILE, stages)
