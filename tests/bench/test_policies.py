"""The policy registry, and one contract test that runs every registered policy."""

from __future__ import annotations

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from slaq.api.common import Tier
from slaq.bench.benchmark import WorkloadSpec, run_benchmark
from slaq.bench.errors import PolicyUnavailable
from slaq.bench.policies import POLICIES, PolicySpec, parse_policies, policy
from slaq.bench.report import format_table
from slaq.bench.runner import run_policy
from slaq.bench.traces import read_trace
from slaq.bench.workload import DEFAULT_OBJECTIVES, assign_tenants, scale_to_rate

from .conftest import SAMPLE_TRACE


def test_unknown_and_duplicate_policies_are_refused() -> None:
    with pytest.raises(PolicyUnavailable, match="known: fcfs, priority, slaq, slaq-max-tokens, oracle"):
        policy("edf")
    with pytest.raises(PolicyUnavailable, match="twice"):
        parse_policies("fcfs,fcfs")


def test_missing_implementation_fails_with_a_clear_message() -> None:
    absent = PolicySpec("ghost", "priority", "not installed", "slaq.engine.no_such_scheduler", "Ghost")
    with pytest.raises(PolicyUnavailable, match=r"policy 'ghost' needs slaq\.engine\.no_such_scheduler\.Ghost"):
        absent.load()


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_registered_policy_serves_a_workload(name: str, small_profile) -> None:
    spec = policy(name)
    try:
        spec.load()
    except PolicyUnavailable as exc:
        # Absent is allowed (the component may not be built); faked is not: the message names it.
        assert spec.module in str(exc)
        return
    requests = scale_to_rate(assign_tenants(read_trace(SAMPLE_TRACE, limit=80), seed=4), 8.0)
    result = run_policy(spec, requests, small_profile, DEFAULT_OBJECTIVES)
    assert result.stop_reason == "all requests finished"
    assert all(r.finished and r.tokens_out == r.output_tokens for r in result.records)
    assert all(r.first_token_s is not None and r.first_token_s > r.arrival_s for r in result.records)
    assert {r.tier for r in result.records} == set(Tier)


class CrashingScheduler(AsyncScheduler):
    """A scheduler with a bug: its third step raises."""

    def schedule(self, *args, **kwargs):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 3:
            raise ZeroDivisionError("float division by zero")
        return super().schedule(*args, **kwargs)


def test_a_crashing_scheduler_is_reported_and_the_others_still_run(small_profile) -> None:
    crashing = PolicySpec("crashing", "fcfs", "a scheduler with a bug", __name__, "CrashingScheduler")
    workload = WorkloadSpec(trace=SAMPLE_TRACE, requests=40)
    report = run_benchmark(workload, small_profile, [crashing, policy("fcfs")], [1.0], capacity_rps=5.0)
    failed, fcfs = report["policies"]["crashing"], report["policies"]["fcfs"]
    assert failed["error"] == "ZeroDivisionError: float division by zero"
    assert "attainment" not in failed
    assert fcfs["completed_fraction"] == 1.0
    table = format_table(report["policies"])
    assert "crashing: FAILED: ZeroDivisionError" in table and "fcfs: attainment" in table


def test_table_names_the_error_when_every_policy_failed() -> None:
    table = format_table({"slaq": {"error": "OverflowError: cannot convert float infinity to integer"}})
    assert "slaq: FAILED: OverflowError" in table
