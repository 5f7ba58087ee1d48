"""A vLLM 0.32 scheduler without a model runner, for tests, benchmarks and simulators.

The tiny model's config, one full-attention KV cache group, prefix caching on, real Requests, and
`schedule()` / `update_from_output()` answered with synthetic model outputs (one sampled token
per request past its prompt). The scheduler is built by `slaq.engine.vllm_compat.offline`, the
one builder the bench harness uses too; tests/engine/test_vllm_compat.py covers it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from slaq.api.common import Tier
from slaq.api.contract import RequestSLA
from slaq.engine import vllm_compat as vc
from slaq.engine.config import EngineSchedulerConfig
from slaq.engine.scheduler import SLAScheduler
from slaq.engine.tiny_model import ensure_tiny_model
from slaq.engine.vllm_compat import Request, SchedulerOutput, offline

BLOCK_SIZE = 16
SAMPLED_TOKEN = 7
_ids = itertools.count()


def build_scheduler(
    scheduler_cls: type = SLAScheduler,
    *,
    config: EngineSchedulerConfig | None = None,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 512,
    num_blocks: int = 1000,
    max_model_len: int = 512,
    enable_prefix_caching: bool = True,
) -> vc.AsyncScheduler:
    shape = offline.EngineShape(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
        num_blocks=num_blocks, block_size=BLOCK_SIZE, policy="priority", enable_prefix_caching=enable_prefix_caching,
    )
    model = offline.model_config(str(ensure_tiny_model()), "float32", max_model_len)
    if issubclass(scheduler_cls, SLAScheduler):
        scheduler_cls = type(scheduler_cls.__name__, (scheduler_cls,), {"config_override": config or EngineSchedulerConfig()})
    return offline.build_scheduler(scheduler_cls, offline.engine_setup(model, shape), log_stats=True)


def make_request(
    tier: Tier,
    *,
    tenant: str = "t",
    prompt_tokens: int = 32,
    max_tokens: int = 16,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    arrival: float | None = None,
    prompt_seed: int | None = None,
    request_id: str | None = None,
) -> Request:
    """A request as the sidecar would send it: vLLM priority by tier, SLA facts in extra_args
    (`request_id`: the sidecar's id, which the engine's audit line carries)."""
    number = next(_ids)
    seed = number if prompt_seed is None else prompt_seed
    if ttft_ms is None and tier is Tier.CRITICAL:
        ttft_ms = 500.0
    sla = RequestSLA(tenant=tenant, tier=tier, ttft_ms=ttft_ms, tpot_ms=tpot_ms, arrival=arrival, predicted_output=max_tokens,
                     request_id=request_id)
    return offline.new_request(
        f"{tier.value}-{tenant}-{number}",
        [(seed * 31 + i) % 500 + 3 for i in range(prompt_tokens)],
        max_tokens=max_tokens,
        arrival_time=arrival,
        priority=tier.rank,
        extra_args=sla.to_xargs(),
        ignore_eos=True,
        block_hasher=offline.prefix_block_hasher(BLOCK_SIZE),
    )


@dataclass
class Driver:
    """Steps a scheduler as the engine core does, one model step per schedule() (no overlap)."""

    scheduler: vc.AsyncScheduler
    finished: set[str] = field(default_factory=set)
    first_scheduled_step: dict[str, int] = field(default_factory=dict)
    preempted: list[set[str]] = field(default_factory=list)
    steps: int = 0

    def add(self, *requests: Request) -> None:
        for request in requests:
            self.scheduler.add_request(request)

    def step(self) -> SchedulerOutput:
        output = self.scheduler.schedule()
        self.answer(output)
        return output

    def answer(self, output: SchedulerOutput) -> None:
        """Feed the synthetic model output of a step back to the scheduler."""
        self.steps += 1
        self.preempted.append(set(vc.preempted_ids(output)))
        ids = offline.scheduled_ids(output)
        for request_id in ids:
            self.first_scheduled_step.setdefault(request_id, self.steps)
        sampled = [[SAMPLED_TOKEN] if offline.samples(self.scheduler, r) else [] for r in ids]
        runner_output = offline.model_runner_output(ids, sampled)
        for request_id, _, finished in offline.deliveries(self.scheduler.update_from_output(output, runner_output)):
            if finished:
                self.finished.add(request_id)

    def run_until_idle(self, max_steps: int = 2000) -> None:
        while self.scheduler.has_requests():
            assert self.steps < max_steps, "requests did not finish"
            self.step()


def free_blocks(scheduler: vc.AsyncScheduler) -> int:
    return vc.free_blocks(vc.block_manager(scheduler))
