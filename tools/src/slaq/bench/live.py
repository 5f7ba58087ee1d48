"""The live benchmark: a workload replayed against a running OpenAI-compatible endpoint over HTTP.

Each request is a streaming `/v1/completions` call sent at its (scaled) arrival time with the
API key of its tenant. The prompt is sent as token ids so its length is exact without a
tokenizer; `max_tokens` = `min_tokens` = the trace's output length with `ignore_eos`, so the
engine generates exactly that many tokens. Per request: TTFT (first streamed token), mean TPOT
(last minus first token time over the tokens after the first), tokens received, HTTP status.
Queue wait is not observable from outside, so the live report's wait figures are TTFT (an upper
bound).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from slaq.api.common import Tier
from slaq.bench.errors import LiveError
from slaq.bench.simulator import RequestRecord, RunResult
from slaq.bench.workload import BenchRequest, TierObjectives
from slaq.sse import DONE, alines, sse_data


@dataclass(frozen=True)
class TenantCredential:
    tenant: str
    tier: Tier
    api_key: str
    objectives: TierObjectives | None = None


@dataclass
class LiveOutcome:
    record: RequestRecord
    status: int | None = None
    error: str | None = None


@dataclass
class LiveSettings:
    url: str
    model: str
    timeout_s: float = 600.0
    token_id_low: int = 10
    token_id_high: int = 200
    concurrency_limit: int = 1024
    extra_body: dict[str, Any] = field(default_factory=dict)


def credentials_from_keys(pairs: Iterable[str]) -> list[TenantCredential]:
    """`--key TIER=KEY` (one tenant per tier) or `--key TIER/TENANT=KEY`."""
    result = []
    for text in pairs:
        name, sep, key = text.partition("=")
        tier_name, _, tenant = name.partition("/")
        try:
            tier = Tier(tier_name.strip())
        except ValueError:
            raise LiveError(f"bad --key {text!r}: tier must be one of {', '.join(t.value for t in Tier)}") from None
        if not sep or not key:
            raise LiveError(f"bad --key {text!r}: use TIER=KEY or TIER/TENANT=KEY")
        result.append(TenantCredential(tenant.strip() or f"{tier.value}-0", tier, key.strip()))
    return result


def credentials_from_manifests(paths: Sequence[Path]) -> list[TenantCredential]:
    """TenantSLA documents and the Secrets holding their keys (e.g. crds/examples/tenants.yaml, tenant-keys.yaml)."""
    from slaq.manifests import ManifestError, read_tenant_keys

    try:
        found = read_tenant_keys(paths)
    except ManifestError as exc:
        raise LiveError(str(exc)) from exc
    credentials = []
    for tenant in found.tenants:
        goal = tenant.spec.objectives
        objectives = TierObjectives(None if goal.ttft_ms is None else goal.ttft_ms / 1000.0, None if goal.tpot_ms is None else goal.tpot_ms / 1000.0)
        credentials.append(TenantCredential(tenant.metadata.name, tenant.spec.tier, found.keys[tenant.metadata.name][0], objectives))
    return credentials


def bind_tenants(requests: Sequence[BenchRequest], credentials: Sequence[TenantCredential]) -> list[tuple[BenchRequest, TenantCredential]]:
    """Each request to a credential of its tier (the workload's tenant index picks among several)."""
    by_tier: dict[Tier, list[TenantCredential]] = {}
    for credential in credentials:
        by_tier.setdefault(credential.tier, []).append(credential)
    bound = []
    for request in requests:
        options = by_tier.get(request.tier)
        if not options:
            raise LiveError(f"no API key for tier {request.tier.value}: give --key {request.tier.value}=KEY or a tenant of that tier")
        index = int(request.tenant.rsplit("-", 1)[-1]) if request.tenant.rsplit("-", 1)[-1].isdigit() else 0
        bound.append((request, options[index % len(options)]))
    return bound


def _prompt_ids(request: BenchRequest, settings: LiveSettings) -> list[int]:
    rng = random.Random(request.request_id)
    return [rng.randrange(settings.token_id_low, settings.token_id_high) for _ in range(request.prompt_tokens)]


async def _one(client: Any, request: BenchRequest, credential: TenantCredential, settings: LiveSettings,
               started: float, limiter: asyncio.Semaphore) -> LiveOutcome:
    record = RequestRecord(request.request_id, credential.tenant, request.tier, request.arrival_s, request.prompt_tokens, request.output_tokens)
    delay = started + request.arrival_s - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    body = {
        "model": settings.model,
        "prompt": _prompt_ids(request, settings),
        "max_tokens": request.output_tokens,
        "min_tokens": request.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        # Token ids in every chunk: a first token that decodes to no text still marks the TTFT.
        "return_token_ids": True,
        **settings.extra_body,
    }
    headers = {"Authorization": f"Bearer {credential.api_key}"}
    outcome = LiveOutcome(record)
    async with limiter:
        try:
            async with client.stream("POST", f"{settings.url.rstrip('/')}/v1/completions", json=body, headers=headers) as response:
                outcome.status = response.status_code
                if response.status_code != 200:
                    outcome.error = (await response.aread()).decode("utf-8", "replace")[:300]
                    return outcome
                chunks, usage_tokens = 0, None
                async for line in alines(response.aiter_bytes()):
                    data = sse_data(line)
                    if data is None:
                        continue
                    if data is DONE:
                        record.finished = True
                        break
                    if data.get("usage"):
                        usage_tokens = data["usage"].get("completion_tokens", usage_tokens)
                    choices = data.get("choices") or []
                    if choices and (choices[0].get("text") or choices[0].get("token_ids")):
                        now = time.monotonic() - started
                        if record.first_token_s is None:
                            record.first_token_s = record.first_scheduled_s = now
                        record.last_token_s = now
                        chunks += 1
                record.tokens_out = usage_tokens if usage_tokens is not None else chunks
        except Exception as exc:  # a refused connection or a broken stream is a result, not a crash
            outcome.error = f"{type(exc).__name__}: {exc}"
            record.finished = False
    return outcome


async def run_live(bound: Sequence[tuple[BenchRequest, TenantCredential]], settings: LiveSettings, *, label: str = "live") -> tuple[RunResult, list[LiveOutcome]]:
    import httpx

    limiter = asyncio.Semaphore(settings.concurrency_limit)
    timeout = httpx.Timeout(settings.timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=settings.concurrency_limit, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        started = time.monotonic()
        outcomes = await asyncio.gather(*(_one(client, r, c, settings, started, limiter) for r, c in bound))
        end = time.monotonic() - started
    records = [o.record for o in outcomes]
    last = max([r.last_token_s for r in records if r.last_token_s is not None] + [bound[-1][0].arrival_s if bound else 0.0])
    result = RunResult(policy=label, records=records, makespan_s=last, steps=0, busy_s=0.0, end_s=end,
                       stop_reason="all requests answered", sees_kv=False)
    return result, list(outcomes)
