"""The simulator's engine: a vLLM scheduler shaped by a pool profile, its requests and model outputs.

Everything that touches vLLM is in its seam, `slaq.engine.vllm_compat.offline` (the builder
`slaq.engine.standalone` uses too); this module turns a `PoolProfile` into the engine arguments,
writes the model's config.json, and speaks the simulator's terms (token counts, the filler and
stop tokens). `tests/bench/test_engine_harness.py` checks each touch point, so a vLLM upgrade
shows exactly what broke.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from slaq.bench.pool_profile import PoolProfile

# The "model" samples FILLER_TOKEN until the request's true output length, then STOP_TOKEN:
# the scheduler learns the length only when the request stops, as with a real model.
FILLER_TOKEN = 1
STOP_TOKEN = 2


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


def engine_setup(profile: PoolProfile, scheduling_policy: str, *, kv_transfer_config: str | None = None) -> Any:
    """vLLM configs for one engine of the profile, with `scheduling_policy` (`fcfs` or `priority`)
    and, given a `--kv-transfer-config` value, the KV connector it names on the scheduler side."""
    from slaq.engine.vllm_compat import offline

    engine, model = profile.engine, profile.model
    shape = offline.EngineShape(
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_model_len=model.max_model_len,
        num_blocks=profile.num_gpu_blocks,
        block_size=engine.block_size,
        policy=scheduling_policy,
        enable_chunked_prefill=engine.enable_chunked_prefill,
        # Prefix caching is off: the simulated prompts are token-count placeholders, and
        # identical placeholder ids would hit the cache as no real prompts would.
        enable_prefix_caching=False,
        num_kv_heads=model.num_kv_heads,
        head_size=model.head_dim,
        kv_dtype="bfloat16",
        block_bytes=model.kv_bytes_per_token * engine.block_size,
        kv_transfer_config=kv_transfer_config,
    )
    return offline.engine_setup(_model_config(profile.model_dump_json()), shape)


@functools.lru_cache(maxsize=4)
def _model_config(profile_json: str) -> Any:
    from slaq.engine.vllm_compat import offline

    profile = PoolProfile.model_validate_json(profile_json)
    return offline.model_config(_model_dir(profile), "bfloat16", profile.model.max_model_len)


def build_scheduler(scheduler_cls: type, setup: Any, **extra: Any) -> Any:
    """An instance of `scheduler_cls` (an AsyncScheduler or subclass) as vLLM's engine core builds it."""
    from slaq.engine.vllm_compat import offline

    return offline.build_scheduler(scheduler_cls, setup, log_stats=False, **extra)


def make_request(request_id: str, prompt_tokens: int, *, max_tokens: int, arrival_time: float,
                 priority: int, extra_args: dict[str, Any]) -> Any:
    """A vLLM Request as the OpenAI server hands it to the engine core, enrichment in extra_args."""
    from slaq.engine.vllm_compat import offline

    return offline.new_request(request_id, [FILLER_TOKEN] * prompt_tokens, max_tokens=max_tokens, arrival_time=arrival_time,
                               priority=priority, extra_args=dict(extra_args), stop_token_ids=[STOP_TOKEN])


def model_runner_output(req_ids: list[str], sampled: dict[str, int]) -> Any:
    """What the GPU worker returns for a step: one token for each request that samples, none for prefill chunks."""
    from slaq.engine.vllm_compat import offline

    return offline.model_runner_output(req_ids, [[sampled[rid]] if rid in sampled else [] for rid in req_ids])



def _seam_readers() -> dict[str, Any]:
    """What the simulator reads of vLLM's objects, from the seam (slaq.engine.vllm_compat)."""
    from slaq.engine import vllm_compat as vc
    from slaq.engine.vllm_compat import offline

    return {
        "StepShare": offline.StepShare, "step_shares": offline.step_shares, "scheduled_ids": offline.scheduled_ids,
        "step_has_tokens": offline.step_has_tokens, "deliveries": offline.deliveries, "connector_plan": offline.connector_plan,
        "preemptions": offline.preemptions, "engine_gauges": offline.engine_gauges,
        "preempted_ids": vc.preempted_ids, "scheduler_connector": vc.kv_connector,
        "total_scheduled_tokens": vc.total_scheduled_tokens,
    }


def __getattr__(name: str) -> Any:
    # Resolved on first use, so importing the simulator's records (`slaq bench live` does) needs no vLLM.
    readers = _seam_readers()
    if name not in readers:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals().update(readers)  # from then on plain module attributes
    return readers[name]
