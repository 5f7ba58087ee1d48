"""Running one policy over one workload: build its scheduler, hand the oracle its knowledge, simulate."""

from __future__ import annotations

from typing import Sequence

from slaq.api.common import Tier
from slaq.bench import engine_harness as harness
from slaq.bench.policies import PolicySpec
from slaq.bench.pool_profile import PoolProfile
from slaq.bench.simulator import ProgressCallback, RunResult, Simulator
from slaq.bench.stepcost import StepCostModel
from slaq.bench.workload import BenchRequest, TierObjectives


def run_policy(spec: PolicySpec, requests: Sequence[BenchRequest], profile: PoolProfile,
               objectives: dict[Tier, TierObjectives], *, max_drain_s: float = 1800.0,
               progress: ProgressCallback | None = None) -> RunResult:
    cost = StepCostModel(profile)
    scheduler = harness.build_scheduler(spec.load(), harness.engine_setup(profile, spec.scheduling_policy))
    if spec.knows_true_lengths:
        scheduler.bind_knowledge(cost, {r.request_id: r.output_tokens for r in requests})
    simulator = Simulator(scheduler, cost, requests, objectives, policy_name=spec.name, max_drain_s=max_drain_s, progress=progress)
    return simulator.run()
