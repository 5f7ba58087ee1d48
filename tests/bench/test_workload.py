"""Trace reading, tenant/tier assignment, Poisson arrivals and load scaling."""

from __future__ import annotations

from pathlib import Path

import pytest

from slaq.api.common import Tier
from slaq.bench.errors import TraceError, WorkloadError
from slaq.bench.traces import densest_window, read_trace
from slaq.bench.workload import (
    DEFAULT_OBJECTIVES,
    TierObjectives,
    BurstSpec,
    assign_tenants,
    mean_rate,
    parse_bursts,
    parse_mix,
    poisson_rows,
    scale_to_rate,
    with_bursts,
)

from .conftest import SAMPLE_TRACE


def test_sample_trace_reads_in_order_from_zero() -> None:
    rows = read_trace(SAMPLE_TRACE)
    assert len(rows) == 300
    assert rows[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(rows, rows[1:]))
    assert (rows[0].prompt_tokens, rows[0].output_tokens) == (374, 44)
    # 2023-11-16 18:15:46.6805900 -> 18:15:50.9951690
    assert rows[1].arrival_s == pytest.approx(4.314579, abs=1e-6)


def test_bad_traces_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not found"):
        read_trace(tmp_path / "missing.csv")
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("time,prompt,output\n1,2,3\n")
    with pytest.raises(TraceError, match="missing column"):
        read_trace(wrong)
    bad_row = tmp_path / "bad.csv"
    bad_row.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,12,x\n")
    with pytest.raises(TraceError, match=r"bad.csv:2"):
        read_trace(bad_row)


def test_mix_assigns_tiers_in_proportion_and_is_seeded() -> None:
    rows = poisson_rows(5000, seed=3)
    requests = assign_tenants(rows, seed=7)
    share = {t: sum(r.tier is t for r in requests) / len(requests) for t in Tier}
    assert share[Tier.CRITICAL] == pytest.approx(0.10, abs=0.02)
    assert share[Tier.STANDARD] == pytest.approx(0.30, abs=0.02)
    assert share[Tier.BATCH] == pytest.approx(0.60, abs=0.02)
    assert assign_tenants(rows, seed=7) == requests
    assert assign_tenants(rows, seed=8) != requests
    assert {r.tenant for r in requests if r.tier is Tier.CRITICAL} == {"critical-0", "critical-1", "critical-2"}


def test_parse_mix_forms_and_errors() -> None:
    assert parse_mix("10,30,60") == pytest.approx({Tier.CRITICAL: 0.1, Tier.STANDARD: 0.3, Tier.BATCH: 0.6})
    assert parse_mix("critical=1,batch=1") == {Tier.CRITICAL: 0.5, Tier.STANDARD: 0.0, Tier.BATCH: 0.5}
    for bad in ("10,30", "gold=1", "0,0,0", "-1,1,1"):
        with pytest.raises(WorkloadError):
            parse_mix(bad)


def test_scaling_sets_the_rate_and_keeps_the_shape() -> None:
    requests = assign_tenants(read_trace(SAMPLE_TRACE), seed=1)
    scaled = scale_to_rate(requests, 40.0)
    assert mean_rate(scaled) == pytest.approx(40.0)
    factor = scaled[-1].arrival_s / requests[-1].arrival_s
    assert all(s.arrival_s == pytest.approx(r.arrival_s * factor, abs=1e-6) for s, r in zip(scaled, requests))
    with pytest.raises(WorkloadError):
        scale_to_rate(requests, 0.0)


def test_densest_window_finds_the_burst() -> None:
    rows = read_trace(SAMPLE_TRACE)
    window = densest_window(rows, 10.0)
    assert window[0].arrival_s == 0.0 and window[-1].arrival_s <= 10.0
    best = max(sum(1 for r in rows if s.arrival_s <= r.arrival_s <= s.arrival_s + 10.0) for s in rows)
    assert len(window) == best


def test_poisson_rows_are_seeded_and_exponential() -> None:
    rows = poisson_rows(4000, seed=5)
    assert rows == poisson_rows(4000, seed=5)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(rows, rows[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(1.0, rel=0.06)
    lengths = read_trace(SAMPLE_TRACE)
    resampled = poisson_rows(100, seed=5, lengths=lengths)
    pairs = {(r.prompt_tokens, r.output_tokens) for r in lengths}
    assert all((r.prompt_tokens, r.output_tokens) in pairs for r in resampled)


def test_attainment_needs_both_objectives() -> None:
    goal = DEFAULT_OBJECTIVES[Tier.CRITICAL]
    assert goal.met(0.4, 0.04)
    assert not goal.met(0.6, 0.04)
    assert not goal.met(0.4, 0.06)
    assert TierObjectives(60.0, None).met(59.0, 5.0)


def test_a_dense_window_keeps_its_extra_density_when_scaled() -> None:
    from slaq.bench.benchmark import WorkloadSpec

    spec = WorkloadSpec(trace=SAMPLE_TRACE, requests=1000, window_s=10.0)
    requests = spec.build()
    whole = read_trace(SAMPLE_TRACE)
    assert spec.reference_rate == pytest.approx((len(whole) - 1) / whole[-1].arrival_s)
    density = spec.describe(requests)["window_density"]
    assert density > 1.0
    scaled = scale_to_rate(requests, 20.0, reference_rate=spec.reference_rate)
    assert mean_rate(scaled) == pytest.approx(20.0 * density, rel=1e-3)


def _arrivals_in_bursts(arrivals: list[float], spec: BurstSpec) -> int:
    return sum(1 for t in arrivals if t % spec.period_s < spec.burst_s)


def test_bursts_run_short_windows_at_factor_times_the_mean_and_keep_the_mean() -> None:
    requests = scale_to_rate(assign_tenants(poisson_rows(20_000, seed=5), seed=5), 10.0)
    spec = parse_bursts("4:60")
    assert (spec.factor, spec.period_s, spec.burst_s) == (4.0, 60.0, 7.5)
    bursty = with_bursts(requests, spec)
    arrivals = [r.arrival_s for r in bursty]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert [r.request_id for r in bursty] == [r.request_id for r in requests]  # only arrival times change
    assert [(r.prompt_tokens, r.output_tokens, r.tier) for r in bursty] == [(r.prompt_tokens, r.output_tokens, r.tier) for r in requests]
    span = arrivals[-1]
    periods = span // spec.period_s
    whole = [t for t in arrivals if t < periods * spec.period_s]
    mean = len(whole) / (periods * spec.period_s)
    assert mean == pytest.approx(10.0, rel=0.03)  # whole periods keep the mean rate
    in_bursts = _arrivals_in_bursts(whole, spec)
    burst_rate = in_bursts / (periods * spec.burst_s)
    quiet_rate = (len(whole) - in_bursts) / (periods * (spec.period_s - spec.burst_s))
    assert burst_rate == pytest.approx(4.0 * mean, rel=0.05)
    assert quiet_rate == pytest.approx(spec.base_factor * mean, rel=0.05)
    assert spec.base_factor == pytest.approx(4 / 7)
    # The unmodulated arrivals, by contrast, do not crowd into those windows.
    plain = [r.arrival_s for r in requests if r.arrival_s < periods * spec.period_s]
    assert _arrivals_in_bursts(plain, spec) / len(plain) == pytest.approx(spec.burst_s / spec.period_s, abs=0.02)


def test_bursts_are_deterministic_and_compose_with_a_trace() -> None:
    requests = scale_to_rate(assign_tenants(read_trace(SAMPLE_TRACE), seed=2), 5.0)
    spec = BurstSpec(3.0, 20.0, duration_s=4.0)
    first, second = with_bursts(requests, spec), with_bursts(requests, spec)
    assert first == second
    assert first != requests
    assert with_bursts(requests, None) == requests
    assert with_bursts(requests, BurstSpec(1.0, 20.0)) == requests  # factor 1: no modulation
    # The warp is monotonic and maps period boundaries onto themselves.
    assert [spec.warp(k * 20.0) for k in range(4)] == [0.0, 20.0, 40.0, 60.0]
    assert spec.warp(12.0) == pytest.approx(4.0)  # 12 unmodulated seconds fill the 4 s burst at 3x
    assert spec.warp(16.0) == pytest.approx(4.0 + 4.0 / spec.base_factor)


def test_bad_bursts_are_named() -> None:
    for text, message in (("4", "FACTOR:PERIOD_S"), ("x:60", "bad --bursts"), ("0.5:60", "factor must be"),
                          ("4:0", "period must be"), ("4:60:20", "at most period / factor")):
        with pytest.raises(WorkloadError, match=message):
            parse_bursts(text)
