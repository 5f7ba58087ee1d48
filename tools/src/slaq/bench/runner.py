"""Running one policy over one workload: build its scheduler, hand the oracle its knowledge, simulate.

With a `PodConfig` (`--pod`) a policy whose pod ships the sidecar runs behind the real sidecar
core, and its engine scheduler gets the same scheduler spec as the sidecar.
"""

from __future__ import annotations

from typing import Sequence

from slaq.api.common import Tier
from slaq.bench import engine_harness as harness
from slaq.bench.clock import SimClock
from slaq.bench.kv_swap import SwapAccount, transfer_config
from slaq.bench.policies import PolicySpec
from slaq.bench.pod import PodConfig, PodFront, tenant_table
from slaq.bench.pool_profile import PoolProfile
from slaq.bench.simulator import ProgressCallback, RunResult, Simulator
from slaq.bench.stepcost import StepCostModel
from slaq.bench.workload import BenchRequest, TierObjectives


def _configured(scheduler_cls: type, pod: PodConfig) -> type:
    """`scheduler_cls` reading `pod.scheduler`, as the operator hands the pool's spec to the engine."""
    from slaq.engine.config import EngineSchedulerConfig

    if not hasattr(scheduler_cls, "config_override"):
        return scheduler_cls
    return type(scheduler_cls.__name__, (scheduler_cls,), {"config_override": EngineSchedulerConfig(spec=pod.scheduler)})


def run_policy(spec: PolicySpec, requests: Sequence[BenchRequest], profile: PoolProfile,
               objectives: dict[Tier, TierObjectives], *, max_drain_s: float = 1800.0,
               progress: ProgressCallback | None = None, pod: PodConfig | None = None, kv_swap: bool = True) -> RunResult:
    """With `kv_swap` (the engine's default) a policy whose engine ships slaq's KV connector runs
    with it and the profile's host cache (`slaq.bench.kv_swap`); without, its victims are recomputed."""
    cost = StepCostModel(profile)
    scheduler_cls = spec.load()
    front, clock = None, SimClock()
    if pod is not None and spec.behind_sidecar:
        scheduler_cls = _configured(scheduler_cls, pod)
        front = PodFront(pod, tenant_table(requests, objectives, pod.quotas), clock,
                         max_num_seqs=profile.engine.max_num_seqs, max_model_len=profile.model.max_model_len,
                         max_num_batched_tokens=profile.engine.max_num_batched_tokens)
    connector = transfer_config(profile) if kv_swap and spec.ships_kv_connector else None
    scheduler = harness.build_scheduler(scheduler_cls, harness.engine_setup(profile, spec.scheduling_policy, kv_transfer_config=connector))
    swap = SwapAccount.install(scheduler, cost) if connector else None
    if spec.knows_true_lengths:
        scheduler.bind_knowledge(cost, {r.request_id: r.output_tokens for r in requests})
    simulator = Simulator(scheduler, cost, requests, objectives, policy_name=spec.name, clock=clock, max_drain_s=max_drain_s,
                          progress=progress, front=front, swap=swap)
    return simulator.run()
