"""What the shared quota store costs a request, and what a killed or stalled store costs (prints figures).

Two replicas' quota gates (`SharedQuotaGate`, the sidecar's own admission objects) share one real
redis-server on 127.0.0.1 (slaq.testing.redis_server), with the store settings the sidecar ships
(`StoreSettings`: the 0.25 s `--quota-store-timeout`, the breaker opening after 2 failures):

- reservation: `--requests` admissions one after another, 80 % of them on replica A, each timed
  from the call to its decision (the Lua script's round trip, the breaker, the local hold); each is
  settled (the engine's usage committed, in the store too) before the next is sent, so no two
  overlap;
- killed: the store SIGKILLed (connections refused), then `--decisions` admissions on replica A,
  each timed;
- stalled: a fresh store SIGSTOPped (the kernel still accepts connections, nothing answers), then
  `--decisions` admissions on replica A, each timed: the first ones wait for the store timeout,
  the rest are decided at once on the replica's share while the breaker is open.

    python tools/src/slaq/bench/quota_store.py [--requests 2000] [--decisions 10] [--out FILE]

Wall clock on the machine that runs it (the envelope records its load). `--out FILE` writes the
figures as a JSON report (schema slaq.bench.quota_store/v1, with the run's envelope: command line,
date, commit) for docs/results.md. tests/sidecar/test_shared_quotas.py asserts the behaviour (the
quotas held exactly, every decision within 1 s of a failed store); this measures its cost.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from slaq.api.common import Tier
from slaq.api.table import ClusterQuota
from slaq.sidecar.admission import QuotaGate, Ticket
from slaq.sidecar.errors import QuotaExceeded
from slaq.sidecar.quota_store import QuotaStore, StoreSettings
from slaq.sidecar.shared_quotas import SharedQuotaGate
from slaq.sidecar.tenants import Tenant
from slaq.testing.redis_server import RedisServer

SCHEMA = "slaq.bench.quota_store/v1"
REPLICAS = 2
SKEW = 0.8  # of the requests go to replica A
RESERVED, USED = 100, 60  # tokens reserved per request, and what the engine reports it used


def bench_tenant() -> Tenant:
    """A tenant of a 2-replica pool whose quotas the run never reaches: every admission is a whole reservation
    (concurrency, requests/min and tokens/min checked and taken in one script), none is refused."""
    quota = ClusterQuota(requests_per_minute=1_000_000, tokens_per_minute=100_000_000, max_concurrency=1_000)
    return Tenant(name="bench", tier=Tier.STANDARD, ttft_ms=None, tpot_ms=None, cache_salt="s" * 16,
                  requests_per_minute=quota.requests_per_minute / REPLICAS, tokens_per_minute=quota.tokens_per_minute / REPLICAS,
                  max_concurrency=quota.max_concurrency // REPLICAS, cluster_quota=quota)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile (q in [0, 1])."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


def gates(server: RedisServer, settings: StoreSettings) -> list[SharedQuotaGate]:
    return [SharedQuotaGate(QuotaGate(), QuotaStore(dataclasses.replace(settings, url=server.url), sidecar_id=name))
            for name in ("a", "b")]


async def timed_admit(gate: SharedQuotaGate, tenant: Tenant) -> tuple[float, Ticket | None]:
    started = time.perf_counter()
    try:
        ticket: Ticket | None = await gate.admit(tenant, RESERVED, time.time())
    except QuotaExceeded:
        ticket = None
    return time.perf_counter() - started, ticket


async def reservations(server: RedisServer, settings: StoreSettings, requests: int, seed: int) -> dict[str, Any]:
    tenant, pair, rng = bench_tenant(), gates(server, settings), random.Random(seed)
    try:
        seconds, in_store = [], 0
        for _ in range(requests):
            gate = pair[0 if rng.random() < SKEW else 1]
            took, ticket = await timed_admit(gate, tenant)
            if ticket is None:
                raise RuntimeError("the benchmark tenant was refused: its quotas are meant to be out of reach")
            seconds.append(took)
            in_store += ticket.in_store
            gate.settle(ticket, USED, time.time())
            await gate.drain()
    finally:
        for gate in pair:
            await gate.store.aclose()
    ms = [s * 1e3 for s in seconds]
    return {"requests": requests, "in_store": in_store, "p50_ms": round(percentile(ms, 0.5), 3),
            "p99_ms": round(percentile(ms, 0.99), 3), "max_ms": round(max(ms), 3), "mean_ms": round(sum(ms) / len(ms), 3)}


async def failure(server: RedisServer, settings: StoreSettings, kind: str, decisions: int) -> dict[str, Any]:
    """Admissions on replica A after the store was killed or stalled: each decision's time and where it was decided."""
    tenant = bench_tenant()
    a, b = gates(server, settings)
    try:
        _, ticket = await timed_admit(a, tenant)  # the connection is open and the breaker closed before the failure
        assert ticket is not None and ticket.in_store
        a.settle(ticket, USED, time.time())
        await a.drain()
        if kind == "killed":
            server.kill()
        else:
            server.pause()
        seconds, tickets = [], []
        for _ in range(decisions):
            took, ticket = await timed_admit(a, tenant)
            seconds.append(took)
            tickets.append(ticket)
        state = a.breaker.state.value
        fallbacks = a.metrics.fallbacks.labels("reserve")._value.get()
        for ticket in tickets:
            if ticket is not None:
                a.settle(ticket, USED, time.time())
    finally:
        if kind == "stalled":
            server.resume()
        for gate in (a, b):
            await gate.store.aclose()
    return {"decisions": decisions, "decision_ms": [round(s * 1e3, 2) for s in seconds],
            "admitted_on_shares": sum(1 for t in tickets if t is not None and not t.in_store),
            "admitted_in_store": sum(1 for t in tickets if t is not None and t.in_store),
            "refused": sum(1 for t in tickets if t is None), "reserve_fallbacks": int(fallbacks), "breaker_after": state}


def redis_version(binary: str) -> str:
    """`7.0.15` from `Redis server v=7.0.15 sha=...` (the whole line if it reads otherwise)."""
    line = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    return next((word[2:] for word in line.split() if word.startswith("v=")), line)


async def measure(binary: str, requests: int, decisions: int, seed: int) -> dict[str, Any]:
    settings = StoreSettings(url="redis://127.0.0.1:6379/0")  # the sidecar's defaults; each run's own URL replaces this one
    result: dict[str, Any] = {"redis": redis_version(binary), "timeout_s": settings.timeout_s, "failures_to_open": settings.failures_to_open,
                              "skew": SKEW, "reserved_tokens": RESERVED, "used_tokens": USED}
    with tempfile.TemporaryDirectory(prefix="slaq-bench-quota-store-") as workdir:
        for phase in ("reservation", "killed", "stalled"):
            server = RedisServer(Path(workdir), binary).start()
            try:
                if phase == "reservation":
                    result[phase] = await reservations(server, settings, requests, seed)
                else:
                    result[phase] = await failure(server, settings, phase, decisions)
            finally:
                server.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="admissions timed against an answering store")
    parser.add_argument("--decisions", type=int, default=10, help="admissions timed after the store was killed, and after it stalled")
    parser.add_argument("--seed", type=int, default=7, help="which replica each request goes to (80/20)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as a JSON report here")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.decisions < 1:
        parser.error("--requests and --decisions must be >= 1")
    binary = shutil.which("redis-server")
    if binary is None:
        print("error: redis-server is not installed (scripts/setup.sh installs Debian's redis-server)", file=sys.stderr)
        return 2
    from slaq.bench.envelope import envelope
    from slaq.bench.report import write_report

    run = envelope(None if argv is None else [__file__, *argv])
    result = asyncio.run(measure(binary, args.requests, args.decisions, args.seed))
    if args.out:
        write_report({"schema": SCHEMA, **result}, args.out, run)
    reservation = result["reservation"]
    print(f"reservation ({reservation['requests']} admissions, {reservation['in_store']} in the store): "
          f"p50 {reservation['p50_ms']:.3f} ms, p99 {reservation['p99_ms']:.3f} ms, max {reservation['max_ms']:.3f} ms")
    for kind in ("killed", "stalled"):
        f = result[kind]
        print(f"store {kind}: decisions {', '.join(f'{ms:g}' for ms in f['decision_ms'])} ms; {f['admitted_on_shares']} admitted on "
              f"the shares, breaker {f['breaker_after']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
