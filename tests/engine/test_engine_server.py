"""Against the running `slaq engine` (tiny model, CPU): the slaq scheduler serves, outputs complete."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from slaq.api.common import Tier
from slaq.api.contract import RequestSLA
from tests.support.engine import metric_sum

pytestmark = pytest.mark.engine


def _complete(base_url: str, model: str, tier: Tier, tenant: str, priority: int, max_tokens: int) -> dict:
    sla = RequestSLA(tenant=tenant, tier=tier, ttft_ms=500.0 if tier is Tier.CRITICAL else None, arrival=time.time(), predicted_output=max_tokens)
    body = {"model": model, "prompt": f"tenant {tenant} asks for a story", "max_tokens": max_tokens, "ignore_eos": True,
            "priority": priority, "vllm_xargs": sla.to_xargs()}
    response = httpx.post(base_url + "/v1/completions", json=body, timeout=120.0)
    assert response.status_code == 200, response.text
    return response.json()


def test_requests_of_every_tier_complete_and_slaq_metrics_appear(slaq_engine) -> None:
    jobs = [(Tier.BATCH, "batch-co", 2, 24)] * 6 + [(Tier.STANDARD, "std-co", 1, 16)] * 3 + [(Tier.CRITICAL, "crit-co", 0, 8)] * 3
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda job: _complete(slaq_engine.base_url, slaq_engine.model, *job), jobs))
    for (_, _, _, max_tokens), result in zip(jobs, results):
        assert result["choices"][0]["finish_reason"] == "length"
        assert result["usage"]["completion_tokens"] == max_tokens

    metrics = httpx.get(slaq_engine.base_url + "/metrics", timeout=10.0).text
    assert metric_sum(metrics, "slaq_engine_scheduler_info", scheduler="SLAScheduler", vllm="0.32.0") == 1.0
    assert metric_sum(metrics, "slaq_engine_schedule_step_seconds_count") > 0
    # The scheduler read each request's tier and tenant from vllm_xargs.
    for tier, tenant in ((Tier.CRITICAL, "crit-co"), (Tier.STANDARD, "std-co"), (Tier.BATCH, "batch-co")):
        assert metric_sum(metrics, "slaq_engine_prefix_cache_query_tokens_total", tier=tier.value, tenant=tenant) > 0
    for tier in Tier:
        assert metric_sum(metrics, "slaq_engine_queue_depth", tier=tier.value) == 0.0
        assert metric_sum(metrics, "slaq_engine_kv_blocks_in_use", tier=tier.value) == 0.0
    # vLLM's own metrics keep working next to slaq's.
    assert metric_sum(metrics, "vllm:request_success_total") >= len(jobs)


def test_a_request_without_slaq_xargs_is_served_as_standard(slaq_engine) -> None:
    body = {"model": slaq_engine.model, "prompt": "plain client", "max_tokens": 4, "ignore_eos": True}
    response = httpx.post(slaq_engine.base_url + "/v1/completions", json=body, timeout=120.0)
    assert response.status_code == 200
    metrics = httpx.get(slaq_engine.base_url + "/metrics", timeout=10.0).text
    assert metric_sum(metrics, "slaq_engine_prefix_cache_query_tokens_total", tier="standard", tenant="anonymous") > 0


@pytest.mark.parametrize("character", ["\u0085", "\u2028"])
def test_a_token_whose_text_is_a_unicode_line_break_streams_in_one_line(slaq_engine, character: str) -> None:
    """vLLM writes a token's text unescaped into its chunk's JSON. NEL and U+2028 end a line for
    str.splitlines() (and httpx's aiter_lines, which an e2e run cut a chunk with), not for an event
    stream: `slaq.sse.lines` keeps the chunk whole. The prompt ends with the character's first UTF-8
    byte(s) and a logit bias makes its last byte the one token generated."""
    from transformers import AutoTokenizer

    from slaq.engine.tiny_model import ensure_tiny_model
    from slaq.sse import lines, sse_data

    ids = AutoTokenizer.from_pretrained(str(ensure_tiny_model())).encode(character, add_special_tokens=False)
    assert len(ids) >= 2, ids  # byte tokens: the character needs more than one
    body = {"model": slaq_engine.model, "prompt": [50, 60, *ids[:-1]], "max_tokens": 1, "stream": True, "logit_bias": {str(ids[-1]): 100}}
    with httpx.stream("POST", slaq_engine.base_url + "/v1/completions", json=body, timeout=120.0) as response:
        assert response.status_code == 200
        raw = response.read()
    assert character.encode() in raw  # unescaped, as the docstring says
    assert any(character in line for line in raw.decode().splitlines()) is False  # where splitlines cuts
    events = [sse_data(line) for line in lines([raw]) if line.startswith("data: {")]
    assert len(events) == 1 and events[0]["choices"][0]["text"].endswith(character)
