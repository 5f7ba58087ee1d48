"""The pool's measured capacity: the request rate one engine sustains on a workload's request mix.

Measured, not computed: the workload's requests (cycled until there are at least ten times
`max_num_seqs` of them, so that a full engine reaches its steady state) all arrive at time 0 and
stock vLLM `fcfs` serves them through the simulator; capacity is the completion rate between
the moments 10 % and 90 % of them have finished (the ramp-up and the drain of a closed batch
are left out). `--load X` then sets the mean arrival
rate to X times this figure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from slaq.api.common import Tier
from slaq.bench import engine_harness as harness
from slaq.bench.errors import SimulationError
from slaq.bench.policies import policy
from slaq.bench.pool_profile import PoolProfile
from slaq.bench.simulator import Simulator
from slaq.bench.stepcost import StepCostModel
from slaq.bench.workload import BenchRequest, TierObjectives, all_at_once

CAPACITY_METHOD = (
    "the workload's request lengths (cycled to >= 10 x max_num_seqs requests) all at t=0 through "
    "stock vLLM fcfs in the simulator; completions per second between 10 % and 90 % finished"
)
STEADY_STATE_FACTOR = 10


@dataclass(frozen=True)
class Capacity:
    requests_per_s: float
    output_tokens_per_s: float
    method: str = CAPACITY_METHOD


def measure_capacity(requests: Sequence[BenchRequest], profile: PoolProfile,
                     objectives: dict[Tier, TierObjectives]) -> Capacity:
    if len(requests) < 10:
        raise SimulationError("measuring capacity needs at least 10 requests")
    wanted = max(len(requests), STEADY_STATE_FACTOR * profile.engine.max_num_seqs)
    cycled = [replace(requests[i % len(requests)], request_id=f"c{i:07d}") for i in range(wanted)]
    spec = policy("fcfs")
    scheduler = harness.build_scheduler(spec.load(), harness.engine_setup(profile, spec.scheduling_policy))
    result = Simulator(scheduler, StepCostModel(profile), all_at_once(cycled), objectives, policy_name="capacity").run()
    done = sorted(r.last_token_s for r in result.records if r.finished and r.last_token_s is not None)
    if len(done) < 10:
        raise SimulationError("too few requests finished to measure capacity")
    low, high = done[len(done) // 10], done[(9 * len(done)) // 10]
    if high <= low:
        raise SimulationError("capacity run finished its requests too close together to measure a rate")
    count = (9 * len(done)) // 10 - len(done) // 10
    tokens = sum(r.tokens_out for r in result.records if r.finished and low < r.last_token_s <= high)
    return Capacity(requests_per_s=count / (high - low), output_tokens_per_s=tokens / (high - low))
