"""A vLLM 0.32 scheduler without a model runner: the one builder behind slaq.engine.standalone
(tests, `tools/src/slaq/bench/sched_overhead.py`) and slaq.bench.engine_harness (the simulator).

Built the way vLLM's own tests do (`tests/v1/core/utils.py`): a real `VllmConfig`, a
`KVCacheConfig` with one full-attention group, a `StructuredOutputManager`, real `Request`s, and
each `SchedulerOutput` answered with a synthetic `ModelRunnerOutput`. What the callers read back
from those objects is here too, so nothing outside this package touches them.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

KV_LAYERS = "model.layers"  # the one KV cache group's layer name (nothing reads it back)


@dataclass(frozen=True)
class EngineShape:
    """The engine arguments a scheduler is built from (mostly `vllm serve`'s flags of the same names)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_blocks: int  # `--num-gpu-blocks-override`
    block_size: int
    policy: str  # `--scheduling-policy`: fcfs or priority
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    num_kv_heads: int = 1
    head_size: int = 1
    kv_dtype: str = "float32"  # a torch dtype name
    block_bytes: int | None = None  # KV bytes of one block across layers; None: no KV tensor listed
    kv_transfer_config: str | None = None  # a `--kv-transfer-config` JSON value


@dataclass(frozen=True)
class EngineSetup:
    """What building a scheduler needs, made once per engine shape."""

    vllm_config: Any
    kv_cache_config: Any
    block_size: int


@functools.lru_cache(maxsize=4)
def model_config(model_dir: str, dtype: str, max_model_len: int) -> ModelConfig:
    """vLLM's ModelConfig of a Hugging Face config.json (no tokenizer loaded, nothing runs)."""
    return ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype=dtype, max_model_len=max_model_len, seed=0)


def engine_setup(model: ModelConfig, shape: EngineShape) -> EngineSetup:
    """The configs vLLM's engine core would hand a scheduler of this shape (one full-attention KV group)."""
    scheduler_config = SchedulerConfig(
        max_num_seqs=shape.max_num_seqs,
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_model_len=shape.max_model_len,
        enable_chunked_prefill=shape.enable_chunked_prefill,
        async_scheduling=True,
        policy=shape.policy,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=shape.block_size, cache_dtype="auto", enable_prefix_caching=shape.enable_prefix_caching)
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model,
        cache_config=cache_config,
        # As `--kv-transfer-config` does: vLLM then also turns off the hybrid KV cache manager.
        kv_transfer_config=KVTransferConfig(**json.loads(shape.kv_transfer_config)) if shape.kv_transfer_config else None,
    )
    blocks = shape.num_blocks
    # Nothing is allocated; a tensor's size is what a KV connector reads to know the bytes of a block.
    tensors = [] if shape.block_bytes is None else [
        KVCacheTensor(size=blocks * shape.block_bytes, layers=[KV_LAYERS], layer_stride=blocks * shape.block_bytes, block_stride=shape.block_bytes)]
    spec = FullAttentionSpec(block_size=shape.block_size, num_kv_heads=shape.num_kv_heads, head_size=shape.head_size, dtype=getattr(torch, shape.kv_dtype))
    kv_cache_config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=tensors, kv_cache_groups=[KVCacheGroupSpec([KV_LAYERS], spec)])
    cache_config.num_gpu_blocks = blocks
    return EngineSetup(vllm_config, kv_cache_config, shape.block_size)


def build_scheduler(scheduler_cls: type, setup: EngineSetup, *, log_stats: bool = False, **extra: Any) -> Any:
    """An instance of `scheduler_cls` (an AsyncScheduler or subclass) as vLLM's engine core builds it."""
    return scheduler_cls(
        vllm_config=setup.vllm_config,
        kv_cache_config=setup.kv_cache_config,
        structured_output_manager=StructuredOutputManager(setup.vllm_config),
        block_size=setup.block_size,
        log_stats=log_stats,
        **extra,
    )


# -- requests and what the model returns ---------------------------------------------------------
@functools.lru_cache(maxsize=4)
def prefix_block_hasher(block_size: int) -> Callable[[Request], list[Any]]:
    """The block hasher vLLM's engine gives every request when prefix caching is on (sha256)."""
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    return get_request_block_hasher(block_size, hash_fn)


def new_request(request_id: str, prompt_token_ids: list[int], *, max_tokens: int, arrival_time: float | None,
                priority: int, extra_args: dict[str, Any], ignore_eos: bool = False, stop_token_ids: list[int] | None = None,
                block_hasher: Callable[[Request], list[Any]] | None = None) -> Request:
    """A vLLM Request as the OpenAI server hands it to the engine core, enrichment in extra_args."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=stop_token_ids, extra_args=extra_args)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival_time,
        priority=priority,
        block_hasher=block_hasher,
    )


def model_runner_output(req_ids: Sequence[str], sampled_token_ids: list[list[int]]) -> ModelRunnerOutput:
    """What the GPU worker returns for a step: the tokens each request sampled (none for a prompt chunk)."""
    return ModelRunnerOutput(req_ids=list(req_ids), req_id_to_index={rid: i for i, rid in enumerate(req_ids)}, sampled_token_ids=sampled_token_ids)


def samples(scheduler: Any, request_id: str) -> bool:
    """Whether the step just scheduled for the request samples a token (it is past its prompt)."""
    return not scheduler.requests[request_id].is_prefill_chunk


# -- what a driver reads of a step ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StepShare:
    """One request's part of a scheduled step, read right after `schedule()` returned."""

    request_id: str
    new_tokens: int
    context_tokens: int  # tokens in the KV cache before this step
    output_index: int | None  # which output token the step samples (0 = first), None for a prompt chunk


def step_shares(output: SchedulerOutput, requests: dict[str, Any]) -> Iterator[StepShare]:
    """What a SchedulerOutput asks the GPU to do. With async scheduling `num_computed_tokens`
    already counts this step's tokens, and `is_prefill_chunk` says whether the step samples."""
    for request_id, new in output.num_scheduled_tokens.items():
        request = requests[request_id]
        computed = request.num_computed_tokens
        index = None if request.is_prefill_chunk else computed - request.num_prompt_tokens
        yield StepShare(request_id, new, computed - new, index)


def scheduled_ids(output: SchedulerOutput) -> list[str]:
    return list(output.num_scheduled_tokens)


def admissions(output: SchedulerOutput) -> int:
    """Requests the step admitted: new ones and resumed ones."""
    return len(output.scheduled_new_reqs) + len(output.scheduled_cached_reqs.resumed_req_ids)


def waiting_count(scheduler: Any) -> int:
    """Requests in the scheduler's waiting queue (not those holding KV while they wait)."""
    return len(scheduler.waiting)


def step_has_tokens(output: SchedulerOutput) -> bool:
    return output.total_num_scheduled_tokens > 0


def deliveries(engine_outputs: dict[int, Any]) -> Iterator[tuple[str, int, bool]]:
    """(request id, tokens delivered, finished) for every output `update_from_output` returned."""
    for outputs in engine_outputs.values():
        for out in outputs.outputs:
            yield out.request_id, len(out.new_token_ids), out.finish_reason is not None


def connector_plan(output: SchedulerOutput) -> Any | None:
    """The plan slaq's KV connector put in the step's `kv_connector_metadata` (None without one)."""
    metadata = getattr(output, "kv_connector_metadata", None)
    return getattr(metadata, "plan", None)


def preemptions(request: Request) -> int:
    return request.num_preemptions


def engine_gauges(scheduler: Any) -> tuple[int, int, float, list[int] | None]:
    """(waiting, running, KV cache use 0..1, waiting per tier rank or None) as the engine exports
    them on /metrics (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
    `vllm:kv_cache_usage_perc`, slaq's `slaq_engine_queue_depth{tier}`): vLLM's `make_stats` counts
    deferred requests apart from the waiting ones."""
    running, waiting = scheduler.get_request_counts()
    depth = getattr(scheduler.waiting, "depth_by_rank", None)  # slaq's queue (engine/src/slaq/engine/queue.py); stock vLLM has none
    return waiting - len(scheduler.deferred_waiting), running, scheduler.get_kv_cache_usage(), None if depth is None else list(depth())
