"""Pool profiles: the engine settings and the step-time model parameters the simulator runs with.

A profile is a YAML file (see `tools/src/slaq/bench/models/h200-llama3-8b.yaml`, the default). The KV-cache
size follows from it the way vLLM sizes it: GPU memory times utilisation, minus weights and
the activation reserve, divided by the KV bytes of one block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slaq.bench.errors import ProfileError

MODELS_DIR = Path(__file__).resolve().parent / "models"
DEFAULT_PROFILE = "h200-llama3-8b"

Positive = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelShape(_Strict):
    """A decoder-only transformer with grouped-query attention and a gated MLP (Llama family)."""

    name: str
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    intermediate_size: PositiveInt
    vocab_size: PositiveInt
    dtype_bytes: PositiveInt = 2
    max_model_len: PositiveInt = 8192

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h
        mlp = 3 * h * self.intermediate_size
        return self.num_layers * (attention + mlp)

    @property
    def lm_head_params(self) -> int:
        return self.hidden_size * self.vocab_size

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight (embedding, layers, LM head)."""
        return (self.layer_params + 2 * self.lm_head_params) * self.dtype_bytes

    @property
    def streamed_weight_bytes(self) -> int:
        """Bytes a forward pass reads from HBM (the embedding is a gather, not a full read)."""
        return (self.layer_params + self.lm_head_params) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


class GpuSpec(_Strict):
    name: str
    peak_tflops: Positive
    hbm_tb_s: Positive
    memory_gb: Positive
    compute_efficiency: Fraction
    bandwidth_efficiency: Fraction
    step_overhead_s: Annotated[float, Field(ge=0)] = 0.0
    # GPU <-> host memory link (PCIe 5.0 x16 on an H200 SXM: ~55 GB/s achieved of 64 GB/s per
    # direction): what swapping a preempted request's KV out to host memory and back costs.
    host_link_gb_s: Positive = 55.0
    # The host-side work of slaq's KV connector per byte swapped, each way (AES-GCM sealing or
    # opening and the host copies around it, one block after another on one host thread), which
    # adds to the link's time: `python -m slaq.engine.kv_security.seal_cost` measures it. None:
    # not counted (as if sealing ran off the step's critical path).
    host_seal_gb_s: Positive | None = None


class EngineSettings(_Strict):
    max_num_seqs: PositiveInt = 256
    max_num_batched_tokens: PositiveInt = 8192
    enable_chunked_prefill: bool = True
    block_size: PositiveInt = 16
    gpu_memory_utilization: Fraction = 0.9
    activation_reserve_gb: Annotated[float, Field(ge=0)] = 4.0
    num_gpu_blocks: PositiveInt | None = Field(default=None, description="Overrides the size computed from GPU memory.")
    # Host memory holding preempted requests' KV (slaq engine's `--kv-host-cache-gib`); 0: no swap, every
    # preempted request is recomputed; None (the default): derived from the model, one full context's KV
    # (`PoolProfile.host_cache_gib`: 1 GiB for an 8B Llama at 8k tokens, 16 GiB at 128k).
    kv_host_cache_gib: Annotated[float, Field(ge=0)] | None = None


class PoolProfile(_Strict):
    name: str
    model: ModelShape
    gpu: GpuSpec
    engine: EngineSettings = Field(default_factory=EngineSettings)

    @property
    def host_cache_gib(self) -> float:
        """The host cache for swapped KV: as set, or one request of `max_model_len` tokens' KV, so the
        longest context a victim can hold fits it once (a smaller cache refuses exactly the long contexts
        whose recompute costs most)."""
        if self.engine.kv_host_cache_gib is not None:
            return self.engine.kv_host_cache_gib
        return self.model.max_model_len * self.model.kv_bytes_per_token / 2**30

    @property
    def num_gpu_blocks(self) -> int:
        if self.engine.num_gpu_blocks is not None:
            return self.engine.num_gpu_blocks
        free = self.gpu.memory_gb * 1e9 * self.engine.gpu_memory_utilization - self.model.weight_bytes - self.engine.activation_reserve_gb * 1e9
        blocks = int(free // (self.model.kv_bytes_per_token * self.engine.block_size))
        if blocks < 1:
            raise ProfileError(f"profile {self.name}: the model's weights leave no GPU memory for the KV cache")
        return blocks


def with_kv_swap(profile: PoolProfile, *, host_cache_gib: float | None = None, seal_gb_s: float | None = None,
                 seal_counted: bool = True) -> PoolProfile:
    """The profile with another host cache size (`--kv-host-cache-gib`) or host-side seal
    throughput (`--kv-seal-gb-s`; `seal_counted=False`: not counted)."""
    engine, gpu = profile.engine, profile.gpu
    if host_cache_gib is not None:
        if not host_cache_gib >= 0:
            raise ProfileError(f"--kv-host-cache-gib must be 0 or more, got {host_cache_gib}")
        engine = engine.model_copy(update={"kv_host_cache_gib": host_cache_gib})
    if seal_gb_s is not None and not seal_gb_s > 0:
        raise ProfileError(f"--kv-seal-gb-s must be a positive number or off, got {seal_gb_s}")
    if seal_gb_s is not None or not seal_counted:
        gpu = gpu.model_copy(update={"host_seal_gb_s": seal_gb_s if seal_counted else None})
    return profile.model_copy(update={"engine": engine, "gpu": gpu})


def _profile_path(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if not path.suffix:
        path = MODELS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        bundled = ", ".join(sorted(p.stem for p in MODELS_DIR.glob("*.yaml")))
        raise ProfileError(f"profile not found: {name_or_path} (a YAML path, or one of: {bundled})")
    return path


def _merged(base: dict, override: dict) -> dict:
    """`base` with `override`'s keys in place, sections merged key by key."""
    merged = dict(base)
    for key, value in override.items():
        merged[key] = _merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def _profile_data(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A profile file's settings; `extends: NAME` (a bundled name or a path beside it) starts from that
    profile's and changes only what the file sets (e.g. a longer `model.max_model_len`)."""
    if path.resolve() in seen:
        raise ProfileError(f"{path}: `extends` loops back to {path.name}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile is a mapping of name, model, gpu and engine")
    base = data.pop("extends", None)
    if base is None:
        return data
    base_path = _profile_path(base if Path(str(base)).suffix == "" else path.parent / str(base))
    return _merged(_profile_data(base_path, (*seen, path.resolve())), data)


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> PoolProfile:
    """A profile by file path, or by name from the bundled `tools/src/slaq/bench/models/` folder."""
    path = _profile_path(name_or_path)
    data = _profile_data(path)
    try:
        return PoolProfile.model_validate(data)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ProfileError(f"{path}: {fields}") from exc
