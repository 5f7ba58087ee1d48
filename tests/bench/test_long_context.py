"""The synthetic workloads (`--workload long-context`, `--workload prefill-heavy`), the 128k profile, and the report's trace attribution."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from slaq.bench.benchmark import WorkloadSpec
from slaq.bench.errors import ProfileError, WorkloadError
from slaq.bench.pool_profile import load_profile
from slaq.bench.traces import BUNDLED_TRACES, trace_attribution
from slaq.bench.cluster_workloads import WVA_OUTPUT_TOKENS, WVA_PROMPT_TOKENS
from slaq.bench.workload import LongContextShape, long_context_rows, prefill_heavy_rows
from slaq.cli import main

from .conftest import SAMPLE_TRACE

CONTEXT = 131_072


def test_long_context_lengths_are_heavy_tailed_up_to_the_context() -> None:
    rows = long_context_rows(2000, seed=1, max_model_len=CONTEXT)
    prompts = sorted(r.prompt_tokens for r in rows)
    assert 11_000 < statistics.mean(prompts) < 16_000 and 5_500 < statistics.median(prompts) < 8_500
    assert 0.05 < sum(p > 32_768 for p in prompts) / len(prompts) < 0.11  # the Pareto tail
    assert prompts[-1] > 120_000 and all(r.prompt_tokens + r.output_tokens <= CONTEXT for r in rows)
    assert 300 < statistics.mean(r.output_tokens for r in rows) < 420
    assert all(b.arrival_s > a.arrival_s for a, b in zip(rows, rows[1:]))  # Poisson arrivals, rate 1/s
    assert rows == long_context_rows(2000, seed=1, max_model_len=CONTEXT)  # seeded: the same run twice
    assert rows != long_context_rows(2000, seed=2, max_model_len=CONTEXT)


def test_a_short_context_clips_every_prompt_and_no_tail_means_no_long_prompt() -> None:
    rows = long_context_rows(500, seed=1, max_model_len=8192)
    assert max(r.prompt_tokens + r.output_tokens for r in rows) == 8192  # clipped at the context, not dropped
    body = long_context_rows(2000, seed=1, max_model_len=CONTEXT, shape=LongContextShape(tail_share=0.0))
    assert sum(r.prompt_tokens > 32_768 for r in body) < sum(r.prompt_tokens > 32_768 for r in long_context_rows(2000, seed=1, max_model_len=CONTEXT))
    with pytest.raises(WorkloadError, match="too short"):
        long_context_rows(10, seed=1, max_model_len=50)


def test_prefill_heavy_is_the_cluster_ramps_requests_arriving_as_one_poisson_process() -> None:
    rows = prefill_heavy_rows(2000, seed=1, max_model_len=8192)
    assert {(r.prompt_tokens, r.output_tokens) for r in rows} == {(WVA_PROMPT_TOKENS, WVA_OUTPUT_TOKENS)} == {(4000, 1000)}
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(rows, rows[1:])]
    assert all(g > 0 for g in gaps) and 0.95 < statistics.mean(gaps) < 1.05  # rate 1/s, rescaled by --load
    assert statistics.stdev(gaps) > 0.9  # exponential gaps, not a clock
    assert rows == prefill_heavy_rows(2000, seed=1, max_model_len=8192) != prefill_heavy_rows(2000, seed=2, max_model_len=8192)
    with pytest.raises(WorkloadError, match="too short"):
        prefill_heavy_rows(10, seed=1, max_model_len=4096)


def test_the_128k_profile_is_the_h200_profile_with_the_long_context() -> None:
    base, long = load_profile("h200-llama3-8b"), load_profile("h200-llama3-8b-128k")
    assert long.model.max_model_len == CONTEXT and base.model.max_model_len == 8192
    assert long.gpu == base.gpu and long.model.kv_bytes_per_token == base.model.kv_bytes_per_token == 128 * 1024
    assert long.num_gpu_blocks == base.num_gpu_blocks == 50_945  # the same GPU memory holds the same KV


def test_extends_merges_sections_and_refuses_a_loop(tmp_path: Path) -> None:
    child = tmp_path / "child.yaml"
    child.write_text("extends: h200-llama3-8b\nname: child\nengine:\n  max_num_seqs: 64\n")
    profile = load_profile(child)
    assert profile.engine.max_num_seqs == 64 and profile.engine.max_num_batched_tokens == 8192 and profile.model.num_layers == 32
    (tmp_path / "a.yaml").write_text("extends: b.yaml\nname: a\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nname: b\n")
    with pytest.raises(ProfileError, match="loops"):
        load_profile(tmp_path / "a.yaml")


def test_the_attribution_names_the_trace_that_ran(tmp_path: Path) -> None:
    assert "code_2023" in trace_attribution(BUNDLED_TRACES["code"]) and "CC-BY 4.0" in trace_attribution(BUNDLED_TRACES["code"])
    assert "conv_2023" in trace_attribution(BUNDLED_TRACES["conv"])
    own = trace_attribution(SAMPLE_TRACE)
    assert own.startswith(str(SAMPLE_TRACE)) and "Splitwise" not in own and "CC-BY" not in own


def test_sim_runs_the_long_context_workload_and_reports_its_shape(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.json"
    quick = ["--requests", "6", "--policies", "fcfs", "--capacity-rps", "0.5", "--quiet"]
    assert main(["bench", "sim", "--workload", "long-context", "--profile", "h200-llama3-8b-128k", *quick, "--out", str(out)]) == 0
    workload = json.loads(out.read_text())["workload"]
    assert workload["trace"] is None and workload["trace_attribution"] is None and workload["arrivals"] == "poisson"
    assert workload["generator"]["name"] == "long-context" and workload["generator"]["max_model_len"] == CONTEXT
    assert workload["prompt_tokens_max"] <= CONTEXT
    assert "workload long-context" in capsys.readouterr().out
    assert main(["bench", "sim", "--workload", "long-context", "--window", "60", *quick]) == 2
    assert "--workload long-context has no trace" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "sim", "--workload", "long-context", "--trace", str(SAMPLE_TRACE), *quick])
    with pytest.raises(WorkloadError, match="max_model_len"):
        WorkloadSpec(generator="long-context", arrivals="poisson").rows()


def test_the_host_cache_follows_the_context_unless_set() -> None:
    long = load_profile("h200-llama3-8b-128k")
    assert long.engine.kv_host_cache_gib is None and long.host_cache_gib == 16.0  # 131,072 tokens x 128 KiB
    base = load_profile("h200-llama3-8b")
    assert base.host_cache_gib == 1.0 == base.model.max_model_len * base.model.kv_bytes_per_token / 2**30
    from slaq.bench.pool_profile import with_kv_swap

    assert with_kv_swap(long, host_cache_gib=2.0).host_cache_gib == 2.0 and with_kv_swap(long, host_cache_gib=0.0).host_cache_gib == 0.0
