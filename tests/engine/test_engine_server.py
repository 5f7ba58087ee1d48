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
