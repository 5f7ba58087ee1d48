"""The oracle's own rules: budgets shaped to TPOT objectives, urgent arrivals ahead of
lower-tier prompt chunks, slots never over-committed."""

from __future__ import annotations

from slaq.api.common import Tier
from slaq.bench import engine_harness as harness
from slaq.bench.clock import SIM_EPOCH, SimClock
from slaq.bench.oracle import OracleScheduler
from slaq.bench.stepcost import ScheduledWork, StepCostModel
from slaq.bench.workload import DEFAULT_OBJECTIVES, BenchRequest


def _oracle(profile, true_output: dict[str, int]) -> OracleScheduler:
    scheduler = harness.build_scheduler(OracleScheduler, harness.engine_setup(profile, "priority"))
    scheduler.bind_knowledge(StepCostModel(profile), true_output)
    return scheduler


def _vllm_request(rid: str, prompt: int, tier: Tier):
    bench = BenchRequest(rid, 0.0, prompt, 10, f"{tier.value}-0", tier)
    return harness.make_request(rid, prompt, max_tokens=1000, arrival_time=SIM_EPOCH, priority=tier.rank,
                                extra_args=bench.sla(DEFAULT_OBJECTIVES, SIM_EPOCH).to_xargs())


def test_critical_arrival_takes_the_step_from_a_batch_prompt(small_profile) -> None:
    scheduler = _oracle(small_profile, {"batch": 10, "crit": 10})
    with SimClock().installed():
        scheduler.add_request(_vllm_request("batch", 6000, Tier.BATCH))
        first = scheduler.schedule()
        assert first.num_scheduled_tokens == {"batch": 2048}  # nothing with a TPOT objective runs: full budget
        scheduler.add_request(_vllm_request("crit", 300, Tier.CRITICAL))
        second = scheduler.schedule()
    assert second.num_scheduled_tokens == {"crit": 300}  # the batch chunk waits one step
    assert {r.request_id for r in scheduler.running} == {"batch", "crit"}


def test_budget_keeps_steps_within_the_tightest_tpot(small_profile) -> None:
    cost = StepCostModel(small_profile)
    scheduler = _oracle(small_profile, {"crit": 50, "batch": 10})
    with SimClock().installed():
        scheduler.add_request(_vllm_request("crit", 100, Tier.CRITICAL))
        scheduler.schedule()
        scheduler.add_request(_vllm_request("batch", 6000, Tier.BATCH))
        step = scheduler.schedule()
    assert step.num_scheduled_tokens["crit"] == 1
    chunk = step.num_scheduled_tokens["batch"]
    assert 0 < chunk < 2048
    seconds = cost.step_seconds([ScheduledWork(1, 100, True), ScheduledWork(chunk, 0, False)])
    assert seconds <= DEFAULT_OBJECTIVES[Tier.CRITICAL].tpot_s


def test_held_out_prompts_keep_their_slots(small_profile) -> None:
    engine = small_profile.engine.model_copy(update={"max_num_seqs": 2})
    profile = small_profile.model_copy(update={"engine": engine})
    scheduler = _oracle(profile, {"b1": 10, "b2": 10, "crit": 10})
    with SimClock().installed():
        scheduler.add_request(_vllm_request("b1", 1000, Tier.BATCH))
        scheduler.add_request(_vllm_request("b2", 6000, Tier.BATCH))
        first = scheduler.schedule()
        assert first.num_scheduled_tokens == {"b1": 1000, "b2": 1048}  # b1 decodes next, b2 is mid-prompt
        scheduler.add_request(_vllm_request("crit", 300, Tier.CRITICAL))
        step = scheduler.schedule()
    # Both slots are taken, so the critical request cannot be admitted: b2's chunk is not held
    # back for nothing, and no third slot is handed out.
    assert step.num_scheduled_tokens == {"b1": 1, "b2": 2047}
    assert len(scheduler.running) == 2
    assert len(scheduler.running) == 2
