"""KV swap in the simulator: slaq's own KV connector in the loop, its host transfers charged to the steps.

- Which engines: those whose pod ships slaq's KV connector (`PolicySpec.ships_kv_connector`:
  `slaq`; `slaq engine` loads it for the slaq scheduler only). Stock vLLM recomputes its victims.
- The connector: the real `SlaqKVConnector`, which vLLM builds on the scheduler side from the same
  `--kv-transfer-config` the launcher writes, with `profile.host_cache_gib` of host
  memory. Its planner sees every preemption and readmission through vLLM's connector calls and
  decides which victims are sealed into host memory and which readmitted requests load their KV
  back instead of computing it (vLLM then counts those tokens as computed). Erase is off here: it
  changes no scheduling decision in the simulator, and its GPU time (a memory-bound store, about
  1 us per 2 MiB block on an H200, not measured) is not modelled.
- Swap or recompute, per victim: the engine's own rule (`slaq.engine.kv_security.swap.SwapOrRecompute`),
  installed by the slaq scheduler as in a pod: its learned step-time model (from the simulated step
  durations) prices the recompute, and the connector's `hostSealGbS`, which `transfer_config` sets to
  the profile's host throughput (the link and, when the profile has `gpu.host_seal_gb_s`, the
  sealing, one after the other), prices the seal and the open. A stock scheduler given the connector
  (tests only: no pod ships that) gets the same rule with a step-time model this account teaches
  from the simulated steps. A victim the host cache cannot hold is recomputed.
- Cost: the connector's worker seals the step's victims and fills its readmitted requests' blocks
  before the forward pass, synchronously (`handle_preemptions`, `start_load_kv`;
  `wait_for_layer_load` returns at once), block after block: copy over the host link, then
  AES-GCM on one host thread (or the reverse). Nothing overlaps them, so the step that carries a
  plan takes `host_transfer_seconds(tokens sealed + tokens loaded)` longer: the link's time plus,
  when the profile has `gpu.host_seal_gb_s`, the sealing's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from slaq.bench import engine_harness as harness
from slaq.bench.pool_profile import PoolProfile
from slaq.bench.stepcost import StepCostModel
from slaq.engine.kv_security.settings import KVSecuritySettings, transfer_config_json
from slaq.engine.kv_security.swap import SwapLedger
from slaq.engine.tpot_budget import StepTimeModel

if TYPE_CHECKING:
    from slaq.bench.simulator import RequestRecord

GIB = 2**30


def host_gb_s(profile: PoolProfile) -> float:
    """GB/s of one direction of a swap: the host link and the sealing one after the other (see stepcost)."""
    gpu = profile.gpu
    return 1.0 / (1.0 / gpu.host_link_gb_s + (1.0 / gpu.host_seal_gb_s if gpu.host_seal_gb_s else 0.0))


def transfer_config(profile: PoolProfile) -> str | None:
    """The `--kv-transfer-config` of an engine with the profile's host cache (None: 0 GiB, no swap)."""
    host_bytes = int(profile.host_cache_gib * GIB)
    if host_bytes <= 0:
        return None
    return transfer_config_json(KVSecuritySettings(erase=False, host_cache_bytes=host_bytes, seal_gb_s=host_gb_s(profile)))


@dataclass
class SwapAccount:
    """What the connector moved, step by step, and the time it cost."""

    cost: StepCostModel
    block_size: int
    ledger: SwapLedger  # the connector planner's (its refusal counts)
    step_model: StepTimeModel | None = None  # the rule's, when this account teaches it (a stock scheduler)
    victims: int = 0
    swapped_victims: int = 0
    tokens_out: int = 0
    tokens_in: int = 0
    transfer_s: float = 0.0

    @classmethod
    def install(cls, scheduler: Any, cost: StepCostModel) -> "SwapAccount":
        """The account that follows the scheduler's connector's plans. The slaq scheduler installed the
        swap rule itself; a stock scheduler's connector gets it here, with a model this account teaches."""
        connector = harness.scheduler_connector(scheduler)
        if connector is None or connector.planner is None or connector.planner.swap is None:
            raise ValueError("the scheduler has no KV connector with a host cache")
        ledger = connector.planner.swap
        step_model = None
        if ledger.choice is None:
            step_model = StepTimeModel()
            connector.use_step_model(step_model)
        return cls(cost, ledger.block_size, ledger, step_model)

    def charge(self, output: Any, records: Mapping[str, "RequestRecord"], compute_s: float = 0.0) -> float:
        """Seconds the step's host transfers add to it; the tokens moved go on the requests' records.
        `compute_s`: the step's own time, which the rule's step-time model learns when this account teaches it."""
        if self.step_model is not None:
            self.step_model.observe(harness.total_scheduled_tokens(output), compute_s)
        self.victims += len(harness.preempted_ids(output))
        plan = harness.connector_plan(output)
        if plan is None:
            return 0.0
        moved = 0
        for save in plan.saves:
            tokens = len(save.block_ids) * self.block_size
            records[save.request_id].swapped_out_tokens += tokens
            self.tokens_out += tokens
            moved += tokens
        for load in plan.loads:
            tokens = len(load.block_ids) * self.block_size
            records[load.request_id].swapped_in_tokens += tokens
            self.tokens_in += tokens
            moved += tokens
        self.swapped_victims += len(plan.saves)
        seconds = self.cost.host_transfer_seconds(moved)
        self.transfer_s += seconds
        return seconds

    def summary(self, profile: PoolProfile) -> dict[str, Any]:
        return {
            "host_cache_gib": round(profile.host_cache_gib, 6),
            "host_link_gb_s": profile.gpu.host_link_gb_s,
            "host_seal_gb_s": profile.gpu.host_seal_gb_s,
            "rule": None if self.ledger.choice is None else {
                "seal_and_open_s_per_token": 2 * self.ledger.choice.transfer_seconds(1),
                "recompute_s_per_token": self.ledger.choice.recompute_seconds(1)},
            "victims": self.victims,
            "swapped_victims": self.swapped_victims,
            "recomputed_victims": self.victims - self.swapped_victims,
            "refusals": dict(sorted(self.ledger.refusals.items())),
            "swapped_out_tokens": self.tokens_out,
            "swapped_in_tokens": self.tokens_in,
            "transfer_s": round(self.transfer_s, 6),
        }
