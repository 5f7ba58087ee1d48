"""The simulator driving real vLLM schedulers: async lag, simulated clock, determinism,
conservation, the oracle bound."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from slaq.api.common import Tier
from slaq.api.contract import XARG_ARRIVAL, XARG_TIER, XARG_TTFT_MS, RequestSLA
from slaq.bench import engine_harness as harness
from slaq.bench.benchmark import WorkloadSpec, run_benchmark
from slaq.bench.clock import SIM_EPOCH
from slaq.bench.metrics import WALL_CLOCK_KEYS, policy_figures
from slaq.bench.report import format_table
from slaq.bench.policies import policy
from slaq.bench.runner import run_policy
from slaq.bench.simulator import Simulator
from slaq.bench.stepcost import ScheduledWork, StepCostModel
from slaq.bench.workload import DEFAULT_OBJECTIVES, BenchRequest

from .conftest import SAMPLE_TRACE


def _request(rid: str, at: float, prompt: int, output: int, tier: Tier = Tier.STANDARD) -> BenchRequest:
    return BenchRequest(rid, at, prompt, output, f"{tier.value}-0", tier)


class ClockProbe(AsyncScheduler):
    """Stock scheduler that records what the clock and the request contract say inside schedule()."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[float, float]] = []
        self.slas: dict[str, RequestSLA] = {}

    def add_request(self, request: Any) -> None:
        self.slas[request.request_id] = RequestSLA.from_extra_args(request.sampling_params.extra_args)
        super().add_request(request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self.seen.append((time.time(), time.monotonic()))
        return super().schedule(*args, **kwargs)


def test_arrival_during_step_n_first_runs_in_step_n_plus_2(small_profile) -> None:
    cost = StepCostModel(small_profile)
    first, late = _request("a", 0.0, 2000, 3), _request("b", 0.01, 100, 2)
    result = run_policy(policy("fcfs"), [first, late], small_profile, DEFAULT_OBJECTIVES)
    records = {r.request_id: r for r in result.records}
    step1 = cost.step_seconds([ScheduledWork(2000, 0, True)])
    step2 = cost.step_seconds([ScheduledWork(1, 2000, True)])
    step3 = cost.step_seconds([ScheduledWork(1, 2001, True), ScheduledWork(100, 0, True)])
    # Step 2 was scheduled at t=0 together with step 1; "b" is first scheduled (into step 3)
    # when step 1's result comes back, and its first token comes with step 3's.
    assert records["b"].first_scheduled_s == pytest.approx(step1)
    assert records["b"].first_token_s == pytest.approx(step1 + step2 + step3)
    assert records["a"].first_token_s == pytest.approx(step1)
    assert all(r.finished and r.tokens_out == r.output_tokens for r in result.records)


def test_scheduler_reads_simulated_time_and_the_contract(small_profile) -> None:
    cost = StepCostModel(small_profile)
    scheduler = harness.build_scheduler(ClockProbe, harness.engine_setup(small_profile, "priority"))
    requests = [_request("a", 0.0, 500, 4, Tier.CRITICAL), _request("b", 5.0, 500, 4, Tier.BATCH)]
    before = time.time()
    result = Simulator(scheduler, cost, requests, DEFAULT_OBJECTIVES, policy_name="probe").run()
    assert time.time() >= before  # the real clock is back
    stamps = [wall for wall, _ in scheduler.seen]
    assert stamps[0] == SIM_EPOCH
    assert all(wall == mono for wall, mono in scheduler.seen)
    assert any(s >= SIM_EPOCH + 5.0 for s in stamps) and max(stamps) <= SIM_EPOCH + result.end_s
    sla = scheduler.slas["a"]
    assert (sla.tier, sla.ttft_ms, sla.tpot_ms, sla.arrival) == (Tier.CRITICAL, 500.0, 50.0, SIM_EPOCH)
    assert scheduler.slas["b"].tier is Tier.BATCH and scheduler.slas["b"].tpot_ms is None


def test_requests_carry_tier_rank_priority_and_no_true_length(small_profile) -> None:
    request = harness.make_request("x", 10, max_tokens=100, arrival_time=SIM_EPOCH, priority=Tier.BATCH.rank,
                                   extra_args={XARG_TIER: "batch", XARG_TTFT_MS: 60000.0, XARG_ARRIVAL: SIM_EPOCH})
    assert request.priority == 2
    assert request.sampling_params.extra_args[XARG_TIER] == "batch"
    assert request.max_tokens == 100


def _strip_wall_clock(report: dict) -> dict:
    report = copy.deepcopy(report)
    entries = report.get("sweep") or [report]
    for entry in entries:
        for figures in entry["policies"].values():
            for key in WALL_CLOCK_KEYS:
                figures.pop(key)
    return report


def _workload(seed: int = 1, requests: int = 120) -> WorkloadSpec:
    return WorkloadSpec(trace=SAMPLE_TRACE, requests=requests, seed=seed)


def test_same_seed_same_report(small_profile) -> None:
    policies = [policy("fcfs"), policy("oracle")]
    one = run_benchmark(_workload(), small_profile, policies, [1.2], capacity_rps=6.0)
    two = run_benchmark(_workload(), small_profile, policies, [1.2], capacity_rps=6.0)
    assert _strip_wall_clock(one) == _strip_wall_clock(two)
    other = run_benchmark(_workload(seed=2), small_profile, policies, [1.2], capacity_rps=6.0)
    assert _strip_wall_clock(other)["policies"] != _strip_wall_clock(one)["policies"]


def test_every_request_finishes_or_is_reported_unfinished(small_profile) -> None:
    spec = _workload(requests=150)
    kept: list = []
    # A short drain at 3x load leaves work behind on purpose.
    report = run_benchmark(spec, small_profile, [policy("fcfs"), policy("priority")], [3.0], capacity_rps=6.0, max_drain_s=2.0, keep_results=kept)
    for (_, result), figures in zip(kept, report["policies"].values()):
        assert len(result.records) == 150
        finished = [r for r in result.records if r.finished]
        unfinished = [r for r in result.records if not r.finished]
        assert unfinished, "the short drain should leave requests unfinished"
        assert all(r.tokens_out == r.output_tokens for r in finished)
        assert all(r.tokens_out < r.output_tokens for r in unfinished)
        assert figures["unfinished"] == len(unfinished)
        assert figures["completed_fraction"] == pytest.approx(len(finished) / 150, abs=1e-6)
        tokens = figures["tokens"]
        assert tokens["delivered_output"] + tokens["undelivered_output"] == tokens["expected_output"] == sum(r.output_tokens for r in result.records)
        assert sum(figures["tiers"][t.value]["requests"] for t in Tier) == 150
        assert "stopped" in figures["stop_reason"]


def test_oracle_never_below_fcfs(small_profile) -> None:
    report = run_benchmark(_workload(requests=200), small_profile, [policy("fcfs"), policy("oracle")], [0.7, 1.0, 1.5])
    assert report["capacity"]["requests_per_s"] > 0
    for entry in report["sweep"]:
        fcfs, oracle = entry["policies"]["fcfs"], entry["policies"]["oracle"]
        assert oracle["attainment"] >= fcfs["attainment"], entry["load"]
        assert oracle["completed_fraction"] == 1.0
    assert report["sweep"][-1]["policies"]["oracle"]["tiers"]["critical"]["attainment"] >= 0.9


class TokenLedger(AsyncScheduler):
    """Stock scheduler that adds up the tokens each request was scheduled, over all its steps."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scheduled: dict[str, int] = {}

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        output = super().schedule(*args, **kwargs)
        for request_id, tokens in output.num_scheduled_tokens.items():
            self.scheduled[request_id] = self.scheduled.get(request_id, 0) + tokens
        return output


def _kv_starved(profile, blocks: int):
    return profile.model_copy(update={"engine": profile.engine.model_copy(update={"num_gpu_blocks": blocks})})


def test_recompute_tax_counts_what_preemption_throws_away(small_profile) -> None:
    requests = [_request(f"r{i}", 0.01 * i, 300, 250) for i in range(4)]
    by_blocks = {}
    for blocks in (60, 400):  # 60 blocks of 16 tokens hold two of the four requests at full length
        profile = _kv_starved(small_profile, blocks)
        scheduler = harness.build_scheduler(TokenLedger, harness.engine_setup(profile, "fcfs"))
        result = Simulator(scheduler, StepCostModel(profile), requests, DEFAULT_OBJECTIVES, policy_name="fcfs").run()
        assert all(r.finished for r in result.records)
        for record in result.records:
            # Every scheduled token is a first computation of its position or a repeat (async scheduling
            # may run one step past the stop token, hence the "- 1" that is not always there).
            assert scheduler.scheduled[record.request_id] == record.computed_tokens + record.recomputed_tokens
            assert record.computed_tokens >= record.prompt_tokens + record.output_tokens - 1
            assert (record.recomputed_tokens > 0) == (record.preemptions > 0)
        by_blocks[blocks] = (result, policy_figures(result, DEFAULT_OBJECTIVES))
    starved, starved_figures = by_blocks[60]
    assert starved_figures["preemptions"] > 0
    recomputed = sum(r.recomputed_tokens for r in starved.records)
    assert starved_figures["recomputed_tokens"] == recomputed
    assert starved_figures["recompute_tax"] == pytest.approx(recomputed / 1200, abs=1e-6)
    assert by_blocks[400][1]["recompute_tax"] == 0.0 and by_blocks[400][1]["preemptions"] == 0
    assert "recompute tax" in format_table({"fcfs": starved_figures})
