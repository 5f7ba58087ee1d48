"""Per-step cost of `schedule()`: slaq's SLAScheduler vs vLLM 0.32's stock AsyncScheduler.

Both schedulers get the same requests (mixed tiers and tenants, SLA facts in extra_args) and
the same engine shape (max_num_seqs 256, max_num_batched_tokens 8192), at 100, 1,000 and 10,000
waiting requests. Only `schedule()` is timed; the synthetic model output is not.

Scenarios:
- full: the batch is full of critical-tier decodes (nothing to preempt), so every step the
  slaq scheduler does its complete bookkeeping (queue refresh, urgent-arrival check over the
  running batch) and nothing gets admitted: the steady state of a backlog.
- churn: running requests finish every few steps and are replaced from the waiting queue, which
  is topped up to its size after each step: admission and prefix-cache lookups every step. The
  two schedulers decide differently here, and that is the point of slaq: stock vLLM admits in
  waves, when a wave of requests finishes, and most of its steps admit nothing; slaq preempts
  batch-tier decodes so that critical requests waiting on their TTFT objective get in within a
  step, so most of its steps admit and preempt a few requests. Its steps carry more work.
- same: churn where every request is one tenant's, batch tier, with no objective: nothing is urgent
  and nothing is preempted, so both schedulers admit as many requests in the same steps (the
  tokens differ by a few percent of prefix-cache hits at 1,000 and more waiting) and the ratio is
  slaq's own bookkeeping.

Each figure is the quietest of --repeats alternating measurements (other processes only add time).
"tok" is the mean tokens scheduled per step; "adm/pre/steps" the mean admissions (new and resumed
requests) and preemptions per step and the share of steps that admit anything; "p50/token" the
ratio of p50 step time per scheduled token.

Usage: python bench/sched_overhead.py [--steps N] [--sizes 100,1000,10000] [--repeats R]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import NamedTuple

from slaq.api.common import Tier

MAX_NUM_SEQS = 256
MAX_BATCHED_TOKENS = 8192
TIERS = (Tier.CRITICAL, Tier.STANDARD, Tier.STANDARD, Tier.BATCH, Tier.BATCH, Tier.BATCH)


def _request(index: int, tier: Tier, max_tokens: int, tenants: int = 7):
    from slaq.engine.standalone import make_request

    return make_request(tier, tenant=f"tenant{index % tenants}", prompt_tokens=48 + index % 64, max_tokens=max_tokens, prompt_seed=index)


class Run(NamedTuple):
    timings: list[float]  # schedule() seconds, per step
    tokens: float  # mean tokens scheduled per step
    admissions: float  # mean new and resumed requests per step
    preemptions: float  # mean preemptions per step
    admitting: float  # share of steps that admit anything


def _measure(scheduler_cls: type, waiting: int, steps: int, scenario: str, max_num_seqs: int = MAX_NUM_SEQS) -> Run:
    """Per-step schedule() seconds, and the work those steps did."""
    from slaq.engine.standalone import Driver, build_scheduler

    scheduler = build_scheduler(
        scheduler_cls, max_num_seqs=max_num_seqs, max_num_batched_tokens=MAX_BATCHED_TOKENS,
        num_blocks=200_000, max_model_len=2048,
    )
    driver = Driver(scheduler)
    counter = 0

    uniform = Tier.BATCH if scenario == "same" else None

    def arrive(count: int, tier: Tier | None = None, max_tokens: int = 12) -> None:
        nonlocal counter
        for _ in range(count):
            driver.add(_request(counter, tier or uniform or TIERS[counter % len(TIERS)], max_tokens, tenants=1 if uniform else 7))
            counter += 1

    if scenario == "full":
        arrive(max_num_seqs, Tier.CRITICAL, max_tokens=1000)
        while len(scheduler.running) < max_num_seqs or any(r.is_prefill_chunk for r in scheduler.running):
            driver.step()
        arrive(waiting)
    else:
        arrive(waiting + max_num_seqs)
        for _ in range(20):
            driver.step()
    timings: list[float] = []
    tokens = admissions = preemptions = admitting = 0
    gc.collect()
    for _ in range(steps):
        started = time.perf_counter()
        output = scheduler.schedule()
        timings.append(time.perf_counter() - started)
        tokens += output.total_num_scheduled_tokens
        admitted = len(output.scheduled_new_reqs) + len(output.scheduled_cached_reqs.resumed_req_ids)
        admissions += admitted
        admitting += admitted > 0
        preemptions += len(output.preempted_req_ids or ())
        driver.answer(output)
        if scenario != "full":
            arrive(max(0, waiting - len(scheduler.waiting)))
    return Run(timings, tokens / steps, admissions / steps, preemptions / steps, admitting / steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--scenarios", default="full,same,churn")
    parser.add_argument("--max-num-seqs", type=int, default=MAX_NUM_SEQS)
    parser.add_argument("--repeats", type=int, default=2, help="measurements per scheduler, alternating; the quietest counts")
    args = parser.parse_args(argv)

    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from slaq.engine.scheduler import SLAScheduler

    print(f"schedule() per step, max_num_seqs={args.max_num_seqs}, max_num_batched_tokens={MAX_BATCHED_TOKENS}, "
          f"{args.steps} steps, quietest of {args.repeats}")
    print(f"{'scenario':<8} {'waiting':>8} {'stock mean µs':>14} {'slaq mean µs':>13} {'stock p50':>10} {'slaq p50':>9} {'ratio mean':>11} "
          f"{'ratio p50':>10} {'stock tok':>10} {'slaq tok':>9} {'adm/pre/steps stock':>20} {'adm/pre/steps slaq':>19} {'p50/token':>10}")
    for scenario in args.scenarios.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            stock_runs: list[Run] = []
            slaq_runs: list[Run] = []
            for _ in range(args.repeats):  # alternate, so load from other processes hits both alike
                stock_runs.append(_measure(AsyncScheduler, size, args.steps, scenario, args.max_num_seqs))
                slaq_runs.append(_measure(SLAScheduler, size, args.steps, scenario, args.max_num_seqs))
            # the quietest repeat of each: noise only ever adds time
            s_mean, q_mean = (min(statistics.fmean(run.timings) for run in runs) * 1e6 for runs in (stock_runs, slaq_runs))
            s_p50, q_p50 = (min(statistics.median(run.timings) for run in runs) * 1e6 for runs in (stock_runs, slaq_runs))
            s_tok, q_tok = (statistics.fmean(run.tokens for run in runs) for runs in (stock_runs, slaq_runs))
            s_work, q_work = (f"{statistics.fmean(r.admissions for r in runs):.1f}/{statistics.fmean(r.preemptions for r in runs):.1f}"
                              f"/{statistics.fmean(r.admitting for r in runs):.0%}" for runs in (stock_runs, slaq_runs))
            per_token = (q_p50 / max(q_tok, 1.0)) / (s_p50 / max(s_tok, 1.0))
            print(f"{scenario:<8} {size:>8} {s_mean:>14.0f} {q_mean:>13.0f} {s_p50:>10.0f} {q_p50:>9.0f} {q_mean / s_mean:>11.2f} "
                  f"{q_p50 / s_p50:>10.2f} {s_tok:>10.0f} {q_tok:>9.0f} {s_work:>20} {q_work:>19} {per_token:>10.2f}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
