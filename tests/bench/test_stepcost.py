"""The step-time model and pool profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from slaq.bench.errors import ProfileError
from slaq.bench.pool_profile import load_profile, with_kv_swap
from slaq.bench.stepcost import ScheduledWork, StepCostModel, StepLoad


def test_default_profile_is_llama3_8b_on_h200() -> None:
    profile = load_profile()
    model = profile.model
    assert (model.num_layers, model.num_kv_heads, model.head_dim, model.dtype_bytes) == (32, 8, 128, 2)
    assert (profile.engine.max_num_seqs, profile.engine.max_num_batched_tokens, profile.engine.enable_chunked_prefill) == (256, 8192, True)
    assert model.weight_bytes == pytest.approx(16.06e9, rel=0.01)  # 8.03 B parameters in bf16
    assert model.kv_bytes_per_token == 131072
    # 141 GB x 0.9 - 16 GB weights - 4 GB activations, in 16-token blocks of 2 MiB
    assert 45_000 < profile.num_gpu_blocks < 55_000


def test_full_prompt_chunk_costs_about_a_quarter_second() -> None:
    cost = StepCostModel(load_profile())
    assert cost.step_seconds([ScheduledWork(8192, 0, True)]) == pytest.approx(0.27, abs=0.01)


def test_decode_steps_are_memory_bound_and_grow_with_context() -> None:
    cost = StepCostModel(load_profile())
    one = cost.decode_seconds(1, 1000)
    assert 0.004 < one < 0.008  # reading 16 GB of weights at ~3.8 TB/s
    assert cost.decode_seconds(256, 4000) > cost.decode_seconds(256, 1000) > cost.decode_seconds(64, 1000)
    assert cost.step_seconds([]) == 0.0


def test_host_transfer_is_kv_bytes_over_the_host_link() -> None:
    profile = load_profile()
    assert profile.gpu.host_link_gb_s == 55.0 and profile.engine.kv_host_cache_gib == 1.0
    profile = with_kv_swap(profile, seal_counted=False)  # the link alone
    cost = StepCostModel(profile)
    # 1,000 tokens x 128 KiB (32 layers x 8 KV heads x 128 x K and V x 2 bytes) over 55 GB/s
    assert cost.host_transfer_seconds(1000) == pytest.approx(1000 * 131072 / 55e9)
    assert cost.host_transfer_seconds(1000) == pytest.approx(2.383e-3, rel=1e-3)
    slow = StepCostModel(profile.model_copy(update={"gpu": profile.gpu.model_copy(update={"host_link_gb_s": 5.5})}))
    assert slow.host_transfer_seconds(1000) == pytest.approx(10 * cost.host_transfer_seconds(1000))


def test_sealing_adds_its_time_to_the_links() -> None:
    profile = load_profile()
    assert profile.gpu.host_seal_gb_s == 1.26  # measured: python -m slaq.engine.kv_security.seal_cost
    cost = StepCostModel(profile)
    assert cost.host_transfer_seconds(1000) == pytest.approx(1000 * 131072 * (1 / 55e9 + 1 / 1.26e9))
    faster = StepCostModel(with_kv_swap(profile, seal_gb_s=12.6))
    assert faster.host_transfer_seconds(1000) == pytest.approx(1000 * 131072 * (1 / 55e9 + 1 / 12.6e9))
    with pytest.raises(ProfileError, match="--kv-seal-gb-s"):
        with_kv_swap(profile, seal_gb_s=0.0)
    with pytest.raises(ProfileError, match="--kv-host-cache-gib"):
        with_kv_swap(profile, host_cache_gib=-1.0)


def test_recompute_costs_the_prompt_compute_without_the_step_overhead() -> None:
    cost = StepCostModel(load_profile())
    assert cost.recompute_seconds(0) == 0.0
    # a whole 8,192-token prompt recomputed: its chunk's step less the 2 ms overhead and the weight floor
    full = cost.step_seconds([ScheduledWork(8192, 0, False)])
    assert cost.recompute_seconds(8192) == pytest.approx(full - 0.002, rel=1e-6)
    # attention grows quadratically: 4,000 tokens cost more than four times 1,000
    assert cost.recompute_seconds(4000) > 4 * cost.recompute_seconds(1000)
    # on an H200 over PCIe, moving KV out and back is ~6x cheaper than recomputing it ...
    link_only = StepCostModel(with_kv_swap(load_profile(), seal_counted=False))
    assert 2 * link_only.host_transfer_seconds(1000) < cost.recompute_seconds(1000) / 5
    # ... and sealing it on one host thread at the measured 1.26 GB/s makes it ~7x dearer
    assert 2 * cost.host_transfer_seconds(1000) > 5 * cost.recompute_seconds(1000)


def test_prefill_budget_fits_the_time() -> None:
    cost = StepCostModel(load_profile())
    base = cost.load([ScheduledWork(1, 1300, True)] * 100)
    tokens = cost.prefill_tokens_within(0.045, base)
    within, over = base.copy(), base.copy()
    within.add(ScheduledWork(tokens, 0, False))
    over.add(ScheduledWork(tokens + 1, 0, False))
    assert cost.seconds(within) <= 0.045 < cost.seconds(over)
    assert cost.prefill_tokens_within(0.0001, StepLoad()) == 0


def test_profile_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="h200-llama3-8b"):
        load_profile("no-such-profile")
    text = (Path(load_profile.__code__.co_filename).parent / "models" / "h200-llama3-8b.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("compute_efficiency: 0.5", "compute_efficiency: 1.5"))
    with pytest.raises(ProfileError, match="gpu.compute_efficiency"):
        load_profile(bad)
