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

With `--routers`, requests are routed by policy instead of a fixed skew while the pool follows
`--schedule` (`0:2,600:4,1200:3`: from t seconds on, N replicas): `round-robin` and
`least-request` are cluster_router's ServiceRouter and LeastRequestRouter (they key only on a
pod's name, which a Replica has); `affinity` hashes Zipf-popular sessions onto the pods present
(consistent hashing, here). It reports the admitted fraction and the cluster-wide quota error per
minute (admitted / quota - 1), overall and in the minute after each scale event (`simulate_routed`).

    python tools/src/slaq/bench/quota_skew.py --routers round-robin least-request affinity [--schedule 0:2,600:4,1200:3]

--out writes the figures as JSON (schema slaq.bench.quota_skew/v1, with --routers
slaq.bench.quota_routing/v1; with the run's envelope: command line, date, commit) for docs/results.md.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import yaml

from slaq.cli import repo_root
from slaq.api.pool import InferencePool
from slaq.api.table import TenantTable
from slaq.api.tenant import TenantSLA
from slaq.bench.cluster_router import LeastRequestRouter, ServiceRouter
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
    revision: int = -1  # simulate_routed: the newest table this pod read (a pod never goes back to an older one)

    @property
    def name(self) -> str:  # what cluster_router's routers key their counts by
        return self.pod

    def offer(self, tenant: str, now: float) -> bool:
        """One request of `tenant` at this pod: admitted or refused by its real QuotaGate, and
        recorded in its UsageLog either way (the demand the operator splits on)."""
        assert self.tenant is not None
        try:
            self.gate.admit(self.tenant, 0, now)
        except QuotaExceeded:
            self.usage.refused(tenant, now)
            return False
        self.usage.admitted(tenant, now)
        return True


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
        ok = replica.offer(name, now)
        if now >= start_measure:
            sent += 1
            admitted += ok
        now += 60.0 / rpm if even else rng.expovariate(rpm / 60.0)
    return admitted / sent if sent else float("nan")

ROUTERS = ("round-robin", "least-request", "affinity")


def parse_schedule(text: str) -> list[tuple[float, int]]:
    """`0:2,600:4,1200:3`: from t seconds on, N replicas; starts at 0, times increasing, N >= 1."""
    steps: list[tuple[float, int]] = []
    for part in text.split(","):
        t, sep, n = part.partition(":")
        try:
            step = (float(t), int(n))
        except ValueError:
            raise ValueError(f"--schedule {text!r}: {part!r} is not SECONDS:REPLICAS") from None
        if not sep or step[1] < 1 or (steps and step[0] <= steps[-1][0]):
            raise ValueError(f"--schedule {text!r}: {part!r} needs REPLICAS >= 1 and times increasing")
        steps.append(step)
    if not steps or steps[0][0] != 0:
        raise ValueError(f"--schedule {text!r}: the first step must be at 0 s")
    return steps


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class AffinityRouter:
    """Session affinity by consistent hashing: each pod holds `vnodes` points on a ring and a
    session goes to the first point at or after its hash, so a scale event remaps only the
    sessions whose arc changed owner (about n_added / n_new of them on a scale-out)."""

    name = "affinity"

    def __init__(self, vnodes: int = 64) -> None:
        self.vnodes = vnodes
        self._ring: list[tuple[int, str]] = []
        self._pods: tuple[str, ...] = ()

    def pick(self, pods: Sequence[Replica], session: int) -> Replica:
        names = tuple(p.name for p in pods)
        if names != self._pods:
            self._pods = names
            self._ring = sorted((_point(f"{n}#{v}"), n) for n in names for v in range(self.vnodes))
        i = bisect.bisect_left(self._ring, (_point(f"session-{session}"), "")) % len(self._ring)
        owner = self._ring[i][1]
        return next(p for p in pods if p.name == owner)


@dataclass(frozen=True)
class RoutedRun:
    admitted: float  # admitted / sent over the whole run (the tenant sends its quota)
    minute_errors: list[float]  # per whole minute: admitted / quota - 1
    after_scale: list[float]  # the error in the minute after each scale event
    table_writes: int


def simulate_routed(rpm: int, router: str, schedule: Sequence[tuple[float, int]], *, per_pod: bool, minutes: float,
                    tick_s: float, propagation_s: float, service_s: float, sessions: int, zipf: float, offered: float,
                    seed: int) -> RoutedRun:
    """One tenant sending `offered` x its quota (Poisson) through `router` while the pool follows `schedule`.

    Scale-out: the operator writes the table for the new count first (every pod reads it at once: new
    pods mount it at start; old ones after `propagation_s`), new pods start with no usage history.
    Scale-in: the newest pods go (a ReplicaSet's choice among equally ready pods) and stop taking
    requests at once; the split drops them at the next tick. `least-request` counts a request open
    from its arrival until an exponential service time (mean `service_s`) ends; a refusal (429)
    closes at once. `affinity` draws each request's session from a Zipf(`zipf`) popularity over
    `sessions` sessions."""
    if router not in ROUTERS:
        raise ValueError(f"router {router!r}: expected one of {', '.join(ROUTERS)}")
    tenant, pool = load(rpm, schedule[0][1])
    key, name = pool_key(pool), tenant.metadata.name
    rng = random.Random(seed)
    born = 0

    def new_replica() -> Replica:
        nonlocal born
        born += 1
        return Replica(f"{pool.metadata.name}-pod-{born - 1}", QuotaGate(), UsageLog())

    replicas = [new_replica() for _ in range(schedule[0][1])]
    previous: TenantSplits | None = None
    written: list[TenantTable] = []  # every table written, by revision
    pending: list[tuple[float, int]] = []  # (when the old pods read it, revision)
    writes = 0

    def replan(now: float) -> None:
        nonlocal previous, writes
        usage = sum_usage([PodObservation(r.pod, r.usage.report(key, "", {}, now)) for r in replicas])
        plan = plan_tenant(tenant, [pool], [], b"k" * 32, {key: len(replicas)}, {key: usage if per_pod else dict(usage)}, previous)
        table = TenantTable(pool=key, tenants=[plan.entries[key]])
        writes += not written or table.tenants != written[-1].tenants
        previous = plan.splits
        written.append(table)
        pending.append((now + propagation_s if replicas[0].tenant is not None else now, len(written) - 1))

    def read(r: Replica, revision: int) -> None:
        if revision > r.revision:
            r.tenant, r.revision = TenantIndex.from_table(written[revision], r.pod).by_name[name], revision

    def install(now: float) -> None:
        while pending and pending[0][0] <= now:
            _, revision = pending.pop(0)
            for r in replicas:
                read(r, revision)

    cum: list[float] = []
    if router == "affinity":
        weights = [1.0 / (k + 1) ** zipf for k in range(sessions)]
        total = 0.0
        for w in weights:
            total += w
            cum.append(total)
    rr, lr, aff = ServiceRouter(), LeastRequestRouter(), AffinityRouter()
    open_requests: list[tuple[float, int, Replica]] = []  # (finish time, tie-break, replica) for least-request
    steps = list(schedule[1:])
    end = minutes * 60.0
    per_minute = [0] * int(minutes)
    now, next_tick, sent, admitted, serial = 0.0, 0.0, 0, 0, 0
    while now < end:
        while steps and steps[0][0] <= now:
            _, n = steps.pop(0)
            if n > len(replicas):
                replicas.extend(new_replica() for _ in range(n - len(replicas)))
                replan(now)
                for r in replicas:
                    if r.tenant is None:  # a new pod mounts the newest table
                        read(r, len(written) - 1)
            else:
                del replicas[n:]
        while next_tick <= now:
            replan(next_tick)
            next_tick += tick_s
        install(now)
        while open_requests and open_requests[0][0] <= now:
            lr.finished(heapq.heappop(open_requests)[2])  # type: ignore[arg-type]
        if router == "round-robin":
            replica = rr.pick(replicas, now)  # type: ignore[arg-type]
        elif router == "least-request":
            replica = lr.pick(replicas, now)  # type: ignore[arg-type]
        else:
            replica = aff.pick(replicas, bisect.bisect_left(cum, rng.random() * cum[-1]))
        ok = replica.offer(name, now)
        if router == "least-request":
            serial += 1
            heapq.heappush(open_requests, (now + (rng.expovariate(1.0 / service_s) if ok else 0.0), serial, replica))
        sent += 1
        admitted += ok
        if ok and int(now // 60) < len(per_minute):
            per_minute[int(now // 60)] += 1
        now += rng.expovariate(offered * rpm / 60.0)
    errors = [a / rpm - 1.0 for a in per_minute]
    after = [errors[int(t // 60)] for t, _ in schedule[1:] if int(t // 60) < len(errors)]
    return RoutedRun(admitted / sent if sent else float("nan"), errors, after, writes)


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
    parser.add_argument("--routers", nargs="+", choices=ROUTERS, default=None,
                        help="Route by these policies over --schedule instead of a fixed --skew.")
    parser.add_argument("--schedule", default="0:2,600:4,1200:3", help="With --routers: SECONDS:REPLICAS,... the pool's size over time.")
    parser.add_argument("--service", type=float, default=2.0, help="With least-request: mean seconds a request stays open (exponential).")
    parser.add_argument("--sessions", type=int, default=50, help="With affinity: sessions, Zipf-popular.")
    parser.add_argument("--zipf", type=float, default=1.2, help="With affinity: the Zipf exponent of session popularity.")
    args = parser.parse_args(argv)
    from slaq.bench.envelope import envelope
    from slaq.bench.report import write_report

    run = envelope(None if argv is None else [__file__, *argv])
    if args.routers:
        try:
            schedule = parse_schedule(args.schedule)
        except ValueError as e:
            parser.error(str(e))
        routed_main(args, schedule, run)
        return
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


def routed_main(args: argparse.Namespace, schedule: list[tuple[float, int]], run: dict[str, Any]) -> None:
    from slaq.bench.report import write_report

    print(f"tenant sends {args.rpm} rpm (its quota), Poisson; pool {args.schedule} (s:replicas); usage tick {args.tick:g} s; "
          f"least-request service mean {args.service:g} s; affinity: {args.sessions} sessions, Zipf {args.zipf:g}; "
          f"{args.minutes:g} min, {args.seeds} seeds; error = admitted per minute / quota - 1")
    print(f"  {'router':<14} {'propagation':>11}  {'split':<16} {'admitted':>8}  {'err max':>8} {'err mean':>8} "
          f"{'after scale mean':>16} {'worst':>7}")
    rows: list[dict] = []
    for router in args.routers:
        for propagation in args.propagation:
            for per_pod, label in ((False, "pool-wide share"), (True, "per-pod shares")):
                runs = [simulate_routed(args.rpm, router, schedule, per_pod=per_pod, minutes=args.minutes, tick_s=args.tick,
                                        propagation_s=propagation, service_s=args.service, sessions=args.sessions,
                                        zipf=args.zipf, offered=1.0, seed=seed) for seed in range(args.seeds)]
                errors = [e for r in runs for e in r.minute_errors]
                after = [e for r in runs for e in r.after_scale]
                row = {"router": router, "propagation_s": propagation, "split": label,
                       "admitted": sum(r.admitted for r in runs) / len(runs), "runs": [r.admitted for r in runs],
                       "error_max": max(errors), "error_mean": sum(errors) / len(errors),
                       "after_scale_mean": sum(after) / len(after) if after else None,
                       "after_scale_min": min(after) if after else None}
                rows.append(row)
                scale = (f"{row['after_scale_mean']:>+16.3f} {row['after_scale_min']:>+7.3f}" if after else f"{'-':>16} {'-':>7}")
                print(f"  {router:<14} {propagation:>9.0f} s  {label:<16} {row['admitted']:>8.3f}  {row['error_max']:>+8.3f} "
                      f"{row['error_mean']:>+8.3f} {scale}")
    if args.out:
        write_report({"schema": "slaq.bench.quota_routing/v1", "rpm": args.rpm, "schedule": [list(s) for s in schedule],
                      "minutes": args.minutes, "tick_s": args.tick, "service_s": args.service, "sessions": args.sessions,
                      "zipf": args.zipf, "seeds": args.seeds, "rows": rows}, args.out, run)
        print(f"report: {args.out}")


if __name__ == "__main__":
    main()
