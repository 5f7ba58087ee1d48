"""`slaq up --demo`: the design report's scenario 4.5 and a loaded run, stock vLLM against slaq.

Three tenants: A, VIP (critical, TTFT objective 50 ms in the report), B, standard (200 ms), C,
free (batch, no objective), with the report's prompts divided by 10 (100 / 500 / 10 tokens) to
fit the tiny CPU model. Two systems, each started once (both at the same time, to save a start):

- stock vLLM: its own scheduler with its static priority policy (`slaq engine --scheduler
  stock-priority`), clients straight to the engine. A request without `priority` gets 0, so
  sent without one the requests are served first come, first served: this one engine is both
  the FCFS baseline and the static-priority one;
- slaq: `slaq engine` (SLAScheduler) and the sidecar in front of it, with the tenants' table
  (and the free tier's bound in the pipe to the engine, `SIDECAR_ARGS`).

Steps:
0. the CPU layout (`cores`): vLLM binds each engine's model worker to a core of its own, and each
   engine's engine core is pinned beside its worker; the API servers, the sidecar and the load
   client are moved onto the other cores, for both systems;
1. each system unloaded, the other paused: each tenant's TTFT (requests one at a time; median and
   90th percentile); objectives: scale = 3 × A's unloaded p90 (the larger of the two systems') /
   50 ms, at least 1 (a fast machine never tightens the report's objectives: the loaded path to
   the engine does not get faster with it); each tenant's objective is its report objective ×
   scale, raised to 3 × its own unloaded p90 where that is larger, so both systems meet every
   objective unloaded with margin;
   the slaq tenant table gets them. Stock's capacity for the tenant mix (the steady rate of a
   closed loop that keeps the batch full and as many queued; the median of `CAPACITY_RUNS`
   measurements, printed with their spread) is measured right after its unloaded TTFT, before slaq's;
2. scenario 4.5 (`scenario45`) under stock FCFS and stock priority; then one Poisson workload at
   `LOAD` × the measured capacity (the mix's free traffic takes the engine past it), long
   enough for `VIP_SAMPLES` VIP requests, replayed by a load generator in its own process
   (`loadgen`) against stock (FCFS);
3. scenario 4.5 under slaq, then the same workload through slaq. TTFT per tenant as the client
   saw it and as the sidecar measured it; SLO met for both systems against the same objectives
   (stock never sees them: it has no use for them). Beside them, the front end's wait for a CPU
   during each loaded run and the client's lateness (`cpu_wait`): over their bounds the run is
   said to have measured a saturated front end; and slaq's handover (release to the engine's first
   byte) by tier and by the requests ahead in the pipe, from the sidecar's access log.

While one system runs, the other's processes are paused (SIGSTOP), so they take no CPU from it. SLO met
= first token within the objective, over all requests sent (a refusal by slaq's admission is a
miss). The example tenants' quotas (rates, concurrency, KV-cache share) are lifted so both
systems serve the same traffic and face the same KV state.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import sys
import time
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from slaq.api.common import Tier
from slaq.api.tenant import TenantSLA
from slaq.bench.metrics import percentile
from slaq.local.cores import descendants, pin_beside_workers, pin_engine_cores
from slaq.local.cpu_wait import WaitMeter, describe_wait, front_end_problems
from slaq.local.demo_report import (
    TenantFigures, access_records, bucket_delta, buckets_by_label, client_late_ms, demo_json, handover_figures, handover_lines, load_table,
    order_text, refusal_lines, scenario_block, write_json, write_png,
)
from slaq.local.errors import LocalError, ScenarioError, StartupError
from slaq.local.loadgen import Outcome, Plan, PlannedRequest, run_in_subprocess, stream_one
from slaq.local.scenario45 import BACKGROUND_TENANT, BLOCK_SIZE, KV_BLOCKS, REQUESTS, KvPlan, NotTogether, ScenarioRun, run_scenario
from slaq.local.stack import LocalStack, StackOptions, StatusLine, describe_failure, new_workdir
from slaq.local.tenants import LocalTenants, local_pool, plan_local_table, read_tenants, write_table
from slaq.sidecar.monitor import gauge_sum


@dataclass(frozen=True)
class TenantProfile:
    """One of the report's three tenants: its letter, tier, prompt and objective in the report, and
    its part of the loaded run (share of the requests, tokens asked for)."""

    letter: str
    label: str
    tier: Tier
    report_prompt_tokens: int
    report_ttft_ms: float | None
    share: float  # fraction of the loaded run's requests
    output_tokens: int  # in the loaded run (scenario 4.5's requests are scenario45.REQUESTS)

    @property
    def prompt_tokens(self) -> int:
        return REQUESTS[self.letter].prompt_tokens


# The loaded run is the report's premise: paying tenants share the engine with free traffic, and
# the free traffic is most of it (60 % of the requests, 128 tokens each, nine tenths of the engine's
# work) and takes the engine past its capacity (`LOAD`). What the paying tenants ask for (A and B)
# is a small part of the engine's work: a scheduler that serves them first can keep their
# objectives; one that serves in arrival order queues them behind the free traffic.
# The overload must be the engine's, not the front end's (vLLM's API server and the sidecar share
# one core): every request costs the front end about the same whatever its length, so the free
# traffic's answers are long enough that the engine, not the front end, is what the load exceeds.
# With 64 tokens, on a machine whose engine ran 67–83 requests/s for the mix, 150 % of it
# saturated slaq's front end in 3 runs of 3 (its API server waiting 273 ms/s for a CPU; VIP met
# 75–99 %); with 128 (19–25 requests/s), in none of 6 (issue 39).
SCENARIO = (
    TenantProfile("A", "A (VIP)", Tier.CRITICAL, 1000, 50.0, 0.30, REQUESTS["A"].output_tokens),
    TenantProfile("B", "B (standard)", Tier.STANDARD, 5000, 200.0, 0.10, REQUESTS["B"].output_tokens),
    TenantProfile("C", "C (free)", Tier.BATCH, 100, None, 0.60, 128),
)
STOCK_PRIORITY = {Tier.CRITICAL: 0, Tier.STANDARD: 1, Tier.BATCH: 2}  # vLLM: lower runs earlier
# slaq's sidecar bounds the free tier's requests in the pipe to the engine (decision 0023, off by
# default in a pool): vLLM's API server sets requests up in arrival order, so a VIP request released
# behind many free ones waits for all of them there. Three runs each (128-token free answers):
# VIP handover p90 33–54 ms and VIP met 86 / 99 / 99 % with it, 38–61 ms and 90 / 92 / 97 % without.
SIDECAR_ARGS = ("--batch-handover-target", "4")
# Of stock's measured capacity for the mix. At 95 % (the report's load in scenario 4.5) the two
# systems were decided by the machine, not the scheduling (measured with 25 / 25 / 50 %: VIP met
# slaq 90 % against stock 59 %, then 99 % against 38 %; standard 87 / 74 %, then 72 / 88 %): the
# slaq pod's sidecar takes CPU from the same two cores, so the pod's own capacity is below stock's
# and 95 % of stock's is about the pod's 100 %.
LOAD = 1.5
OBJECTIVE_MARGIN = 3.0  # objectives ≥ this × the unloaded p90
VIP_SAMPLES = 100
TABLE_POLL_S = 1.5  # the sidecar stats its tenant table file every second
# A small batch and a small KV cache: queues form at demo rates, and scenario 4.5's "KV nearly
# exhausted" holds (scenario45.KvPlan checks the arithmetic).
MAX_NUM_SEQS = 8
ENGINE_ARGS = ("--max-num-seqs", str(MAX_NUM_SEQS), "--max-model-len", "768")
CAPACITY_IN_FLIGHT = 2 * MAX_NUM_SEQS  # the capacity run's closed loop: a full batch and a full batch queued
# The capacity is measured this many times and the median taken: one measurement swung 15.6–31.6
# requests/s (2×) across runs on the same machine, and the load is a multiple of it (issue 39).
CAPACITY_RUNS = 3
# Tokens after the first are streamed 8 at a time (vLLM sends the first at once, so TTFT is not
# delayed): on two cores every streamed chunk costs CPU in the API server and the sidecar, beside
# the engine. Both systems run with it.
STREAM_INTERVAL = 8
VLLM_ARGS = ("--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(KV_BLOCKS), "--stream-interval", str(STREAM_INTERVAL))


@dataclass(frozen=True)
class DemoOptions:
    tenants: tuple[Path, ...]
    model: str | None = None
    engine_args: tuple[str, ...] = ()
    vip_samples: int = VIP_SAMPLES
    unloaded_samples: int = 10
    capacity_burst: int = 160
    capacity_runs: int = CAPACITY_RUNS
    load: float = LOAD  # of stock's measured capacity
    json_path: Path | None = None
    seed: int = 45

    @classmethod
    def quick(cls, **kwargs: Any) -> "DemoOptions":
        """For CI: the same steps with fewer samples (percentiles are rougher)."""
        return cls(**{"vip_samples": 48, "unloaded_samples": 5, "capacity_burst": 96, **kwargs})


@dataclass(frozen=True)
class Unloaded:
    """One system's TTFT per tenant, requests sent one at a time (by letter)."""

    p50_s: dict[str, float]
    p90_s: dict[str, float]


@dataclass(frozen=True)
class Calibration:
    unloaded: dict[str, Unloaded]  # by system: stock, slaq
    capacity_rps: float  # stock's, for the mix (the load's base): the median of `capacity_samples_rps`
    capacity_samples_rps: tuple[float, ...] = ()

    def p90_s(self, letter: str) -> float:
        """The larger unloaded p90 of the systems: every system meets the objectives unloaded, with margin."""
        return max(u.p90_s[letter] for u in self.unloaded.values())

    @property
    def scale(self) -> float:
        """How far the report's objectives are raised for this machine: never below 1. Scaled down
        on a fast run (an unloaded VIP p90 of 9 ms made a 28 ms objective), the objectives fell
        under what the loaded handover to vLLM's API server takes (p90 25–41 ms), which does not
        shrink with the unloaded figure: those runs were the ones under 95 % (issue 39)."""
        vip = SCENARIO[0]
        return max(1.0, OBJECTIVE_MARGIN * self.p90_s(vip.letter) / (vip.report_ttft_ms / 1000.0))  # type: ignore[operator]

    def objective_s(self, profile: TenantProfile) -> float | None:
        if profile.report_ttft_ms is None:
            return None
        return max(profile.report_ttft_ms / 1000.0 * self.scale, OBJECTIVE_MARGIN * self.p90_s(profile.letter))


# ---------------------------------------------------------------- workload


def pick_tenant(rng: random.Random) -> TenantProfile:
    pick, acc = rng.random(), 0.0
    for profile in SCENARIO:
        acc += profile.share
        if pick < acc:
            return profile
    return SCENARIO[-1]


def loaded_workload(rate_rps: float, vip_samples: int, seed: int) -> list[tuple[float, TenantProfile]]:
    """Poisson arrivals at `rate_rps`, tenants drawn from the mix, until `vip_samples` VIP requests are in."""
    rng = random.Random(seed)
    arrivals: list[tuple[float, TenantProfile]] = []
    now, vips = 0.0, 0
    while vips < vip_samples:
        now += rng.expovariate(rate_rps)
        profile = pick_tenant(rng)
        arrivals.append((now, profile))
        vips += profile is SCENARIO[0]
    return arrivals


def mix_burst(count: int) -> list[TenantProfile]:
    """`count` requests in the mix's proportions, interleaved (each next one is the tenant furthest
    behind its share), so completions of the capacity run are not clumped by tenant."""
    out: list[TenantProfile] = []
    for n in range(1, count + 1):
        out.append(max(SCENARIO, key=lambda p: p.share * n - sum(q is p for q in out)))
    return out


def load_plan(url: str, model: str, workload: Sequence[tuple[float, TenantProfile]], keys: Mapping[str, str],
              seed: int) -> Plan:
    """The loaded run for one system; `seed` gives it prompts of its own (no prefix-cache hits across runs)."""
    return Plan(url, model, [PlannedRequest(at, p.letter, keys[p.letter], p.prompt_tokens, p.output_tokens, seed + i)
                             for i, (at, p) in enumerate(workload)])


def scenario_seed(base: int, run: int) -> int:
    """Prompt seeds of the `run`-th scenario-4.5 run: runs whose seeds overlap would send the same
    prompt prefixes, and a prefix-cache hit makes B fit where it must not."""
    return base * 100_000 + run * 1_000


def demo_engine_args(user_args: Sequence[str]) -> tuple[str, ...]:
    """`slaq engine` flags: the demo's, then the user's (which win), then vLLM's after `--`."""
    user = list(user_args)
    own, vllm = (user[:user.index("--")], user[user.index("--") + 1:]) if "--" in user else (user, [])
    return (*ENGINE_ARGS, *own, "--", *VLLM_ARGS, *vllm)


def demo_tenants(local: LocalTenants) -> dict[Tier, TenantSLA]:
    """One tenant per tier from the manifests (the first by name)."""
    by_tier: dict[Tier, TenantSLA] = {}
    for tenant in sorted(local.tenants, key=lambda t: t.metadata.name):
        by_tier.setdefault(tenant.spec.tier, tenant)
    missing = [p.tier.value for p in SCENARIO if p.tier not in by_tier]
    if missing:
        raise LocalError(f"the demo needs a TenantSLA of each tier; none of tier {', '.join(missing)} in the --tenants files")
    return by_tier


def scaled_tenant(tenant: TenantSLA, ttft_s: float | None) -> TenantSLA:
    """The tenant with the scaled TTFT objective, no TPOT objective and no quotas (see module doc).

    The KV-cache share goes too: with it slaq never lets the batch tier fill the KV cache, so
    scenario 4.5's premise (a batch load holding nearly all of it) could not be set up for slaq."""
    spec = tenant.spec.model_copy(update={
        "objectives": tenant.spec.objectives.model_copy(update={"ttft_ms": None if ttft_s is None else round(ttft_s * 1000.0, 1),
                                                                "tpot_ms": None}),
        "quotas": tenant.spec.quotas.model_copy(update={"requests_per_minute": None, "tokens_per_minute": None, "max_concurrency": None,
                                                        "kv_cache_share": 1.0}),
    })
    return tenant.model_copy(update={"spec": spec})


# ---------------------------------------------------------------- measuring


async def unloaded(url: str, model: str, keys: Mapping[str, str], samples: int, seed: int) -> Unloaded:
    """TTFT per tenant with requests sent one at a time (after one warm-up request)."""
    p50: dict[str, float] = {}
    p90: dict[str, float] = {}
    origin = time.monotonic()
    await stream_one(url, model, PlannedRequest(0, "A", keys["A"], 8, 4, seed), origin)  # warm-up
    for profile in SCENARIO:
        ttfts = []
        for i in range(samples):
            request = PlannedRequest(0, profile.letter, keys[profile.letter], profile.prompt_tokens, profile.output_tokens, seed + 1000 + i)
            outcome = await stream_one(url, model, request, origin)
            if outcome.ttft_s is not None:
                ttfts.append(outcome.ttft_s)
        if not ttfts:
            raise LocalError(f"no unloaded request of tenant {profile.label} was answered")
        p50[profile.letter] = statistics.median(ttfts)
        p90[profile.letter] = percentile(ttfts, 90) or p50[profile.letter]
    return Unloaded(p50, p90)


async def capacity(url: str, model: str, keys: Mapping[str, str], burst_size: int, seed: int) -> float:
    """Requests per second for the mix: the steady completion rate of a closed loop that keeps
    `CAPACITY_IN_FLIGHT` requests in flight (the engine's batch full and as many queued).

    All of a burst at once measured 16 and 36 requests/s on two runs of the same machine: its
    completions come in clumps, and the middle half of a clumped series is no rate."""
    burst = [PlannedRequest(0, p.letter, keys[p.letter], p.prompt_tokens, p.output_tokens, seed + i)
             for i, p in enumerate(mix_burst(burst_size))]
    slots = asyncio.Semaphore(CAPACITY_IN_FLIGHT)

    async def one(request: PlannedRequest, origin: float) -> Outcome:
        async with slots:
            return await stream_one(url, model, request, origin)

    origin = time.monotonic()
    outcomes = await asyncio.gather(*(one(r, origin) for r in burst))
    rate = steady_rate([o.ended_at for o in outcomes if o.finished and o.ended_at is not None])
    if rate is None:
        raise LocalError("the engine finished too few requests of the capacity burst to measure its rate")
    return rate


def steady_rate(ended_at: Sequence[float]) -> float | None:
    """Completions per second between the first and the last quarter of a burst's completions.

    The whole burst's count over its whole time would undercount: at its start the first
    requests are still in prefill, at its end the batch runs less than full."""
    ends = sorted(ended_at)
    if len(ends) < 8:
        return None
    first, last = len(ends) // 4, (3 * len(ends)) // 4
    span = ends[last] - ends[first]
    return (last - first) / span if span > 0 else None


def sidecar_ttft_buckets(metrics_url: str) -> dict[str, list[tuple[float, float]]]:
    """The sidecar's `slaq_ttft_seconds` buckets by tenant, read from `metrics_url` (its /metrics)."""
    import httpx

    return buckets_by_label(httpx.get(metrics_url, timeout=10.0).text, "slaq_ttft_seconds", "tenant")


def sidecar_metrics_url(stack: LocalStack) -> str:
    return stack.metrics_url + "/metrics"


def figures(outcomes: Sequence[Any], objectives: Mapping[str, float | None],
            sidecar: Mapping[str, list[tuple[float, float]]] | None = None) -> dict[str, TenantFigures]:
    rows = {p.letter: TenantFigures(objectives[p.letter], [o for o in outcomes if o.letter == p.letter],
                                    None if sidecar is None else sidecar.get(p.letter, [])) for p in SCENARIO}
    return rows


# ---------------------------------------------------------------- processes


def _start_both(stock: LocalStack, slaq_stack: LocalStack, status: StatusLine) -> float:
    """Start both stacks at once (an engine start is most of the demo's time); seconds taken."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        started = [pool.submit(stock.start, lambda e, line: status.show(f"  starting stock vLLM and slaq … {e:4.0f}s  {line}")),
                   pool.submit(slaq_stack.start)]
        try:
            for future in as_completed(started):
                future.result()
        except BaseException:
            # The other start is still waiting for its engine: stopping its children ends that wait.
            stock.stop()
            slaq_stack.stop()
            raise
    elapsed = time.monotonic() - t0
    status.done(f"  stock vLLM and slaq ready in {elapsed:.0f}s (started side by side)")
    return elapsed


@contextmanager
def paused(stack: LocalStack) -> Iterator[None]:
    """The stack's processes stopped (SIGSTOP) inside the block, continued (SIGCONT) whatever happens."""
    for child in stack.children:
        child.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for child in stack.children:
            child.signal(signal.SIGCONT)


def _load_run(plan: Plan, workdir: Path, name: str, status: StatusLine) -> list[Any]:
    t0 = time.monotonic()
    duration = plan.requests[-1].at if plan.requests else 0.0
    outcomes = run_in_subprocess(plan, workdir, name, lambda done, total: status.show(
        f"  {name}: {time.monotonic() - t0:4.0f}s ({duration:.0f}s of arrivals), {done}/{total} answered"))
    status.done(f"  {name}: {len(plan.requests)} requests answered in {time.monotonic() - t0:.0f}s")
    return outcomes


# ---------------------------------------------------------------- the run


def run_demo(options: DemoOptions) -> int:
    t_start = time.monotonic()
    timings: dict[str, float] = {}
    status = StatusLine(every_s=5.0)
    if problems := KvPlan().problems():
        raise LocalError("scenario 4.5's KV plan is inconsistent: " + "; ".join(problems))
    local = read_tenants(list(options.tenants))
    by_tier = demo_tenants(local)
    names = {p.letter: by_tier[p.tier].metadata.name for p in SCENARIO}
    keys = {letter: local.keys[name][0] for letter, name in names.items()}
    engine_args = demo_engine_args(options.engine_args)
    workdir = new_workdir("slaq-demo-")
    print("slaq demo: the design report's scenario 4.5 — A (VIP, TTFT < 50 ms), B (standard, < 200 ms), C (free, no SLO)")
    print(f"  tenants {', '.join(f'{p.label} = {names[p.letter]}' for p in SCENARIO)}; logs in {workdir}")

    def tenants_with(objectives: Mapping[str, float | None]) -> LocalTenants:
        return LocalTenants([scaled_tenant(by_tier[p.tier], objectives[p.letter]) for p in SCENARIO],
                            {name: local.keys[name] for name in names.values()})

    table_path = workdir / "tenants.json"
    model_name = options.model or "slaq-tiny"
    # The manifests' objectives until calibration; the sidecar reloads the file when it changes.
    report_objectives = {p.letter: None if p.report_ttft_ms is None else p.report_ttft_ms / 1000.0 for p in SCENARIO}
    write_table(plan_local_table(tenants_with(report_objectives), local_pool(model_name)), table_path)
    stock = LocalStack(StackOptions(model=options.model, scheduler="stock-priority", engine_args=engine_args), workdir)
    slaq_stack = LocalStack(StackOptions(port=0, model=options.model, scheduler="slaq", engine_args=engine_args,
                                         tenant_table=table_path, sidecar_args=SIDECAR_ARGS), workdir)
    print("1/5 starting stock vLLM (its own scheduler; priority policy, FCFS when no priority is sent) and slaq "
          "(sidecar + SLAScheduler) side by side")
    with slaq_stack, stock:
        timings["engines_start_s"] = _start_both(stock, slaq_stack, status)
        engines = [c.pid for c in (stock.engine, slaq_stack.engine) if c is not None]
        print(describe_cores(pin_beside_workers(engines, [c.pid for c in (slaq_stack.sidecar,) if c is not None]), pin_engine_cores(engines)),
              flush=True)
        model = stock.served_model_name
        calibration_seed = options.seed * 1_000_000
        with paused(slaq_stack):  # no CPU from slaq while stock is measured
            print("2/5 each system unloaded (the objectives; the other one paused), then stock vLLM saturated (the load's rate)")
            t0 = time.monotonic()
            stock_unloaded = asyncio.run(unloaded(stock.url, model, keys, options.unloaded_samples, calibration_seed))
            capacities = tuple(asyncio.run(capacity(stock.url, model, keys, options.capacity_burst, calibration_seed + 5000 + 1000 * i))
                               for i in range(options.capacity_runs))
        with paused(stock):
            _wait_ready(slaq_stack)
            slaq_unloaded = asyncio.run(unloaded(slaq_stack.url, model, keys, options.unloaded_samples, calibration_seed + 10_000))
        calibration = Calibration({"stock": stock_unloaded, "slaq": slaq_unloaded}, statistics.median(capacities), capacities)
        objectives = {p.letter: calibration.objective_s(p) for p in SCENARIO}
        write_table(plan_local_table(tenants_with(objectives), local_pool(model)), table_path)
        rate = options.load * calibration.capacity_rps
        workload = loaded_workload(rate, options.vip_samples, options.seed)
        print(describe_objectives(calibration, objectives), flush=True)
        print(describe_load(calibration, rate, workload), flush=True)
        timings["calibration_s"] = time.monotonic() - t0

        with paused(slaq_stack):
            print("3/5 scenario 4.5 on stock vLLM: FCFS (no priority sent), then static priority (A 0, B 1, C 2)")
            t0 = time.monotonic()
            scenario = [_scenario(stock, model, keys, "fcfs", {x: None for x in "ABC"}, None, scenario_seed(options.seed, 1)),
                        _scenario(stock, model, keys, "priority", {p.letter: STOCK_PRIORITY[p.tier] for p in SCENARIO},
                                  STOCK_PRIORITY[_tier_of(BACKGROUND_TENANT)], scenario_seed(options.seed, 2))]
            timings["scenario_stock_s"] = time.monotonic() - t0
            print("4/5 the loaded run on stock vLLM (FCFS); the load generator runs in a process of its own")
            t0 = time.monotonic()
            meters = {"stock API server": WaitMeter([stock.engine.pid], with_descendants=False).start()}  # type: ignore[union-attr]
            stock_outcomes = _load_run(load_plan(stock.url, model, workload, keys, options.seed * 100_000), workdir, "stock vLLM", status)
            cpu_wait = {"stock": {name: meter.per_second_ms() for name, meter in meters.items()}}
            timings["load_stock_s"] = time.monotonic() - t0
            stock.stop()

        print("5/5 slaq: scenario 4.5, then the same load (stock vLLM stopped)")
        _wait_ready(slaq_stack)
        time.sleep(TABLE_POLL_S)  # the sidecar looks at the table file (the objectives) every second
        t0 = time.monotonic()
        scenario.append(_scenario(slaq_stack, model, keys, "slaq", {x: None for x in "ABC"}, None, scenario_seed(options.seed, 3)))
        timings["scenario_slaq_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        metrics_url = sidecar_metrics_url(slaq_stack)
        before = sidecar_ttft_buckets(metrics_url)
        meters = {"slaq's sidecar": WaitMeter([slaq_stack.sidecar.pid]).start(),  # type: ignore[union-attr]
                  "slaq's API server": WaitMeter([slaq_stack.engine.pid], with_descendants=False).start()}  # type: ignore[union-attr]
        load_from = time.time()
        slaq_outcomes = _load_run(load_plan(slaq_stack.url, model, workload, keys, options.seed * 200_000), workdir, "slaq", status)
        cpu_wait["slaq"] = {name: meter.per_second_ms() for name, meter in meters.items()}
        after = sidecar_ttft_buckets(metrics_url)
        handover = handover_figures(access_records(slaq_stack.sidecar.log_path.read_text(errors="replace").splitlines(), load_from),  # type: ignore[union-attr]
                                    {p.tier.value: p.label for p in SCENARIO})
        timings["load_slaq_s"] = time.monotonic() - t0
    sidecar = {letter: bucket_delta(after.get(name, []), before.get(name)) for letter, name in names.items()}
    load = {"stock": figures(stock_outcomes, objectives), "slaq": figures(slaq_outcomes, objectives, sidecar)}
    png = write_png(load, {p.letter: p.tier.value for p in SCENARIO}, workdir / "demo-ttft.png",
                    "TTFT per tenant (A = critical, B = standard, C = batch), stock vLLM vs slaq; objectives dashed")
    timings["total_s"] = time.monotonic() - t_start
    front_end = {system: front_end_problems(client_late_ms(load[system]), cpu_wait[system]) for system in ("stock", "slaq")}
    print_results(scenario, load, rate, calibration.capacity_rps, workload, png, cpu_wait, front_end, handover)
    report = demo_json(scenario, load, {
        "calibration": calibration_json(calibration), "objectives_ms": _ms_map(objectives), "rate_rps": round(rate, 3),
        "cpu_wait_ms_per_s": {system: {name: None if v is None else round(v, 1) for name, v in waits.items()} for system, waits in cpu_wait.items()},
        "front_end_saturated": {system: bool(problems) for system, problems in front_end.items()},
        "front_end_problems": front_end, "handover": handover,
        "requests": len(workload), "png": str(png), "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "workdir": str(workdir)})
    if options.json_path is not None:
        print(f"figures: {write_json(report, options.json_path)}")
    print(f"demo took {timings['total_s']:.0f}s (engines {timings['engines_start_s']:.0f}s).")
    return 0


def print_results(scenario: Sequence[ScenarioRun], load: Mapping[str, Mapping[str, TenantFigures]], rate: float, capacity_rps: float,
                  workload: Sequence[tuple[float, TenantProfile]], png: Path, cpu_wait: Mapping[str, Mapping[str, float | None]],
                  front_end: Mapping[str, Sequence[str]], handover: Mapping[str, Mapping[str, Any]]) -> None:
    print()
    print("scenario 4.5: B, A and C arrive together (in that order, 5 ms apart) while a standard-tier load holds all but "
          f"{KvPlan().free_blocks(background_done=False)} of {KV_BLOCKS} KV blocks; order = first tokens back")
    print(scenario_block(scenario))
    print()
    print(f"loaded run: {len(workload)} requests at {rate:.2f}/s ({rate / capacity_rps:.0%} of capacity), "
          f"{sum(p is SCENARIO[0] for _, p in workload)} of them VIP")
    print(load_table({"stock vLLM (FCFS)": load["stock"], "slaq": load["slaq"]}, {p.letter: p.label for p in SCENARIO}))
    if refusals := refusal_lines(load):
        print(refusals)
    print("  the client's own CPU wait (requests sent late against the plan, p99 over all tenants): "
          + ", ".join(f"{name} {client_late_ms(load[system]):.0f} ms" for system, name in (("stock", "stock vLLM"), ("slaq", "slaq"))))
    print("  the front end's wait for a CPU during the loaded run: " + "; ".join(describe_wait(waits) for waits in cpu_wait.values()))
    for system, name in (("stock", "stock vLLM"), ("slaq", "slaq")):
        if front_end[system]:
            print(f"  FRONT END SATURATED in {name}'s run: {'; '.join(front_end[system])}: its figures measure this machine's "
                  "CPU, not the scheduling (run again on a quieter machine)")
    print(handover_lines(handover))
    print("\n(TTFT in ms as the client saw it (p50, p99) and as slaq's sidecar measured it (sc p99, from its "
          "slaq_ttft_seconds histogram; stock has no sidecar); a gap between the two is the client waiting for CPU. "
          "SLO met = first token within the objective, over all requests sent; done = streams completed / sent.)")
    print(f"picture: {png}")


def calibration_json(calibration: Calibration) -> dict[str, Any]:
    return {"unloaded_p50_ms": {s: _ms_map(u.p50_s) for s, u in calibration.unloaded.items()},
            "unloaded_p90_ms": {s: _ms_map(u.p90_s) for s, u in calibration.unloaded.items()},
            "capacity_rps": round(calibration.capacity_rps, 3), "capacity_samples_rps": [round(c, 3) for c in calibration.capacity_samples_rps],
            "scale": round(calibration.scale, 3),
            "objective_margin": OBJECTIVE_MARGIN}


def _ms_map(values: Mapping[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else round(v * 1000.0, 1) for k, v in values.items()}


def _tier_of(letter: str) -> Tier:
    return next(p.tier for p in SCENARIO if p.letter == letter)


class EngineHold:
    """The demo's hold on a stack's engine for scenario 4.5 (`scenario45.run_scenario`): it stops
    the engine's scheduler once the engine holds the background's blocks, and keeps it stopped
    while A, B and C arrive.

    Stopping is SIGSTOP to the engine's API server's descendants (vLLM's engine core and model
    workers; SIGCONT whatever happens): the API server (and the sidecar) keep taking requests and
    hand them to the engine core's input queue, where its first step after the hold finds them
    all. `holding` runs the engine in pulses of `PULSE_S` and looks, with the engine stopped, at
    its own metrics: it has admitted the background (vLLM's prefix-cache lookups, one per admitted
    prompt: a counter, so an earlier run's last value does not answer) and holds its blocks
    (`vllm:kv_cache_usage_perc`, from its last step). So the background cannot run to its end
    between two looks, however slowly this machine steps or answers a scrape; traced with a poll
    of a running engine, the background's 64 tokens were often done before a scrape came back.
    It also counts the tokens generated meanwhile (`vllm:generation_tokens_total`): a background
    that decoded past `KvPlan.decode_margin` would rightly keep C waiting for B, so that run is
    run again (`NotTogether`)."""

    QUERIES = "vllm:prefix_cache_queries_total"
    GENERATED = "vllm:generation_tokens_total"
    KV_USAGE = "vllm:kv_cache_usage_perc"
    PULSE_S = 0.01

    def __init__(self, stack: LocalStack) -> None:
        if stack.engine is None:
            raise ScenarioError("the stack has no engine to hold")
        self.stack = stack
        self.metrics_url = f"http://127.0.0.1:{stack.engine_port}/metrics"
        self._queries = self._generated = 0.0
        self._stopped: list[int] = []

    async def _read(self, client: Any) -> tuple[float, float, float]:
        """The engine's prefix-cache lookups (prompt tokens), tokens generated, and KV use (0 until
        its first step: vLLM's multiprocess gauge has no sample before it is set)."""
        text = (await client.get(self.metrics_url, timeout=10.0)).text
        queries, generated, usage = (gauge_sum(text, name) for name in (self.QUERIES, self.GENERATED, self.KV_USAGE))
        if queries is None or generated is None:
            raise ScenarioError(f"the engine's /metrics has no {self.QUERIES} or {self.GENERATED}: cannot tell when it holds the background")
        return queries, generated, usage or 0.0

    async def arm(self) -> None:
        """Read the counters before the background is sent."""
        import httpx

        async with httpx.AsyncClient() as client:
            self._queries, self._generated, _ = await self._read(client)

    async def holding(self, prompt_tokens: int, blocks: int, max_decoded: int, timeout_s: float) -> None:
        """Return, the engine stopped, once it admitted `prompt_tokens` more prompt tokens and holds
        `blocks` blocks; `NotTogether` when it decoded more than `max_decoded` tokens by then."""
        import httpx

        deadline = time.monotonic() + timeout_s
        try:
            self._stop()  # at once: making the HTTP client below took 0.3 s once, time enough for the background to run to its end
            async with httpx.AsyncClient() as client:
                while True:
                    self._stop()
                    await asyncio.sleep(self.PULSE_S)  # the step's stats in flight reach the API server
                    queries, generated, usage = await self._read(client)
                    if generated - self._generated > max_decoded:  # also when it ran to its end (its blocks free again)
                        raise NotTogether(f"the background decoded {generated - self._generated:.0f} tokens before the engine "
                                          f"was held, more than the {max_decoded} that leave C time to finish before B's room")
                    if queries >= self._queries + prompt_tokens and usage * KV_BLOCKS >= blocks - 0.5:
                        return
                    if time.monotonic() > deadline:
                        raise NotTogether(f"the engine did not hold the background's {blocks} blocks within {timeout_s:g} s "
                                          f"(admitted {queries - self._queries:.0f} of {prompt_tokens} prompt tokens, KV use {usage:.0%})")
                    self._resume()
                    await asyncio.sleep(self.PULSE_S)
        except BaseException:
            self._resume()
            raise

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """The engine stopped inside the block (it may be already, by `holding`), continued after."""
        try:
            self._stop()
            yield
        finally:
            self._resume()

    def _stop(self) -> None:
        if self._stopped:
            return
        pids = descendants(self.stack.engine.pid)  # type: ignore[union-attr]
        if not pids:
            raise ScenarioError(f"the engine (pid {self.stack.engine.pid}) has no engine core process to hold")  # type: ignore[union-attr]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            self._stopped.append(pid)

    def _resume(self) -> None:
        while self._stopped:
            try:
                os.kill(self._stopped.pop(), signal.SIGCONT)
            except ProcessLookupError:
                pass


def _scenario(stack: LocalStack, model: str, keys: Mapping[str, str], system: str, priorities: Mapping[str, int | None],
              background_priority: int | None, seed: int, attempts: int = 3) -> ScenarioRun:
    for attempt in range(attempts):
        try:
            # Each attempt's prompts are new (seed + 300 per attempt stays within the run's 1,000 seeds).
            run = asyncio.run(run_scenario(system, stack.url, model, keys, priorities, seed + 300 * attempt, keys[BACKGROUND_TENANT],
                                           background_priority, hold=EngineHold(stack)))
        except NotTogether as exc:
            print(f"  {system}: {exc}; again", flush=True)
            continue
        if stack.options.scheduler == "slaq" and stack.engine is not None:
            run.engine_started = engine_started(stack.engine.log_path, {x: run.outcomes[x].request_id for x in "ABC"})
        engine = f" (in the engine: {order_text(run.engine_groups)})" if run.engine_groups is not None else ""
        print(f"  {system}: started {order_text(run.groups)}{engine}", flush=True)
        return run
    raise ScenarioError(f"scenario 4.5 under {system}: A, B and C were never sent together in {attempts} attempts")


def engine_started(log_path: Path, request_ids: Mapping[str, str | None], timeout_s: float = 10.0) -> dict[str, float]:
    """When slaq's engine first scheduled each request (by letter, epoch seconds: its request-log
    line's arrival `time` plus `queue_wait_s`, both the engine's own), read from the engine's log;
    a letter whose line has not appeared within `timeout_s` (the line is written when the request
    leaves the engine) is left out."""
    wanted = {rid: letter for letter, rid in request_ids.items() if rid}
    found: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        for line in log_path.read_text(errors="replace").splitlines():
            if not line.startswith("{") or '"engine_request"' not in line:
                continue
            try:
                record = json.loads(line)
                letter = wanted.get(record.get("request_id"))
                if letter is not None and record.get("event") == "engine_request":
                    found[letter] = datetime.fromisoformat(record["time"]).timestamp() + float(record["queue_wait_s"])
            except (ValueError, KeyError, TypeError):
                continue
        if len(found) == len(wanted) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _wait_ready(stack: LocalStack, timeout_s: float = 30.0) -> None:
    """After SIGCONT: until the sidecar answers /ready again."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (failed := stack.failed_child()) is not None:
            raise LocalError(f"slaq's {failed.name} exited; its log is {failed.log_path}")
        try:
            if httpx.get(stack.url + "/ready", timeout=5.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise LocalError(f"slaq's sidecar was not ready {timeout_s:.0f}s after it was resumed")


def describe_cores(cores: set[int] | None, engine_cores: Mapping[int, set[int]] | None = None) -> str:
    beside = (f"each engine core ({len(engine_cores)}) beside its own model worker on the cores vLLM bound the worker to"
              if engine_cores else "the engine cores where the kernel puts them (none found beside a worker)")
    if cores is None:
        return f"  CPU layout: as the kernel places it (the engines' model workers leave no core free, or this is not Linux); {beside}"
    return (f"  CPU layout: the engines' model workers on the cores vLLM bound them to, {beside}; their API servers, slaq's sidecar "
            f"and the load client on the others ({', '.join(map(str, sorted(cores)))}), for both systems")


def describe_load(calibration: Calibration, rate: float, workload: Sequence[tuple[float, TenantProfile]]) -> str:
    vips = sum(p is SCENARIO[0] for _, p in workload)
    samples = calibration.capacity_samples_rps
    spread = (f", the median of {len(samples)} runs: {min(samples):.2f}–{max(samples):.2f}" if len(samples) > 1 else "")
    return (f"  stock vLLM's capacity for the mix: {calibration.capacity_rps:.2f} requests/s (completions of a closed loop with "
            f"{CAPACITY_IN_FLIGHT} requests in flight, between its first and last quarter{spread})\n"
            f"  load: {rate / calibration.capacity_rps:.0%} of it = {rate:.2f} requests/s, the same for both systems, Poisson, "
            f"{len(workload)} requests over {workload[-1][0]:.0f}s ({vips} VIP; mix {' / '.join(f'{p.share:.0%}' for p in SCENARIO)})")


def describe_objectives(calibration: Calibration, objectives: Mapping[str, float | None]) -> str:
    lines = ["  unloaded TTFT (one request at a time; median / p90 in ms):"]
    for p in SCENARIO:
        cells = "   ".join(f"{system} {u.p50_s[p.letter] * 1000:.0f} / {u.p90_s[p.letter] * 1000:.0f}"
                           for system, u in calibration.unloaded.items())
        lines.append(f"    {p.label:<13} prompt {p.prompt_tokens:>4} tokens (report: {p.report_prompt_tokens}), "
                     f"{p.output_tokens} out: {cells}")
    vip = SCENARIO[0]
    lines.append(f"  objectives: scale = max(1, {OBJECTIVE_MARGIN:.0f} × {calibration.p90_s(vip.letter) * 1000:.0f} ms (A's unloaded p90, "
                 f"the larger of the systems') / {vip.report_ttft_ms:.0f} ms (A's objective in the report)) = {calibration.scale:.2f}; "
                 f"each = report objective × scale, at least {OBJECTIVE_MARGIN:.0f} × its own unloaded p90")
    for p in SCENARIO:
        if p.report_ttft_ms is not None:
            lines.append(f"    {p.label:<13} max({p.report_ttft_ms:.0f} ms × {calibration.scale:.2f}, "
                         f"{OBJECTIVE_MARGIN:.0f} × {calibration.p90_s(p.letter) * 1000:.0f} ms) = "
                         f"{objectives[p.letter] * 1000:.0f} ms")  # type: ignore[operator]
    return "\n".join(lines)


def run_demo_main(options: DemoOptions) -> int:
    try:
        return run_demo(options)
    except StartupError as exc:
        print(f"\nslaq up --demo: {describe_failure(exc)}", file=sys.stderr)
        return 1
    except LocalError as exc:
        print(f"\nslaq up --demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nslaq up --demo: interrupted; every process it started is stopped.", file=sys.stderr)
        return 130
