"""The GPU step-time model: seconds one engine step takes, from what the step carries.

A step carries, per scheduled request, `new` tokens starting at position `context` (tokens
already in its KV cache). Per step:

- linear FLOPs: 2 x (transformer layer parameters) per token, plus 2 x (LM head) per request
  that samples (vLLM computes logits only for the last position of each request);
- attention FLOPs: 4 x layers x (query heads x head dim) per (query, key) pair; a chunk of
  `new` tokens at `context` attends to `new x context + new^2 / 2` pairs (causal);
- bytes: the streamed weights once, plus each request's KV read (`context` tokens) and write
  (`new` tokens) at `kv_bytes_per_token`.

time = step_overhead + linear + attention, where each of the two kernel classes is its own
roofline: linear = max(linear FLOPs / F, weight bytes / B) and attention = max(attention FLOPs / F,
KV bytes / B), with F = peak FLOP/s x compute_efficiency and B = HBM bandwidth x
bandwidth_efficiency. The GEMMs and the attention kernels run one after the other in every
layer, so their times add; within each, compute and memory traffic overlap. All parameters
come from the profile.

Swapping a preempted request's KV to host memory and back (slaq's KV connector) moves
`kv_bytes_per_token` per token over the host link each way, and the connector's worker seals
(or opens) each block on the host after (before) it crosses, block after block:
`host_transfer_seconds` = bytes / host_link + bytes / host_seal (the second term only when the
profile has `host_seal_gb_s`). Computing
the same positions again costs `recompute_seconds`: the step time they add (their GEMM and
attention FLOPs, or their KV traffic if that is larger), without the per-step overhead and the
weight reads that the steps carrying them pay anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from slaq.bench.pool_profile import PoolProfile


@dataclass(frozen=True, slots=True)
class ScheduledWork:
    """One request's share of a step."""

    new_tokens: int
    context_tokens: int
    samples: bool


class StepCostModel:
    """Seconds per step for one pool profile; cheap enough to call for every simulated step."""

    def __init__(self, profile: PoolProfile) -> None:
        model, gpu = profile.model, profile.gpu
        self.profile = profile
        self._flops_per_token = 2.0 * model.layer_params
        self._flops_per_sample = 2.0 * model.lm_head_params
        self._attn_flops_per_pair = 4.0 * model.num_layers * model.num_attention_heads * model.head_dim
        self._weight_bytes = float(model.streamed_weight_bytes)
        self._kv_bytes = float(model.kv_bytes_per_token)
        self._flops_per_s = gpu.peak_tflops * 1e12 * gpu.compute_efficiency
        self._bytes_per_s = gpu.hbm_tb_s * 1e12 * gpu.bandwidth_efficiency
        self._overhead = gpu.step_overhead_s
        self._host_seconds_per_byte = 1.0 / (gpu.host_link_gb_s * 1e9) + (1.0 / (gpu.host_seal_gb_s * 1e9) if gpu.host_seal_gb_s else 0.0)

    def load(self, work: Iterable[ScheduledWork]) -> StepLoad:
        total = StepLoad()
        for item in work:
            total.add(item)
        return total

    def seconds(self, load: "StepLoad") -> float:
        if load.tokens == 0:
            return 0.0
        linear = max(
            (load.tokens * self._flops_per_token + load.samples * self._flops_per_sample) / self._flops_per_s,
            self._weight_bytes / self._bytes_per_s,
        )
        attention = max(load.pairs * self._attn_flops_per_pair / self._flops_per_s, load.kv_tokens * self._kv_bytes / self._bytes_per_s)
        return self._overhead + linear + attention

    def host_transfer_seconds(self, tokens: int) -> float:
        """Moving `tokens` positions of KV one way between GPU and host memory, sealing included."""
        return tokens * self._kv_bytes * self._host_seconds_per_byte

    def recompute_seconds(self, tokens: int) -> float:
        """The step time that computing positions 0..`tokens` again adds (see the module docstring)."""
        if tokens <= 0:
            return 0.0
        work = StepLoad()
        work.add(ScheduledWork(tokens, 0, False))
        linear = work.tokens * self._flops_per_token / self._flops_per_s
        attention = max(work.pairs * self._attn_flops_per_pair / self._flops_per_s, work.kv_tokens * self._kv_bytes / self._bytes_per_s)
        return linear + attention

    def step_seconds(self, work: Iterable[ScheduledWork]) -> float:
        return self.seconds(self.load(work))

    def decode_seconds(self, num_seqs: int, mean_context: float) -> float:
        """A pure decode step of `num_seqs` requests at `mean_context` tokens each."""
        return self.step_seconds([ScheduledWork(1, int(mean_context), True)] * num_seqs)

    def prefill_tokens_within(self, seconds: float, base: "StepLoad", chunk_context: int = 0) -> int:
        """The most prompt tokens one more chunk (at `chunk_context`) can add to `base` within `seconds`."""
        low, high = 0, self.profile.engine.max_num_batched_tokens
        while low < high:
            mid = (low + high + 1) // 2
            trial = base.copy()
            trial.add(ScheduledWork(mid, chunk_context, False))
            if self.seconds(trial) <= seconds:
                low = mid
            else:
                high = mid - 1
        return low


@dataclass(slots=True)
class StepLoad:
    """The sums the cost of a step depends on."""

    tokens: int = 0
    samples: int = 0
    pairs: int = 0
    kv_tokens: int = 0

    def add(self, item: ScheduledWork) -> None:
        self.tokens += item.new_tokens
        self.samples += item.samples
        self.pairs += item.new_tokens * item.context_tokens + item.new_tokens * item.new_tokens // 2
        self.kv_tokens += item.context_tokens + item.new_tokens

    def copy(self) -> "StepLoad":
        return StepLoad(self.tokens, self.samples, self.pairs, self.kv_tokens)
