"""Admitted fraction of a tenant sending exactly its requestsPerMinute through a skewed router
(prints figures; no assertions).

What runs, in simulated time: the operator's real split (`plan_tenant`: quotas.py through
tables.py, fed each pod's usage report as `sum_usage` builds it from the pods' observations), the
table entry each sidecar reads for its own pod (`TenantIndex.from_table(table, pod)`), and each
sidecar's real `QuotaGate` (its token bucket) and `UsageLog` (the demand it reports: admitted
plus refused). Not in the loop: HTTP, the engine, and the kubelet's Secret refresh, modelled as
`--propagation` seconds between a table's write and the sidecars reading it.

Each request goes to pod i with probability skew[i]; arrivals are Poisson at the tenant's
quota (or evenly spaced with `--even`). The split is re-planned every `--tick` seconds (the
operator's usage timer); the admitted fraction is counted over the last `--measure` seconds.
"Pool-wide share" is the split before per-pod shares (every replica the same share: the
pool's summed demand), for comparison.

    python tools/src/slaq/bench/quota_skew.py [--rpm 600] [--skew 0.8 0.2] [--minutes 30] [--measure 600] [--out FILE]

--out writes the figures as JSON (schema slaq.bench.quota_skew/v1, with the run's envelope:
command line, date, commit) for docs/results.md.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from slaq.cli import repo_root
from slaq.api.pool import InferencePool
from slaq.api.table import TenantTable
from slaq.api.tenant import TenantSLA
from slaq.operator.tables import TenantSplits, plan_tenant, pool_key
from slaq.operator.usage import PodObservation, sum_usage
from slaq.sidecar.admission import QuotaGate
from slaq.sidecar.errors import QuotaExceeded
from slaq.sidecar.tenants import Tenant, TenantIndex
from slaq.sidecar.usage import UsageLog

EXAMPLES = repo_root() / "crds" / "examples"


@dataclass
class Replica:
    pod: str
    gate: QuotaGate
    usage: UsageLog
    tenant: Tenant | None = None


def load(rpm: int, replicas: int) -> tuple[TenantSLA, InferencePool]:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "tenants.yaml").read_text(encoding="utf-8")) if d]
    tenant = TenantSLA.model_validate(next(d for d in docs if d["metadata"]["name"] == "vip"))
    tenant.spec.quotas.requests_per_minute, tenant.spec.quotas.tokens_per_minute, tenant.spec.quotas.max_concurrency = rpm, None, None
    pool = InferencePool.model_validate(yaml.safe_load((EXAMPLES / "pool-gpu.yaml").read_text(encoding="utf-8")))
    pool.spec.replicas.min = pool.spec.replicas.max = pool.spec.replicas.desired = replicas
    return tenant, pool


def simulate(rpm: int, skew: Sequence[float], *, per_pod: bool, minutes: float, measure_s: float, tick_s: float,
             propagation_s: float, even: bool, seed: int) -> float:
    """The admitted fraction over the last `measure_s` seconds."""
    tenant, pool = load(rpm, len(skew))
    key, name = pool_key(pool), tenant.metadata.name
    replicas = [Replica(f"{pool.metadata.name}-pod-{i}", QuotaGate(), UsageLog()) for i in range(len(skew))]
    rng = random.Random(seed)
    previous: TenantSplits | None = None
    pending: list[tuple[float, TenantTable]] = []  # tables written, read by the sidecars `propagation_s` later

    def replan(now: float) -> None:
        nonlocal previous
        observations = [PodObservation(r.pod, r.usage.report(key, "", {}, now)) for r in replicas]
        usage = sum_usage(observations)
        plan = plan_tenant(tenant, [pool], [], b"k" * 32, {key: len(replicas)}, {key: usage if per_pod else dict(usage)}, previous)
        previous = plan.splits
        ready = now + propagation_s if replicas[0].tenant is not None else now  # pods start with the first table
        pending.append((ready, TenantTable(pool=key, tenants=[plan.entries[key]])))

    def install(now: float) -> None:
        while pending and pending[0][0] <= now:
            _, table = pending.pop(0)
            for r in replicas:
                r.tenant = TenantIndex.from_table(table, r.pod).by_name[name]

    end, start_measure = minutes * 60.0, minutes * 60.0 - measure_s
    now, next_tick, sent, admitted = 0.0, 0.0, 0, 0
    while now < end:
        while next_tick <= now:
            replan(next_tick)
            next_tick += tick_s
        install(now)
        replica = rng.choices(replicas, weights=skew)[0]
        assert replica.tenant is not None
        try:
            replica.gate.admit(replica.tenant, 0, now)
            replica.usage.admitted(name, now)
            ok = True
        except QuotaExceeded:
            replica.usage.refused(name, now)
            ok = False
        if now >= start_measure:
            sent += 1
            admitted += ok
        now += 60.0 / rpm if even else rng.expovariate(rpm / 60.0)
    return admitted / sent if sent else float("nan")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rpm", type=int, default=600, help="The tenant's requestsPerMinute, and the rate it sends at.")
    parser.add_argument("--skew", type=float, nargs="+", default=[0.8, 0.2], help="The router's share of requests per replica.")
    parser.add_argument("--minutes", type=float, default=30.0, help="Simulated minutes.")
    parser.add_argument("--measure", type=float, default=600.0, help="Seconds at the end over which the fraction is counted.")
    parser.add_argument("--tick", type=float, default=15.0, help="Seconds between usage ticks (the operator's default).")
    parser.add_argument("--propagation", type=float, nargs="+", default=[0.0, 60.0], help="Seconds from table write to sidecar read.")
    parser.add_argument("--even", action="store_true", help="Evenly spaced arrivals instead of Poisson.")
    parser.add_argument("--seeds", type=int, default=3, help="Runs per figure (Poisson arrivals and routing are random).")
    parser.add_argument("--out", type=Path, default=None, help="Write the figures as a JSON report here.")
    args = parser.parse_args(argv)
    from slaq.bench.envelope import envelope
    from slaq.bench.report import write_report

    run = envelope(None if argv is None else [__file__, *argv])
    rows: list[dict] = []
    skew = [s / sum(args.skew) for s in args.skew]
    print(f"tenant sends {args.rpm} rpm (its quota), {'even' if args.even else 'Poisson'} arrivals, router skew "
          f"{' / '.join(f'{s:.0%}' for s in skew)} over {len(skew)} replicas; usage tick {args.tick:g} s; "
          f"admitted fraction over the last {args.measure:g} s of {args.minutes:g} min (mean over {args.seeds} seeds)")
    for propagation in args.propagation:
        for per_pod, label in ((False, "pool-wide share"), (True, "per-pod shares")):
            runs = [simulate(args.rpm, skew, per_pod=per_pod, minutes=args.minutes, measure_s=args.measure, tick_s=args.tick,
                             propagation_s=propagation, even=args.even, seed=seed) for seed in range(args.seeds)]
            print(f"  propagation {propagation:>4.0f} s  {label:<16} admitted {sum(runs) / len(runs):.3f}  "
                  f"(runs {' '.join(f'{r:.3f}' for r in runs)})")
            rows.append({"propagation_s": propagation, "split": label, "admitted": sum(runs) / len(runs), "runs": runs})
    if args.out:
        write_report({"schema": "slaq.bench.quota_skew/v1", "rpm": args.rpm, "skew": skew, "minutes": args.minutes,
                      "measure_s": args.measure, "tick_s": args.tick, "even": args.even, "seeds": args.seeds, "rows": rows},
                     args.out, run)
        print(f"report: {args.out}")


if __name__ == "__main__":
    main()
