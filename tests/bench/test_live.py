"""`slaq bench live` against a fake OpenAI streaming server on 127.0.0.1 (stopped by the test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slaq.api.common import Tier
from slaq.bench.errors import LiveError
from slaq.bench.live import credentials_from_keys, credentials_from_manifests
from slaq.cli import main
from slaq.testing.fake_engine import ServerThread

from .conftest import SAMPLE_TRACE
from .fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"critical": "k-crit", "standard": "k-std", "batch": "k-batch"}


@pytest.fixture
def fake_server():
    app = FakeOpenAI(set(KEYS.values()) | {"sk-demo-vip-0123456789abcdef", "sk-demo-standard-0123456789abcdef", "sk-demo-free-0123456789abcdef"})
    with ServerThread(app) as server:
        yield app, server.url


def _live(url: str, out: Path, *extra: str) -> int:
    return main(["bench", "live", "--url", url, "--model", "fake", "--trace", str(SAMPLE_TRACE), "--requests", "40",
                 "--rate", "40", "--token-scale", "0.02", "--max-output", "6", "--out", str(out), *extra])


def test_live_run_measures_every_request_with_tier_keys(fake_server, tmp_path: Path) -> None:
    app, url = fake_server
    out = tmp_path / "live.json"
    keys = [arg for tier, key in KEYS.items() for arg in ("--key", f"{tier}={key}")]
    assert _live(url, out, *keys, "--label", "fake") == 0
    report = json.loads(out.read_text())
    figures = report["policies"]["fake"]
    assert figures["requests"] == 40 and figures["completed_fraction"] == 1.0
    assert figures["http_status"] == {"200": 40}
    assert figures["tokens"]["undelivered_output"] == 0
    assert len(app.accepted) == 40
    by_tier = {tier: sum(1 for key, _ in app.accepted if key == KEYS[tier]) for tier in KEYS}
    assert by_tier == {t: figures["tiers"][t]["requests"] for t in KEYS}
    for _, body in app.accepted:
        assert body["stream"] is True and body["min_tokens"] == body["max_tokens"] <= 6
        assert isinstance(body["prompt"], list) and len(body["prompt"]) >= 1
        assert "priority" not in body and "vllm_xargs" not in body  # the sidecar sets those, not clients
    crit = figures["tiers"]["critical"]
    assert crit["ttft_p50_s"] is not None and crit["ttft_p50_s"] > 0


def test_live_keys_from_tenant_manifests(fake_server, tmp_path: Path) -> None:
    app, url = fake_server
    examples = ROOT / "crds" / "examples"
    credentials = credentials_from_manifests([examples / "tenants.yaml", examples / "tenant-keys.yaml"])
    assert {c.tier for c in credentials} == set(Tier)
    out = tmp_path / "live.json"
    assert _live(url, out, "--tenants", str(examples / "tenants.yaml"), str(examples / "tenant-keys.yaml")) == 0
    report = json.loads(out.read_text())
    vip = next(c for c in credentials if c.tier is Tier.CRITICAL)
    assert report["objectives"]["critical"]["ttft_s"] == vip.objectives.ttft_s
    assert app.refused == 0


def test_wrong_key_is_reported_not_hidden(fake_server, tmp_path: Path) -> None:
    app, url = fake_server
    out = tmp_path / "live.json"
    code = _live(url, out, "--key", "critical=wrong", "--key", "standard=k-std", "--key", "batch=k-batch")
    assert code == 1
    figures = json.loads(out.read_text())["policies"]["live"]
    assert figures["http_status"]["401"] == figures["tiers"]["critical"]["requests"] > 0
    assert figures["tiers"]["critical"]["completed_fraction"] == 0.0
    assert figures["tiers"]["batch"]["completed_fraction"] == 1.0


def test_bad_key_arguments_name_the_problem() -> None:
    with pytest.raises(LiveError, match="tier must be one of"):
        credentials_from_keys(["gold=abc"])
    with pytest.raises(LiveError, match="TIER=KEY"):
        credentials_from_keys(["critical"])


def test_missing_tier_key_is_refused(fake_server, tmp_path: Path, capsys) -> None:
    _, url = fake_server
    assert _live(url, tmp_path / "x.json", "--key", "critical=k-crit") == 2
    assert "no API key for tier" in capsys.readouterr().err
