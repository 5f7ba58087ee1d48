"""Fixtures for the benchmark tests: the committed trace sample and a small, fast pool profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from slaq.bench.pool_profile import PoolProfile, load_profile

DATA = Path(__file__).resolve().parent / "data"
SAMPLE_TRACE = DATA / "azure_llm_conv_2023_first300.csv"


@pytest.fixture(scope="session")
def sample_trace() -> Path:
    return SAMPLE_TRACE


@pytest.fixture(scope="session")
def small_profile() -> PoolProfile:
    """The default H200 profile with a smaller engine (32 sequences, 2,048-token steps): same
    cost model, fewer objects per step, so a simulation of a hundred requests takes a second."""
    profile = load_profile()
    engine = profile.engine.model_copy(update={"max_num_seqs": 32, "max_num_batched_tokens": 2048})
    return profile.model_copy(update={"engine": engine})
