"""`python -m slaq.engine.kv_security.seal_cost`: the worker's own seal and open path, timed."""

from __future__ import annotations

import json

import pytest

from slaq.engine.kv_security import seal_cost


def test_seal_cost_prints_the_throughput_of_the_workers_own_path(capsys) -> None:
    assert seal_cost.main(["--device", "cpu", "--layers", "2", "--blocks", "4", "--repeats", "1", "--dtype", "float32"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["device"] == "cpu" and figures["block_bytes"] == 2 * 2 * 16 * 8 * 128 * 4
    assert figures["seal_s_per_block"] > 0 and figures["open_s_per_block"] > 0
    # Both figures are printed rounded (GB/s to 3 decimals): on a slow machine that is the larger error.
    assert figures["seal_gb_s"] == pytest.approx(figures["block_bytes"] / figures["seal_s_per_block"] / 1e9, rel=0.01, abs=0.0006)


def test_seal_cost_refuses_cuda_without_a_gpu(capsys) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert seal_cost.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
