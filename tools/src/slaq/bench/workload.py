"""The benchmark's workload: requests with arrival times, token counts, tenants, tiers and objectives.

A workload is built in three steps, each a pure function of its inputs and a seed:
lengths and relative arrivals come from a trace (or a Poisson process), tenants and tiers are
assigned by a mix, and arrivals are rescaled to a target request rate (the load factor times
the pool's measured capacity, see `slaq.bench.capacity`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Sequence

from slaq.api.common import Tier
from slaq.api.contract import RequestSLA
from slaq.bench.errors import WorkloadError
from slaq.bench.traces import TraceRow


@dataclass(frozen=True, slots=True)
class TierObjectives:
    """A tier's latency objectives in seconds; None means the tier has no such objective."""

    ttft_s: float | None
    tpot_s: float | None

    def met(self, ttft_s: float, tpot_s: float) -> bool:
        """Attainment counts a request only when it meets both its TTFT and its mean-TPOT objective."""
        return (self.ttft_s is None or ttft_s <= self.ttft_s) and (self.tpot_s is None or tpot_s <= self.tpot_s)


# Issue 9's benchmark defaults: critical 0.5 s + 50 ms, standard 2 s + 100 ms, batch 60 s TTFT.
DEFAULT_OBJECTIVES: dict[Tier, TierObjectives] = {
    Tier.CRITICAL: TierObjectives(ttft_s=0.5, tpot_s=0.050),
    Tier.STANDARD: TierObjectives(ttft_s=2.0, tpot_s=0.100),
    Tier.BATCH: TierObjectives(ttft_s=60.0, tpot_s=None),
}
DEFAULT_MIX: dict[Tier, float] = {Tier.CRITICAL: 0.10, Tier.STANDARD: 0.30, Tier.BATCH: 0.60}


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of the workload (hot path: a plain dataclass)."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tenant: str
    tier: Tier

    def sla(self, objectives: dict[Tier, TierObjectives], epoch: float) -> RequestSLA:
        """The enrichment contract as the sidecar would set it; the predicted output is unknown."""
        goal = objectives[self.tier]
        return RequestSLA(
            tenant=self.tenant,
            tier=self.tier,
            ttft_ms=None if goal.ttft_s is None else goal.ttft_s * 1000.0,
            tpot_ms=None if goal.tpot_s is None else goal.tpot_s * 1000.0,
            arrival=epoch + self.arrival_s,
            predicted_output=None,
        )


def parse_mix(text: str) -> dict[Tier, float]:
    """`10,30,60` or `critical=10,standard=30,batch=60` (percent or fractions) to tier fractions."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    values: dict[Tier, float] = {}
    try:
        if all("=" in p for p in parts):
            for part in parts:
                name, _, number = part.partition("=")
                values[Tier(name.strip())] = float(number)
        elif len(parts) == len(Tier):
            values = {tier: float(p) for tier, p in zip(Tier, parts)}
        else:
            raise ValueError("give three numbers (critical,standard,batch) or tier=number pairs")
    except ValueError as exc:
        raise WorkloadError(f"bad tier mix {text!r}: {exc}") from exc
    total = sum(values.values())
    if total <= 0 or any(v < 0 or not math.isfinite(v) for v in values.values()):
        raise WorkloadError(f"bad tier mix {text!r}: shares must be non-negative and not all zero")
    return {tier: values.get(tier, 0.0) / total for tier in Tier}


def poisson_rows(count: int, *, seed: int, lengths: Sequence[TraceRow] | None = None,
                 prompt_mean: float = 1155.0, output_mean: float = 211.0) -> list[TraceRow]:
    """`count` requests arriving as a Poisson process of rate 1/s (rescale with `scale_to_rate`).

    Lengths are drawn from `lengths` (a trace's rows) when given, else from log-normal
    distributions with the given means (defaults: the Azure conversation trace's means).
    """
    if count < 1:
        raise WorkloadError(f"request count must be >= 1, got {count}")
    rng = random.Random(f"poisson:{seed}")
    rows, now = [], 0.0
    sigma = 1.0
    for _ in range(count):
        if lengths:
            source = lengths[rng.randrange(len(lengths))]
            prompt, output = source.prompt_tokens, source.output_tokens
        else:
            prompt = max(1, round(rng.lognormvariate(math.log(prompt_mean) - sigma**2 / 2, sigma)))
            output = max(1, round(rng.lognormvariate(math.log(output_mean) - sigma**2 / 2, sigma)))
        rows.append(TraceRow(round(now, 6), prompt, output))
        now += rng.expovariate(1.0)
    return rows


@dataclass(frozen=True, slots=True)
class LongContextShape:
    """The `long-context` workload's lengths (`long_context_rows`).

    Prompts: with probability `tail_share` a Pareto tail (`tail_start_tokens` x Pareto(`tail_alpha`):
    heavy, so a few requests fill the context), else a log-normal body (median `body_median_tokens`,
    log-sd `body_sigma`); every prompt clipped to [`min_prompt_tokens`, max_model_len - its output].
    Outputs: log-normal (median `output_median_tokens`, log-sd `output_sigma`) clipped to
    [`min_output_tokens`, `max_output_tokens`]. With the defaults and a 131,072-token context, 2,000
    requests (seed 1) have prompts of about 13k tokens on average (median about 7k, 8 % above 32k,
    about 1 % within 2k of the context) and outputs of about 355: the shape of a production
    long-context conversation workload (issue 37), not a copy of one.
    """

    body_median_tokens: float = 6500.0
    body_sigma: float = 0.95
    tail_share: float = 0.04
    tail_start_tokens: float = 32768.0
    tail_alpha: float = 1.1
    min_prompt_tokens: int = 64
    output_median_tokens: float = 300.0
    output_sigma: float = 0.6
    min_output_tokens: int = 16
    max_output_tokens: int = 2048

    def describe(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _check_size(name: str, count: int, max_model_len: int, shortest: int) -> None:
    if count < 1:
        raise WorkloadError(f"request count must be >= 1, got {count}")
    if max_model_len < shortest:
        raise WorkloadError(f"max_model_len {max_model_len} is too short for the {name} workload (at least {shortest} tokens)")


def long_context_rows(count: int, *, seed: int, max_model_len: int,
                      shape: LongContextShape = LongContextShape()) -> list[TraceRow]:
    """`count` requests of the `long-context` workload (see `LongContextShape`), arriving as a Poisson
    process of rate 1/s (rescale with `scale_to_rate`); a pure function of its arguments."""
    _check_size("long-context", count, max_model_len, shape.min_prompt_tokens + shape.min_output_tokens)
    rng = random.Random(f"long-context:{seed}")
    rows, now = [], 0.0
    for _ in range(count):
        output = round(rng.lognormvariate(math.log(shape.output_median_tokens), shape.output_sigma))
        output = min(shape.max_output_tokens, max(shape.min_output_tokens, output), max_model_len - shape.min_prompt_tokens)
        if rng.random() < shape.tail_share:
            prompt = shape.tail_start_tokens * rng.paretovariate(shape.tail_alpha)
        else:
            prompt = rng.lognormvariate(math.log(shape.body_median_tokens), shape.body_sigma)
        prompt = max(shape.min_prompt_tokens, min(max_model_len - output, round(prompt)))
        rows.append(TraceRow(round(now, 6), prompt, output))
        now += rng.expovariate(1.0)
    return rows


@dataclass(frozen=True, slots=True)
class FixedShape:
    """Every request of the same lengths. `PREFILL_HEAVY`: inference-perf's "prefill-heavy" shape (4,000
    prompt tokens, 1,000 output tokens), the requests of `slaq bench cluster`'s ramps, here on one pod."""

    prompt_tokens: int
    output_tokens: int

    def describe(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


PREFILL_HEAVY = FixedShape(prompt_tokens=4000, output_tokens=1000)


def prefill_heavy_rows(count: int, *, seed: int, max_model_len: int, shape: FixedShape = PREFILL_HEAVY) -> list[TraceRow]:
    """`count` requests of `shape`'s lengths arriving as a Poisson process of rate 1/s (rescale with
    `scale_to_rate`); a pure function of its arguments."""
    _check_size("prefill-heavy", count, max_model_len, shape.prompt_tokens + shape.output_tokens)
    rng = random.Random(f"prefill-heavy:{seed}")
    rows, now = [], 0.0
    for _ in range(count):
        rows.append(TraceRow(round(now, 6), shape.prompt_tokens, shape.output_tokens))
        now += rng.expovariate(1.0)
    return rows


# `--workload NAME`: synthetic workloads of our own, each a function (count, seed, max_model_len) -> rows.
SYNTHETIC_WORKLOADS = {"long-context": long_context_rows, "prefill-heavy": prefill_heavy_rows}
SYNTHETIC_SHAPES = {"long-context": LongContextShape(), "prefill-heavy": PREFILL_HEAVY}


def assign_tenants(rows: Sequence[TraceRow], *, seed: int, mix: dict[Tier, float] | None = None,
                   tenants_per_tier: int = 3) -> list[BenchRequest]:
    """Give each row a tier drawn from the mix and a tenant drawn uniformly within the tier."""
    if tenants_per_tier < 1:
        raise WorkloadError(f"tenants per tier must be >= 1, got {tenants_per_tier}")
    mix = mix or DEFAULT_MIX
    rng = random.Random(f"tenants:{seed}")
    tiers, weights = list(mix), [mix[t] for t in mix]
    requests = []
    for index, row in enumerate(rows):
        tier = rng.choices(tiers, weights)[0]
        tenant = f"{tier.value}-{rng.randrange(tenants_per_tier)}"
        requests.append(BenchRequest(f"r{index:06d}", row.arrival_s, row.prompt_tokens, row.output_tokens, tenant, tier))
    return requests


def mean_rate(requests: Sequence[BenchRequest]) -> float:
    """Requests per second between the first and the last arrival."""
    if len(requests) < 2:
        raise WorkloadError("a rate needs at least two requests")
    span = requests[-1].arrival_s - requests[0].arrival_s
    if span <= 0:
        raise WorkloadError("all requests arrive at once; the workload has no rate")
    return (len(requests) - 1) / span


def scale_to_rate(requests: Sequence[BenchRequest], rate_rps: float, *, reference_rate: float | None = None) -> list[BenchRequest]:
    """The same requests with arrivals stretched or compressed to a mean rate of `rate_rps`.

    Bursts keep their shape relative to the mean: a window at 9x the mean rate stays at 9x.
    With `reference_rate` (the mean rate of the whole trace a slice was cut from), the time
    axis is scaled so that the *whole trace* would run at `rate_rps`: a dense slice keeps its
    extra density.
    """
    if not (rate_rps > 0 and math.isfinite(rate_rps)):
        raise WorkloadError(f"rate must be a positive number, got {rate_rps}")
    factor = (reference_rate or mean_rate(requests)) / rate_rps
    origin = requests[0].arrival_s
    return [replace(r, arrival_s=round((r.arrival_s - origin) * factor, 9)) for r in requests]


@dataclass(frozen=True, slots=True)
class BurstSpec:
    """Arrivals modulated in a fixed cycle: every `period_s` seconds a window of `duration_s` runs at
    `factor` x the mean rate, the rest of the period below it, so the mean over a period is unchanged.

    Default duration: period / (2 x factor), so half of the requests arrive inside bursts and the
    rest at 0.5 / (1 - 1 / (2 x factor)) x the mean (4x bursts: 1/8 of the time at 4x, 7/8 at 0.57x).
    """

    factor: float
    period_s: float
    duration_s: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor >= 1.0):
            raise WorkloadError(f"burst factor must be a number >= 1, got {self.factor}")
        if not (math.isfinite(self.period_s) and self.period_s > 0):
            raise WorkloadError(f"burst period must be a positive number of seconds, got {self.period_s}")
        if self.duration_s is not None and not (0 < self.duration_s and self.factor * self.duration_s <= self.period_s):
            raise WorkloadError(f"burst duration must be positive and at most period / factor "
                                f"({self.period_s / self.factor:g} s), got {self.duration_s}")

    @property
    def burst_s(self) -> float:
        return self.duration_s if self.duration_s is not None else self.period_s / (2.0 * self.factor)

    @property
    def base_factor(self) -> float:
        """The rate outside the bursts, as a multiple of the mean."""
        burst = self.burst_s
        quiet = self.period_s - burst
        return (self.period_s - self.factor * burst) / quiet if quiet > 0 else 0.0

    def warp(self, seconds: float) -> float:
        """Where an arrival at `seconds` of the unmodulated process lands in the modulated one.

        The inverse of the cumulative rate multiplier (factor inside a burst, base_factor outside),
        which maps whole periods onto whole periods: the mean rate is kept, a Poisson process
        becomes a modulated Poisson process and a trace keeps its own bursts under the new ones.
        """
        period, burst = self.period_s, self.burst_s
        cycles, offset = divmod(seconds, period)
        inside = self.factor * burst  # unmodulated seconds that a burst window absorbs
        if offset < inside:
            return cycles * period + offset / self.factor
        return cycles * period + burst + (offset - inside) / self.base_factor


def parse_bursts(text: str) -> BurstSpec:
    """`FACTOR:PERIOD_S` or `FACTOR:PERIOD_S:DURATION_S`, e.g. `4:60` (4x the mean rate for 7.5 s every minute)."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError("expected FACTOR:PERIOD_S[:DURATION_S]")
        numbers = [float(p) for p in parts]
    except ValueError as exc:
        raise WorkloadError(f"bad --bursts {text!r}: {exc}") from exc
    return BurstSpec(numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else None)


def with_bursts(requests: Sequence[BenchRequest], bursts: BurstSpec | None) -> list[BenchRequest]:
    """The same requests with arrivals (seconds from the first, already at the target rate) modulated
    by `bursts`; a pure function of its inputs (no randomness), so a seed reproduces a run exactly."""
    if bursts is None:
        return list(requests)
    if not requests:
        return []
    origin = requests[0].arrival_s
    return [replace(r, arrival_s=round(bursts.warp(r.arrival_s - origin), 9)) for r in requests]


def all_at_once(requests: Sequence[BenchRequest]) -> list[BenchRequest]:
    """Every request arriving at time 0 (saturation, for measuring capacity)."""
    return [replace(r, arrival_s=0.0) for r in requests]
