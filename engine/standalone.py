"""A vLLM 0.32 scheduler without a model runner, for tests, benchmarks and simulators.

Built the way vLLM's own tests/v1/core/test_scheduler.py builds one: a real VllmConfig and
KVCacheConfig (the tiny model's config, one full-attention group), real Requests, and
`schedule()` / `update_from_output()` answered with synthetic model outputs (one sampled token
per request past its prompt). Building a scheduler this way reaches into vLLM's internals like
`vllm_compat` does; tests/engine/test_vllm_compat.py covers it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from slaq.api.common import Tier
from slaq.api.contract import RequestSLA
from slaq.engine.config import EngineSchedulerConfig
from slaq.engine.scheduler import SLAScheduler
from slaq.engine.tiny_model import ensure_tiny_model

BLOCK_SIZE = 16
SAMPLED_TOKEN = 7
_HASH = get_hash_fn_by_name("sha256")
init_none_hash(_HASH)
_BLOCK_HASHER = get_request_block_hasher(BLOCK_SIZE, _HASH)
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
) -> AsyncScheduler:
    path = str(ensure_tiny_model())
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        async_scheduling=True,
        policy="priority",
        is_encoder_decoder=False,
    )
    model_config = ModelConfig(model=path, tokenizer=path, dtype="float32", seed=0, skip_tokenizer_init=True, max_model_len=max_model_len)
    cache_config = CacheConfig(block_size=BLOCK_SIZE, cache_dtype="auto", enable_prefix_caching=enable_prefix_caching)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32))],
    )
    cache_config.num_gpu_blocks = num_blocks
    if issubclass(scheduler_cls, SLAScheduler):
        scheduler_cls = type(scheduler_cls.__name__, (scheduler_cls,), {"config_override": config or EngineSchedulerConfig()})
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
        log_stats=True,
    )


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
) -> Request:
    """A request as the sidecar would send it: vLLM priority by tier, SLA facts in extra_args."""
    number = next(_ids)
    seed = number if prompt_seed is None else prompt_seed
    if ttft_ms is None and tier is Tier.CRITICAL:
        ttft_ms = 500.0
    sla = RequestSLA(tenant=tenant, tier=tier, ttft_ms=ttft_ms, tpot_ms=tpot_ms, arrival=arrival, predicted_output=max_tokens)
    return Request(
        request_id=f"{tier.value}-{tenant}-{number}",
        prompt_token_ids=[(seed * 31 + i) % 500 + 3 for i in range(prompt_tokens)],
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=sla.to_xargs()),
        pooling_params=None,
        arrival_time=arrival,
        priority=tier.rank,
        block_hasher=_BLOCK_HASHER,
    )


@dataclass
class Driver:
    """Steps a scheduler as the engine core does, one model step per schedule() (no overlap)."""

    scheduler: AsyncScheduler
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
        self.preempted.append(set(output.preempted_req_ids or ()))
        ids = list(output.num_scheduled_tokens)
        for request_id in ids:
            self.first_scheduled_step.setdefault(request_id, self.steps)
        sampled = [[] if self.scheduler.requests[r].is_prefill_chunk else [SAMPLED_TOKEN] for r in ids]
        runner_output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled)
        for engine_outputs in self.scheduler.update_from_output(output, runner_output).values():
            for out in engine_outputs.outputs:
                if out.finish_reason is not None:
                    self.finished.add(out.request_id)

    def run_until_idle(self, max_steps: int = 2000) -> None:
        while self.scheduler.has_requests():
            assert self.steps < max_steps, "requests did not finish"
            self.step()


def free_blocks(scheduler: AsyncScheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
