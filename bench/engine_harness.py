"""Every touch point between the simulator and vLLM 0.32's internals, in one place.

vLLM's scheduler classes are not a public API; the simulator builds them the way vLLM's own
tests do (`tests/v1/core/utils.py`: a `VllmConfig`, a `KVCacheConfig` with one full-attention
group, a `StructuredOutputManager`), feeds them `Request`s and answers each `SchedulerOutput`
with a synthetic `ModelRunnerOutput`. `tests/bench/test_engine_harness.py` checks each touch point,
so a vLLM upgrade shows exactly what broke.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from slaq.bench.pool_profile import PoolProfile

# The "model" samples FILLER_TOKEN until the request's true output length, then STOP_TOKEN:
# the scheduler learns the length only when the request stops, as with a real model.
FILLER_TOKEN = 1
STOP_TOKEN = 2


@dataclass(frozen=True)
class EngineSetup:
    """What building a scheduler needs, made once per profile and policy."""

    vllm_config: Any
    kv_cache_config: Any
    block_size: int


def _model_dir(profile: PoolProfile) -> str:
    # vLLM's ModelConfig reads a Hugging Face config.json; the profile is the single source of
    # the shape, so the file is written from it (no tokenizer, no weights: nothing runs).
    model = profile.model
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.max_model_len,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    folder = Path(tempfile.mkdtemp(prefix="slaq-bench-model-"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(folder)


@functools.lru_cache(maxsize=4)
def _model_config(profile_json: str) -> Any:
    from vllm.config import ModelConfig

    profile = PoolProfile.model_validate_json(profile_json)
    return ModelConfig(
        model=_model_dir(profile),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=profile.model.max_model_len,
        seed=0,
    )


def engine_setup(profile: PoolProfile, scheduling_policy: str, *, kv_transfer_config: str | None = None) -> EngineSetup:
    """vLLM configs for one engine of the profile, with `scheduling_policy` (`fcfs` or `priority`)
    and, given a `--kv-transfer-config` value, the KV connector it names on the scheduler side."""
    import torch
    from vllm.config import CacheConfig, KVTransferConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

    engine, model = profile.engine, profile.model
    scheduler_config = SchedulerConfig(
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_model_len=model.max_model_len,
        enable_chunked_prefill=engine.enable_chunked_prefill,
        async_scheduling=True,
        policy=scheduling_policy,
        is_encoder_decoder=False,
    )
    # Prefix caching is off: the simulated prompts are token-count placeholders, and
    # identical placeholder ids would hit the cache as no real prompts would.
    cache_config = CacheConfig(block_size=engine.block_size, enable_prefix_caching=False)
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=_model_config(profile.model_dump_json()),
        cache_config=cache_config,
        # As `--kv-transfer-config` does: vLLM then also turns off the hybrid KV cache manager.
        kv_transfer_config=KVTransferConfig(**json.loads(kv_transfer_config)) if kv_transfer_config else None,
    )
    num_blocks = profile.num_gpu_blocks
    block_bytes = model.kv_bytes_per_token * engine.block_size
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        # Nothing is allocated; the size is what a connector reads to know the bytes of a block.
        kv_cache_tensors=[KVCacheTensor(size=num_blocks * block_bytes, layers=["model.layers"],
                                        layer_stride=num_blocks * block_bytes, block_stride=block_bytes)],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["model.layers"],
                FullAttentionSpec(block_size=engine.block_size, num_kv_heads=model.num_kv_heads, head_size=model.head_dim, dtype=torch.bfloat16),
            )
        ],
    )
    cache_config.num_gpu_blocks = num_blocks
    return EngineSetup(vllm_config, kv_cache_config, engine.block_size)


def build_scheduler(scheduler_cls: type, setup: EngineSetup, **extra: Any) -> Any:
    """An instance of `scheduler_cls` (an AsyncScheduler or subclass) as vLLM's engine core builds it."""
    from vllm.v1.structured_output import StructuredOutputManager

    return scheduler_cls(
        vllm_config=setup.vllm_config,
        kv_cache_config=setup.kv_cache_config,
        structured_output_manager=StructuredOutputManager(setup.vllm_config),
        block_size=setup.block_size,
        log_stats=False,
        **extra,
    )


def make_request(request_id: str, prompt_tokens: int, *, max_tokens: int, arrival_time: float,
                 priority: int, extra_args: dict[str, Any]) -> Any:
    """A vLLM Request as the OpenAI server hands it to the engine core, enrichment in extra_args."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP_TOKEN], extra_args=dict(extra_args))
    return Request(
        request_id=request_id,
        prompt_token_ids=[FILLER_TOKEN] * prompt_tokens,
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival_time,
        priority=priority,
    )


def model_runner_output(req_ids: list[str], sampled: dict[str, int]) -> Any:
    """What the GPU worker returns for a step: one token for each request that samples, none for prefill chunks."""
    from vllm.v1.outputs import ModelRunnerOutput

    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=[[sampled[rid]] if rid in sampled else [] for rid in req_ids],
    )


@dataclass(frozen=True, slots=True)
class StepShare:
    """One request's part of a scheduled step, read right after `schedule()` returned."""

    request_id: str
    new_tokens: int
    context_tokens: int  # tokens in the KV cache before this step
    output_index: int | None  # which output token the step samples (0 = first), None for a prompt chunk


def step_shares(output: Any, requests: dict[str, Any]) -> Iterator[StepShare]:
    """What a SchedulerOutput asks the GPU to do. With async scheduling `num_computed_tokens`
    already counts this step's tokens, and `is_prefill_chunk` says whether the step samples."""
    for request_id, new in output.num_scheduled_tokens.items():
        request = requests[request_id]
        computed = request.num_computed_tokens
        index = None if request.is_prefill_chunk else computed - request.num_prompt_tokens
        yield StepShare(request_id, new, computed - new, index)


def scheduled_ids(output: Any) -> list[str]:
    return list(output.num_scheduled_tokens)


def step_has_tokens(output: Any) -> bool:
    return output.total_num_scheduled_tokens > 0


def total_scheduled_tokens(output: Any) -> int:
    return output.total_num_scheduled_tokens


def deliveries(engine_outputs: dict[int, Any]) -> Iterator[tuple[str, int, bool]]:
    """(request id, tokens delivered, finished) for every output `update_from_output` returned."""
    for outputs in engine_outputs.values():
        for out in outputs.outputs:
            yield out.request_id, len(out.new_token_ids), out.finish_reason is not None


def preempted_ids(output: Any) -> set[str]:
    """The requests `schedule()` preempted to produce `output`."""
    return set(output.preempted_req_ids or ())


def connector_plan(output: Any) -> Any | None:
    """The plan slaq's KV connector put in the step's `kv_connector_metadata` (None without one)."""
    metadata = getattr(output, "kv_connector_metadata", None)
    return getattr(metadata, "plan", None)


def scheduler_connector(scheduler: Any) -> Any | None:
    """The scheduler-side KV connector vLLM built from the config (None without one)."""
    return getattr(scheduler, "connector", None)


def preemptions(request: Any) -> int:
    return request.num_preemptions


def engine_gauges(scheduler: Any) -> tuple[int, int, float]:
    """(waiting, running, KV cache use 0..1) as the engine exports them on /metrics
    (`vllm:num_requests_waiting`, `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`): vLLM's
    `make_stats` counts deferred requests apart from the waiting ones."""
    running, waiting = scheduler.get_request_counts()
    return waiting - len(scheduler.deferred_waiting), running, scheduler.get_kv_cache_usage()
