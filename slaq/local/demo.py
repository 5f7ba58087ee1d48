"""`slaq up --demo`: the design report's scenario (4.5), once with stock vLLM and once with slaq.

Three tenants: A, VIP (critical, TTFT objective 50 ms), B, standard (200 ms), C, free (batch, no
objective), with the report's prompt sizes (1,000 / 5,000 / 100 tokens) divided by 10 to fit the
tiny CPU model. The objectives are scaled honestly, from measurements on this machine:

1. the stock engine starts; each tenant's unloaded TTFT is measured (requests sent one at a
   time; median and 90th percentile), and the engine's capacity for the tenant mix (requests per
   second while saturated by a burst);
2. scale = the VIP prompt's unloaded TTFT here (90th percentile: an objective is a tail target,
   and this machine's latency is noisy where the reference model's is not) / its TTFT on the
   reference GPU (Llama-3-8B on an H200, from the benchmark's step-time model,
   `slaq.bench.stepcost`); each tenant's objective is its report objective × scale;
3. one Poisson workload at 95 % of the measured capacity is replayed against stock vLLM (its
   own scheduler, FCFS, clients straight to the engine) and against slaq (sidecar + SLAScheduler
   with the tenants' table), and the per-tenant figures are printed side by side.

The scenario names only TTFT objectives, so SLO met = first token within the objective; a
request refused by slaq's admission counts as not met. The example tenants' quotas are lifted
so both runs serve the same traffic.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from slaq.api.common import Tier
from slaq.api.tenant import TenantSLA
from slaq.local.errors import LocalError, StartupError
from slaq.local.stack import LocalStack, StackOptions, StatusLine, describe_failure, new_workdir
from slaq.local.tenants import LocalTenants, local_pool, plan_local_table, read_tenants, write_table

PROMPT_DIVISOR = 10  # the report's prompts (1,000 / 5,000 / 100 tokens) scaled to the tiny model


@dataclass(frozen=True)
class TenantProfile:
    """One of the report's three tenants: its tier, prompt and objective on the reference GPU."""

    label: str
    tier: Tier
    report_prompt_tokens: int
    report_ttft_ms: float | None
    output_tokens: int
    share: float  # fraction of the requests


SCENARIO = (
    TenantProfile("A (VIP)", Tier.CRITICAL, 1000, 50.0, 16, 0.2),
    TenantProfile("B (standard)", Tier.STANDARD, 5000, 200.0, 64, 0.3),
    TenantProfile("C (free)", Tier.BATCH, 100, None, 256, 0.5),
)
REFERENCE_PROFILE = "h200-llama3-8b"
LOAD = 0.95
ENGINE_ARGS = ("--max-num-seqs", "2", "--max-model-len", "1024")  # a small batch, so the queue forms at demo rates


@dataclass(frozen=True)
class DemoOptions:
    tenants: tuple[Path, ...]
    model: str | None = None
    engine_args: tuple[str, ...] = ()
    run_seconds: float = 45.0
    unloaded_samples: int = 10
    capacity_burst: int = 24
    seed: int = 45


@dataclass(frozen=True)
class Calibration:
    unloaded_ttft_s: dict[str, float]  # by tenant label: median
    unloaded_p90_s: dict[str, float]  # by tenant label: 90th percentile
    reference_ttft_s: float  # the VIP prompt on the reference GPU
    capacity_rps: float

    @property
    def scale(self) -> float:
        return self.unloaded_p90_s[SCENARIO[0].label] / self.reference_ttft_s

    def objective_s(self, profile: TenantProfile) -> float | None:
        return None if profile.report_ttft_ms is None else profile.report_ttft_ms / 1000.0 * self.scale


@dataclass
class RunFigures:
    sent: int = 0
    completed: int = 0
    met: int = 0
    refused: int = 0
    ttft_s: list[float] = field(default_factory=list)


# ---------------------------------------------------------------- workload


def prompt_tokens(profile: TenantProfile) -> int:
    return max(1, profile.report_prompt_tokens // PROMPT_DIVISOR)


def reference_ttft_s(tokens: int) -> float:
    """Unloaded TTFT (one prefill step) of `tokens` on the reference GPU, from the step-time model."""
    from slaq.bench.pool_profile import load_profile
    from slaq.bench.stepcost import ScheduledWork, StepCostModel

    return StepCostModel(load_profile(REFERENCE_PROFILE)).step_seconds([ScheduledWork(tokens, 0, True)])


def scenario_workload(rate_rps: float, seconds: float, seed: int) -> list[tuple[float, TenantProfile]]:
    """Poisson arrivals at `rate_rps` for `seconds`, each request drawn from the tenant mix."""
    rng = random.Random(seed)
    arrivals, now = [], rng.expovariate(rate_rps)
    while now < seconds:
        pick, acc = rng.random(), 0.0
        for profile in SCENARIO:
            acc += profile.share
            if pick < acc:
                break
        arrivals.append((now, profile))
        now += rng.expovariate(rate_rps)
    return arrivals


def mix_burst(count: int) -> list[TenantProfile]:
    """`count` requests in the mix's proportions (for the capacity burst)."""
    out: list[TenantProfile] = []
    for profile in SCENARIO:
        out += [profile] * round(count * profile.share)
    return out


def demo_tenants(local: LocalTenants) -> tuple[LocalTenants, dict[Tier, TenantSLA]]:
    """One tenant per tier from the manifests (the first by name)."""
    by_tier: dict[Tier, TenantSLA] = {}
    for tenant in sorted(local.tenants, key=lambda t: t.metadata.name):
        by_tier.setdefault(tenant.spec.tier, tenant)
    missing = [p.tier.value for p in SCENARIO if p.tier not in by_tier]
    if missing:
        raise LocalError(f"the demo needs a TenantSLA of each tier; none of tier {', '.join(missing)} in the --tenants files")
    return local, by_tier


def scaled_tenant(tenant: TenantSLA, ttft_s: float | None) -> TenantSLA:
    """The tenant with the scaled TTFT objective, no TPOT objective and no quotas (see module doc)."""
    spec = tenant.spec.model_copy(update={
        "objectives": tenant.spec.objectives.model_copy(update={"ttft_ms": None if ttft_s is None else round(ttft_s * 1000.0, 1),
                                                                "tpot_ms": None}),
        "quotas": tenant.spec.quotas.model_copy(update={"requests_per_minute": None, "tokens_per_minute": None, "max_concurrency": None}),
    })
    return tenant.model_copy(update={"spec": spec})


# ---------------------------------------------------------------- HTTP


async def _request(client, url: str, model: str, key: str, prompt: int, output: int, seed: int) -> tuple[int | None, float | None, bool]:
    """(status, ttft seconds, finished) of one streaming completion."""
    import json

    rng = random.Random(seed)
    body = {"model": model, "prompt": [rng.randrange(10, 200) for _ in range(prompt)], "max_tokens": output,
            "min_tokens": output, "ignore_eos": True, "stream": True}
    started = time.monotonic()
    ttft = None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as response:
            if response.status_code != 200:
                await response.aread()
                return response.status_code, None, False
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return 200, ttft, True
                if ttft is not None:
                    continue  # only the first token's time is needed: spare the CPU the engine shares
                # Every chunk carries new tokens; the first token's text may still be empty (a partial
                # UTF-8 sequence from the random-weight model), so any chunk with a choice counts.
                choices = json.loads(payload).get("choices") or []
                if ttft is None and choices:
                    ttft = time.monotonic() - started
    except Exception:  # a broken stream is a result here, not a crash
        return None, ttft, False
    return 200, ttft, False


def _client():
    import httpx

    return httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=10.0), limits=httpx.Limits(max_connections=512))


async def calibrate(url: str, model: str, key: str, options: DemoOptions) -> Calibration:
    unloaded: dict[str, float] = {}
    tails: dict[str, float] = {}
    async with _client() as client:
        await _request(client, url, model, key, 8, 4, 0)  # warm-up: first-request costs are not the model's
        for profile in SCENARIO:
            samples = []
            for i in range(options.unloaded_samples):
                _, ttft, _ = await _request(client, url, model, key, prompt_tokens(profile), profile.output_tokens, 1000 + i)
                if ttft is not None:
                    samples.append(ttft)
            if not samples:
                raise LocalError(f"the engine answered no unloaded request of tenant {profile.label}")
            unloaded[profile.label] = statistics.median(samples)
            tails[profile.label] = nearest_rank(samples, 90) or unloaded[profile.label]
        burst = mix_burst(options.capacity_burst)
        started = time.monotonic()
        results = await asyncio.gather(*(_request(client, url, model, key, prompt_tokens(p), p.output_tokens, 2000 + i)
                                         for i, p in enumerate(burst)))
        elapsed = time.monotonic() - started
    done = sum(1 for _, _, finished in results if finished)
    if done == 0:
        raise LocalError("the engine finished no request of the capacity burst")
    return Calibration(unloaded, tails, reference_ttft_s(SCENARIO[0].report_prompt_tokens), done / elapsed)


async def replay(url: str, model: str, keys: dict[str, str], workload: Sequence[tuple[float, TenantProfile]],
                 objectives: dict[str, float | None], label: str, status: StatusLine, seconds: float) -> dict[str, RunFigures]:
    figures = {p.label: RunFigures() for p in SCENARIO}
    answered = 0

    async def one(index: int, at: float, profile: TenantProfile) -> None:
        nonlocal answered
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        code, ttft, finished = await _request(client, url, model, keys[profile.label], prompt_tokens(profile),
                                              profile.output_tokens, 10_000 + index)
        row = figures[profile.label]
        row.sent += 1
        row.refused += code is not None and code != 200
        row.completed += finished
        if ttft is not None:
            row.ttft_s.append(ttft)
        goal = objectives[profile.label]
        row.met += finished and ttft is not None and (goal is None or ttft <= goal)
        answered += 1

    async with _client() as client:
        started = time.monotonic()
        tasks = [asyncio.create_task(one(i, at, p)) for i, (at, p) in enumerate(workload)]
        while not all(t.done() for t in tasks):
            elapsed = time.monotonic() - started
            status.show(f"  {label}: {min(elapsed, seconds):4.0f}/{seconds:.0f}s of arrivals, {answered}/{len(workload)} answered")
            await asyncio.wait(tasks, timeout=0.5)
        for task in tasks:
            task.result()
    status.done(f"  {label}: {len(workload)} requests answered in {time.monotonic() - started:.0f}s")
    return figures


# ---------------------------------------------------------------- report


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:.0f}"


def _pct(part: int, whole: int) -> str:
    return "—" if whole == 0 else f"{100.0 * part / whole:.0f}%"


def nearest_rank(values: Sequence[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100.0 * len(ordered)) - 1)]


def results_table(runs: dict[str, dict[str, RunFigures]], objectives: dict[str, float | None]) -> str:
    names = list(runs)
    head1 = f"{'tenant':<14} {'objective':>9} │ " + " │ ".join(f"{n:^33}" for n in names)
    head2 = f"{'':<14} {'TTFT ms':>9} │ " + " │ ".join(f"{'p50':>6} {'p99':>6} {'SLO met':>8} {'done':>9}" for _ in names)
    lines = [head1, head2, "─" * len(head2)]
    for profile in SCENARIO:
        goal = objectives[profile.label]
        cells = []
        for name in names:
            row = runs[name][profile.label]
            met = _pct(row.met, row.sent) if goal is not None else "no SLO"
            cells.append(f"{_ms(nearest_rank(row.ttft_s, 50)):>6} {_ms(nearest_rank(row.ttft_s, 99)):>6} {met:>8} "
                         f"{f'{row.completed}/{row.sent}':>9}")
        lines.append(f"{profile.label:<14} {_ms(goal):>9} │ " + " │ ".join(cells))
    return "\n".join(lines)


# ---------------------------------------------------------------- the run


def _start(stack: LocalStack, status: StatusLine, what: str) -> None:
    t0 = time.monotonic()
    stack.start(lambda elapsed, line: status.show(f"  starting {what} … {elapsed:4.0f}s  {line}"))
    status.done(f"  {what} ready in {time.monotonic() - t0:.0f}s")


def run_demo(options: DemoOptions) -> int:
    t_start = time.monotonic()
    status = StatusLine(every_s=5.0)
    local, by_tier = demo_tenants(read_tenants(list(options.tenants)))
    keys = {p.label: local.keys[by_tier[p.tier].metadata.name][0] for p in SCENARIO}
    engine_args = ENGINE_ARGS + tuple(options.engine_args)
    workdir = new_workdir("slaq-demo-")
    print("slaq demo: the design report's scenario 4.5 — A (VIP, TTFT < 50 ms), B (standard, < 200 ms), C (free, no SLO)")
    print(f"  tenants {', '.join(f'{p.label} = {by_tier[p.tier].metadata.name}' for p in SCENARIO)}; logs in {workdir}")

    print("1/4 stock vLLM (its own scheduler, FCFS), clients straight to the engine")
    stock = LocalStack(StackOptions(model=options.model, scheduler="stock", engine_args=engine_args), workdir)
    with stock:
        _start(stock, status, "stock vLLM engine")
        model = stock.served_model_name
        status.done("  measuring unloaded TTFT and capacity …")
        calibration = asyncio.run(calibrate(stock.url, model, keys[SCENARIO[0].label], options))
        objectives = {p.label: calibration.objective_s(p) for p in SCENARIO}
        rate = LOAD * calibration.capacity_rps
        workload = scenario_workload(rate, options.run_seconds, options.seed)
        print(describe_calibration(calibration, objectives, rate, len(workload), options.run_seconds), flush=True)
        print("2/4 load on stock vLLM")
        stock_figures = asyncio.run(replay(stock.url, model, keys, workload, objectives, "stock vLLM", status, options.run_seconds))

    print("3/4 slaq: sidecar + SLAScheduler, the same tenants with the scaled objectives")
    scaled = LocalTenants([scaled_tenant(by_tier[p.tier], objectives[p.label]) for p in SCENARIO],
                          {by_tier[p.tier].metadata.name: local.keys[by_tier[p.tier].metadata.name] for p in SCENARIO})
    table = write_table(plan_local_table(scaled, local_pool(model)), workdir / "tenants.json")
    slaq_stack = LocalStack(StackOptions(port=0, model=options.model, scheduler="slaq", engine_args=engine_args, tenant_table=table), workdir)
    with slaq_stack:
        _start(slaq_stack, status, "slaq engine + sidecar")
        print("4/4 the same load through slaq")
        slaq_figures = asyncio.run(replay(slaq_stack.url, model, keys, workload, objectives, "slaq", status, options.run_seconds))

    print()
    print(results_table({"stock vLLM (FCFS)": stock_figures, "slaq": slaq_figures}, objectives))
    print(f"\n(TTFT in ms measured by the client; SLO met = first token within the objective, over all requests sent; "
          f"done = streams completed / sent. Demo took {time.monotonic() - t_start:.0f}s.)")
    return 0


def describe_calibration(calibration: Calibration, objectives: dict[str, float | None], rate: float, count: int, seconds: float) -> str:
    lines = ["  measured on this machine (stock engine, unloaded, one request at a time; median / p90):"]
    for profile in SCENARIO:
        lines.append(f"    {profile.label:<13} prompt {prompt_tokens(profile):>4} tokens (report: {profile.report_prompt_tokens}), "
                     f"{profile.output_tokens} out: TTFT {_ms(calibration.unloaded_ttft_s[profile.label])} / "
                     f"{_ms(calibration.unloaded_p90_s[profile.label])} ms")
    lines.append(f"    capacity for the mix: {calibration.capacity_rps:.2f} requests/s (a saturating burst)")
    lines.append(f"  scale = {_ms(calibration.unloaded_p90_s[SCENARIO[0].label])} ms (VIP prompt here, p90) / "
                 f"{calibration.reference_ttft_s * 1000:.1f} ms (1,000-token prompt on an H200, Llama-3-8B, step-time model) "
                 f"= {calibration.scale:.2f}")
    for profile in SCENARIO:
        if profile.report_ttft_ms is not None:
            lines.append(f"    {profile.label:<13} TTFT objective {profile.report_ttft_ms:.0f} ms × {calibration.scale:.2f} = {_ms(objectives[profile.label])} ms")
    lines.append(f"  load: {LOAD:.0%} of capacity = {rate:.2f} requests/s, Poisson, {count} requests over {seconds:.0f}s "
                 f"(mix {' / '.join(f'{p.share:.0%}' for p in SCENARIO)})")
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
