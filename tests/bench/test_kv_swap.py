"""KV swap in the simulator: slaq's real KV connector in the loop (slaq.bench.kv_swap). With swap
on, a preempted request's KV comes back from host memory, so the recompute tax drops to the
partial-block tails, and each step carrying a swap takes its host transfer time longer."""

from __future__ import annotations

from typing import Any

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from slaq.api.common import Tier
from slaq.bench import engine_harness as harness
from slaq.bench.benchmark import NO_SWAP_SUFFIX, swap_variants
from slaq.bench.errors import WorkloadError
from slaq.bench.kv_swap import SwapAccount, transfer_config
from slaq.bench.metrics import policy_figures
from slaq.bench.policies import policy
from slaq.bench.report import format_table
from slaq.bench.simulator import Simulator
from slaq.bench.stepcost import StepCostModel
from slaq.bench.workload import DEFAULT_OBJECTIVES, BenchRequest
from slaq.api.pool import SchedulerSpec
from slaq.engine.config import EngineSchedulerConfig
from slaq.engine.kv_security.ownership import HeldBlocks
from slaq.engine.kv_security.swap import CHEAPER_TO_RECOMPUTE, NO_ROOM, SaveOrder, SwapLedger, SwapOrRecompute
from slaq.engine.launcher import EngineOptions, kv_transfer_config
from slaq.engine.scheduler import SLAScheduler
from slaq.engine.tpot_budget import StepTimeModel


class StepTimes(AsyncScheduler):
    """Stock scheduler that keeps every SchedulerOutput (to recompute the step times the simulator charged)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outputs: list[Any] = []

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        output = super().schedule(*args, **kwargs)
        self.outputs.append(output)
        return output


def _requests() -> list[BenchRequest]:
    return [BenchRequest(f"r{i}", 0.01 * i, 300, 250, "standard-0", Tier.STANDARD) for i in range(4)]


def _profile(small_profile, *, host_gib: float = 1.0, link_gb_s: float = 55.0):
    # 60 blocks of 16 tokens hold two of the four 550-token requests: vLLM preempts.
    engine = small_profile.engine.model_copy(update={"num_gpu_blocks": 60, "kv_host_cache_gib": host_gib})
    # the link alone (sealing not counted): swapping beats recomputing at 55 GB/s
    gpu = small_profile.gpu.model_copy(update={"host_link_gb_s": link_gb_s, "host_seal_gb_s": None})
    return small_profile.model_copy(update={"engine": engine, "gpu": gpu})


def _run(profile, *, swap: bool):
    cost = StepCostModel(profile)
    connector = transfer_config(profile) if swap else None
    scheduler = harness.build_scheduler(StepTimes, harness.engine_setup(profile, "fcfs", kv_transfer_config=connector))
    account = SwapAccount.install(scheduler, cost) if connector else None
    result = Simulator(scheduler, cost, _requests(), DEFAULT_OBJECTIVES, policy_name="fcfs", swap=account).run()
    assert all(r.finished for r in result.records)
    return result, policy_figures(result, DEFAULT_OBJECTIVES), scheduler


def test_swap_on_restores_the_victims_kv_instead_of_recomputing_it(small_profile) -> None:
    profile = _profile(small_profile)
    _, off, _ = _run(profile, swap=False)
    swapped = _victims_counted("swapped", "cost")
    result, on, _ = _run(profile, swap=True)
    assert _victims_counted("swapped", "cost") - swapped == on["kv_swap"]["swapped_victims"] > 0
    assert off["preemptions"] > 0 and on["preemptions"] > 0
    assert off["recompute_tax"] > 0.2 and off["kv_swap"] is None
    swap = on["kv_swap"]
    assert swap["swapped_victims"] == swap["victims"] == on["preemptions"] and swap["refusals"] == {}
    assert swap["swapped_in_tokens"] == swap["swapped_out_tokens"] > 0
    # what comes back is not recomputed: only each victim's partial last block is
    for record in result.records:
        if record.preemptions:
            assert record.swapped_in_tokens > 0
            assert record.recomputed_tokens < 16 * record.preemptions
    assert on["recompute_tax"] < off["recompute_tax"] / 10
    assert on["recomputed_tokens"] + swap["swapped_in_tokens"] >= off["recomputed_tokens"] * 0.5
    assert "KV swapped for" in format_table({"fcfs": on}) and "KV swapped" not in format_table({"fcfs": off})


def test_each_step_is_charged_its_host_transfers_over_the_link(small_profile) -> None:
    profile = _profile(small_profile)
    result, figures, scheduler = _run(profile, swap=True)
    cost = StepCostModel(profile)
    block = profile.engine.block_size
    moved = 0
    for output in scheduler.outputs:
        plan = harness.connector_plan(output)
        moved += sum(len(s.block_ids) for s in plan.saves) + sum(len(l.block_ids) for l in plan.loads)
    swap = figures["kv_swap"]
    assert moved * block == swap["swapped_out_tokens"] + swap["swapped_in_tokens"]
    assert swap["transfer_s"] == pytest.approx(moved * block * 131072 / 55e9, abs=1e-6)  # rounded to the microsecond
    # over a 2x slower link (27.5 GB/s: swapping still beats recomputing) the same victims' transfers
    # take 2x longer, and the GPU is busy that much longer
    slow, slow_figures, _ = _run(_profile(small_profile, link_gb_s=27.5), swap=True)
    assert slow_figures["kv_swap"]["swapped_victims"] == swap["swapped_victims"] > 0
    assert slow_figures["kv_swap"]["transfer_s"] == pytest.approx(2 * swap["transfer_s"], rel=0.02)
    assert slow.busy_s - result.busy_s == pytest.approx(swap["transfer_s"], rel=0.1)
    assert cost.host_transfer_seconds(block) == pytest.approx(block * 131072 / 55e9)


def _victims_counted(choice: str, reason: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("slaq_engine_kv_swap_victims_total", {"tier": "standard", "choice": choice, "reason": reason}) or 0.0


def test_a_victim_is_recomputed_when_the_link_makes_swapping_dearer(small_profile) -> None:
    # 0.01 GB/s: 2 x 13 ms per token out and back, against well under 1 ms per token of recompute
    _, off, _ = _run(_profile(small_profile), swap=False)
    recomputed, swapped = _victims_counted("recomputed", "cost"), _victims_counted("swapped", "cost")
    _, figures, _ = _run(_profile(small_profile, link_gb_s=0.01), swap=True)
    swap = figures["kv_swap"]
    assert swap["victims"] > 0 and swap["swapped_victims"] == 0 and swap["refusals"] == {CHEAPER_TO_RECOMPUTE: swap["victims"]}
    # the engine's metrics count the choice by tier (the requests here are all standard)
    assert _victims_counted("recomputed", "cost") - recomputed == swap["victims"] and _victims_counted("swapped", "cost") == swapped
    assert swap["rule"]["seal_and_open_s_per_token"] == pytest.approx(2 * 131072 / 0.01e9)
    assert swap["transfer_s"] == 0.0 and figures["recompute_tax"] == off["recompute_tax"]


def test_with_the_measured_sealing_cost_every_victim_is_recomputed_on_an_h200(small_profile) -> None:
    # the connector's host-side sealing (1.26 GB/s measured) makes a swap ~7x dearer than
    # recomputing on an H200: the rule recomputes, and the run is the run without swap
    profile = _profile(small_profile)
    sealed = profile.model_copy(update={"gpu": profile.gpu.model_copy(update={"host_seal_gb_s": 1.26})})
    _, off, _ = _run(profile, swap=False)
    _, figures, _ = _run(sealed, swap=True)
    swap = figures["kv_swap"]
    assert swap["victims"] > 0 and swap["refusals"] == {CHEAPER_TO_RECOMPUTE: swap["victims"]}
    assert figures["recompute_tax"] == off["recompute_tax"] and figures["kv_swap"]["host_seal_gb_s"] == 1.26


def test_a_full_host_cache_means_recompute(small_profile) -> None:
    # 4 MiB of host memory: two 2 MiB blocks, less than any victim's KV
    _, off, _ = _run(_profile(small_profile), swap=False)
    _, figures, _ = _run(_profile(small_profile, host_gib=4 / 1024), swap=True)
    swap = figures["kv_swap"]
    assert swap["victims"] > 0 and swap["swapped_victims"] == 0 and swap["refusals"] == {NO_ROOM: swap["victims"]}
    assert figures["recompute_tax"] == off["recompute_tax"]


def test_kv_swap_both_runs_the_connector_policies_twice() -> None:
    runs = swap_variants([policy("fcfs"), policy("slaq")], "both")
    assert [(spec.name, swap) for spec, swap in runs] == [("fcfs", True), ("slaq", True), ("slaq" + NO_SWAP_SUFFIX, False)]
    assert [(spec.name, swap) for spec, swap in swap_variants([policy("slaq")], "off")] == [("slaq", False)]
    with pytest.raises(WorkloadError, match="--kv-swap"):
        swap_variants([policy("slaq")], "maybe")


# -- one rule: the engine's and the simulator's decisions for the same inputs ------------------------

SEAL_GB_S = 4.0  # one way: 2 x 131072 B / 4 GB/s = 65.5 us per token out and back, inside the learned range below


def _slaq_scheduler(profile, kv_transfer_config: str, spec: SchedulerSpec = SchedulerSpec()):
    cls = type("Configured", (SLAScheduler,), {"config_override": EngineSchedulerConfig(spec=spec)})
    return harness.build_scheduler(cls, harness.engine_setup(profile, "priority", kv_transfer_config=kv_transfer_config))


def test_the_engine_and_the_simulator_make_the_same_swap_decisions_for_the_same_inputs(small_profile) -> None:
    """The simulator's engine gets its connector config from the pool profile (`bench.kv_swap`), a
    pod's from `slaq engine`'s flags (`launcher`); both schedulers install the rule themselves. Fed
    the same measured steps and the same victims, they decide alike, and the decisions flip both ways
    as the learned step time crosses the seal cost (the inputs exercise the rule)."""
    gpu = small_profile.gpu.model_copy(update={"host_link_gb_s": SEAL_GB_S, "host_seal_gb_s": None})
    profile = small_profile.model_copy(update={"gpu": gpu})
    simulated = _slaq_scheduler(profile, transfer_config(profile))
    engine = _slaq_scheduler(profile, kv_transfer_config(EngineOptions(kv_erase=False, kv_host_cache_gib=profile.engine.kv_host_cache_gib,
                                                                  kv_seal_gb_s=SEAL_GB_S)))
    rules = [harness.scheduler_connector(s).planner.swap.choice for s in (simulated, engine)]
    assert all(isinstance(r, SwapOrRecompute) for r in rules)
    assert rules[0].step_model is simulated.step_model and rules[1].step_model is engine.step_model
    ledgers = [SwapLedger(capacity_blocks=10_000, block_size=16, choice=r) for r in rules]
    decisions: list[list[bool]] = [[], []]
    # Steps of 256 to 2,048 tokens whose cost per token rises from 20 us to 120 us and back.
    per_token = [20e-6 + 100e-6 * abs(((i % 80) - 40) / 40) for i in range(400)]
    for i, cost in enumerate(per_token):
        tokens = 256 * (1 + i % 8)
        for scheduler in (simulated, engine):
            scheduler.step_model.observe(tokens, 0.004 + cost * tokens)
        for n, ledger in enumerate(ledgers):
            order = ledger.preempted(f"v{i}", HeldBlocks("acme", list(range(8)), 16 * (1 + i % 8)))
            decisions[n].append(isinstance(order, SaveOrder))
            ledger.forget(f"v{i}")
    assert decisions[0] == decisions[1]
    assert 0.1 < sum(decisions[0]) / len(decisions[0]) < 0.9, "the inputs never flipped the rule"
    assert rules[0].transfer_seconds(1000) == rules[1].transfer_seconds(1000) == pytest.approx(1000 * 131072 / 4e9)


def test_a_scheduler_without_a_learned_step_budget_still_prices_recompute_with_measured_steps(small_profile) -> None:
    scheduler = _slaq_scheduler(small_profile, transfer_config(small_profile), SchedulerSpec(tpot_budget_shaping=False))
    assert not hasattr(scheduler.step_budget, "model")
    rule = harness.scheduler_connector(scheduler).planner.swap.choice
    assert rule.step_model is scheduler.step_model and isinstance(scheduler.step_model, StepTimeModel)
