"""`slaq bench live` against the real tiny-model engine on CPU (shared session fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slaq.cli import main

from .conftest import SAMPLE_TRACE


@pytest.mark.engine
def test_live_benchmark_against_the_tiny_engine(slaq_engine, tmp_path: Path) -> None:
    out = tmp_path / "live.json"
    # The engine alone has no tenant auth: any key passes; the sidecar would check them.
    code = main(["bench", "live", "--url", slaq_engine.base_url, "--model", slaq_engine.model, "--trace", str(SAMPLE_TRACE),
                 "--requests", "12", "--rate", "4", "--token-scale", "0.05", "--max-prompt", "60", "--max-output", "8",
                 "--key", "critical=x", "--key", "standard=x", "--key", "batch=x", "--out", str(out), "--label", "tiny"])
    assert code == 0
    figures = json.loads(out.read_text())["policies"]["tiny"]
    assert figures["http_status"] == {"200": 12}
    assert figures["completed_fraction"] == 1.0
    assert figures["tokens"]["undelivered_output"] == 0  # min_tokens = max_tokens: exactly the trace's (scaled) length
    assert all(figures["tiers"][t]["ttft_p50_s"] is not None for t in ("critical", "standard", "batch") if figures["tiers"][t]["requests"])
