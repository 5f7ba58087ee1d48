"""Admission-decision cost with 10,000 tenants (prints figures; no assertions).

One decision = what the sidecar does between reading a request body and releasing it to the
engine: hash the API key and look the tenant up, parse and check the body, count prompt tokens
(estimate), predict output length, the pod guard, the tenant's buckets, enqueue-or-release; plus
settling at the end. Measured on SidecarCore directly (no sockets), for an empty queue (the
fast path) and with N requests already queued (the release scan and the deadline estimate score
every queued request).

    python tools/src/slaq/bench/admission_cost.py [--tenants 10000] [--decisions 20000] [--queued 0 100 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

from slaq.api.table import ReplicaShare, TenantEntry, TenantTable, derive_cache_salt, hash_api_key
from slaq.api.common import Tier
from slaq.policy.views import RequestView
from slaq.sidecar.queue import QueuedRequest
from slaq.sidecar.service import CoreConfig, SidecarCore
from slaq.sidecar.tenants import TenantDirectory

TIERS = ("critical", "standard", "batch")


def table(n: int) -> tuple[TenantTable, list[str]]:
    keys = [f"sk-tenant-{i:06d}-secret" for i in range(n)]
    tenants = [
        TenantEntry(
            name=f"tenant-{i}", tier=TIERS[i % 3], ttft_ms=None if i % 3 == 2 else 500.0 * (1 + i % 3), tpot_ms=None if i % 3 == 2 else 50.0,
            key_hashes=[hash_api_key(k)], cache_salt=derive_cache_salt(b"bench", f"tenant-{i}"),
            share=ReplicaShare(requests_per_minute=1e9, tokens_per_minute=1e12, max_concurrency=1_000_000),
        )
        for i, k in enumerate(keys)
    ]
    return TenantTable(pool="bench/pool", revision="1", tenants=tenants), keys


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(core: SidecarCore, keys: list[str], decisions: int, queued: int) -> list[float]:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 128}).encode()
    core.gate.engine_queue_target = 10**9 if queued == 0 else 1
    if queued:
        core.gate.on_release(0)  # a critical request not started: hold the gate closed for every tier and fill the queue with waiting requests
        rng0 = random.Random(3)
        now = core.clock()
        for i in range(queued):
            tier = Tier(TIERS[i % 3])
            core.queue.push(QueuedRequest(RequestView(tier=tier, arrival=now - rng0.random(), ttft_ms=None if i % 3 == 2 else 500.0,
                                                      prompt_tokens=rng0.randrange(10, 4000), predicted_output=rng0.randrange(10, 500))))
    samples = []
    rng = random.Random(7)
    for _ in range(decisions):
        key = keys[rng.randrange(len(keys))]
        start = time.perf_counter()
        identity = core.identify({"authorization": f"Bearer {key}"})
        if queued:
            # the deadline estimate and a release scan over the queue, as an arrival pays them
            view = core.queue._entries[next(iter(core.queue._entries))].view
            core.dispatcher.predicted_wait_s(view)
            core.queue.best(core.policy.ranking, core.clock(), core.pool_view())
            core.quotas.admit(identity.tenant, 528, core.clock())
            samples.append(time.perf_counter() - start)
            continue
        flight = await core.admit(identity, "chat", body)
        core.enriched_body(flight)
        core.finish(flight, output_tokens=100, engine_prompt_tokens=110, status=200)
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--queued", type=int, nargs="*", default=[0, 100, 1000])
    args = parser.parse_args()
    start = time.perf_counter()
    tenant_table, keys = table(args.tenants)
    core = SidecarCore(CoreConfig(served_model_name="m", max_queue_depth=10**6), TenantDirectory.from_table(tenant_table))
    print(f"tenant table: {args.tenants} tenants indexed in {time.perf_counter() - start:.2f} s")
    print(f"{'queued':>8} {'decisions':>10} {'p50 us':>9} {'p99 us':>9} {'mean us':>9} {'per s':>9}")
    for queued in args.queued:
        samples = asyncio.run(measure(core, keys, args.decisions if queued == 0 else max(200, args.decisions // 20), queued))
        us = [s * 1e6 for s in samples]
        print(f"{queued:>8} {len(us):>10} {percentile(us, 0.5):>9.1f} {percentile(us, 0.99):>9.1f} {statistics.fmean(us):>9.1f} {1e6 / statistics.fmean(us):>9.0f}")
        core = SidecarCore(CoreConfig(served_model_name="m", max_queue_depth=10**6), TenantDirectory.from_table(tenant_table))


if __name__ == "__main__":
    main()
