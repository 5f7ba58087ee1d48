"""Per-step cost of `schedule()`: slaq's SLAScheduler vs vLLM 0.32's stock AsyncScheduler.

Both schedulers get the same requests (mixed tiers and tenants, SLA facts in extra_args) and
the same engine shape (max_num_seqs 256, max_num_batched_tokens 8192), at 100, 1,000 and 10,000
waiting requests. Only `schedule()` is timed; the synthetic model output is not.

Scenarios:
- full: the batch is full of critical-tier decodes (nothing to preempt), so every step the
  slaq scheduler does its complete bookkeeping (queue refresh, urgent-arrival check over the
  running batch) and nothing gets admitted: the steady state of a backlog.
- churn: running requests finish every few steps and are replaced from the waiting queue, which
  is topped up to its size after each step: admission and prefix-cache lookups every step. Both
  admit in waves, when a wave of requests finishes, and most steps admit nothing; every step has
  critical requests waiting behind a full batch, so slaq asks every step whether room frees in
  time for them (preemption.py) and preempts none.
- same: churn where every request is one tenant's, batch tier, with no objective: nothing is urgent
  and nothing is preempted, so both schedulers admit as many requests in the same steps (the
  tokens differ by a few percent of prefix-cache hits at 1,000 and more waiting) and the ratio is
  slaq's own bookkeeping.

Both schedulers are built side by side and stepped in turn, one schedule() each (which one goes
first alternates by repeat), so a noisy machine's pauses land on both alike: back-to-back runs of
one scheduler and then the other gave ratios from 1.17 to 2.39 for the same code on this 2-core
machine. Each figure is the quietest of --repeats such paired measurements (other processes only
add time).
"tok" is the mean tokens scheduled per step; "adm/pre/steps" the mean admissions (new and resumed
requests) and preemptions per step and the share of steps that admit anything; "p50/token" the
ratio of p50 step time per scheduled token.

Usage: python tools/src/slaq/bench/sched_overhead.py [--steps N] [--sizes 100,1000,10000] [--repeats R] [--out FILE]

--out writes the figures as JSON (schema slaq.bench.sched_overhead/v1, with the run's envelope:
command line, date, commit) for docs/results.md.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

from slaq.api.common import Tier
from slaq.api.pool import SchedulerSpec
from slaq.engine import vllm_compat as vc
from slaq.engine.vllm_compat import offline

MAX_NUM_SEQS = 256
MAX_BATCHED_TOKENS = 8192
TIERS = (Tier.CRITICAL, Tier.STANDARD, Tier.STANDARD, Tier.BATCH, Tier.BATCH, Tier.BATCH)
# Steps before the measured ones, for both schedulers: past the steps slaq times before it trusts
# its mean step time (`step.stepsBeforeStepTime`), so both are measured in their steady state. With
# 20, at 100 and 1,000 waiting slaq preempted a few batch decodes for critical requests in its first
# measured steps (with no step time it cannot tell that room frees in time: preemption.py), the
# resumed requests then finished out of step with stock's waves of admissions, and most of its
# steps admitted where most of stock's did not: a different schedule, not a dearer one.
WARM_UP_STEPS = SchedulerSpec().step.steps_before_step_time + 8


def _request(index: int, tier: Tier, max_tokens: int, tenants: int = 7):
    from slaq.engine.standalone import make_request

    return make_request(tier, tenant=f"tenant{index % tenants}", prompt_tokens=48 + index % 64, max_tokens=max_tokens, prompt_seed=index)


class Run(NamedTuple):
    timings: list[float]  # schedule() seconds, per step
    tokens: float  # mean tokens scheduled per step
    admissions: float  # mean new and resumed requests per step
    preemptions: float  # mean preemptions per step
    admitting: float  # share of steps that admit anything


class Stepper:
    """One scheduler fed one scenario, stepped (and timed) one schedule() at a time."""

    def __init__(self, scheduler_cls: type, waiting: int, scenario: str, max_num_seqs: int = MAX_NUM_SEQS) -> None:
        from slaq.engine.standalone import Driver, build_scheduler

        self.scheduler = build_scheduler(
            scheduler_cls, max_num_seqs=max_num_seqs, max_num_batched_tokens=MAX_BATCHED_TOKENS,
            num_blocks=200_000, max_model_len=2048,
        )
        self.driver = Driver(self.scheduler)
        self.waiting, self.scenario = waiting, scenario
        self.uniform = Tier.BATCH if scenario == "same" else None
        self.counter = 0
        self.timings: list[float] = []
        self.tokens = self.admissions = self.preemptions = self.admitting = 0
        if scenario == "full":
            self.arrive(max_num_seqs, Tier.CRITICAL, max_tokens=1000)
            while len(vc.running_requests(self.scheduler)) < max_num_seqs or vc.any_prefill_chunk(vc.running_requests(self.scheduler)):
                self.driver.step()
            self.arrive(waiting)
        else:
            self.arrive(waiting + max_num_seqs)
            for _ in range(WARM_UP_STEPS):
                self.driver.step()

    def arrive(self, count: int, tier: Tier | None = None, max_tokens: int = 12) -> None:
        for _ in range(count):
            index = self.counter
            self.driver.add(_request(index, tier or self.uniform or TIERS[index % len(TIERS)], max_tokens, tenants=1 if self.uniform else 7))
            self.counter += 1

    def step(self) -> None:
        started = time.perf_counter()
        output = self.scheduler.schedule()
        self.timings.append(time.perf_counter() - started)
        self.tokens += vc.total_scheduled_tokens(output)
        admitted = offline.admissions(output)
        self.admissions += admitted
        self.admitting += admitted > 0
        self.preemptions += len(vc.preempted_ids(output))
        self.driver.answer(output)
        if self.scenario != "full":
            self.arrive(max(0, self.waiting - offline.waiting_count(self.scheduler)))

    def run(self) -> Run:
        steps = len(self.timings)
        return Run(self.timings, self.tokens / steps, self.admissions / steps, self.preemptions / steps, self.admitting / steps)


def _measure_pair(scheduler_classes: tuple[type, type], waiting: int, steps: int, scenario: str,
                  max_num_seqs: int = MAX_NUM_SEQS) -> tuple[Run, Run]:
    """Both schedulers stepped in turn, one schedule() each, so that whatever else the machine does
    during the measurement lands on both alike (paired steps, not back-to-back runs)."""
    steppers = [Stepper(cls, waiting, scenario, max_num_seqs) for cls in scheduler_classes]
    gc.collect()
    for _ in range(steps):
        for stepper in steppers:
            stepper.step()
    return steppers[0].run(), steppers[1].run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--scenarios", default="full,same,churn")
    parser.add_argument("--max-num-seqs", type=int, default=MAX_NUM_SEQS)
    parser.add_argument("--repeats", type=int, default=2, help="paired measurements; the quietest counts")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as a JSON report here")
    args = parser.parse_args(argv)

    from slaq.bench.envelope import envelope
    from slaq.bench.report import write_report
    from slaq.engine.scheduler import SLAScheduler

    run = envelope(None if argv is None else [__file__, *argv])
    rows: list[dict] = []
    print(f"schedule() per step, max_num_seqs={args.max_num_seqs}, max_num_batched_tokens={MAX_BATCHED_TOKENS}, "
          f"{args.steps} steps, quietest of {args.repeats}")
    print(f"{'scenario':<8} {'waiting':>8} {'stock mean µs':>14} {'slaq mean µs':>13} {'stock p50':>10} {'slaq p50':>9} {'ratio mean':>11} "
          f"{'ratio p50':>10} {'stock tok':>10} {'slaq tok':>9} {'adm/pre/steps stock':>20} {'adm/pre/steps slaq':>19} {'p50/token':>10}")
    for scenario in args.scenarios.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            stock_runs: list[Run] = []
            slaq_runs: list[Run] = []
            for repeat in range(args.repeats):  # paired steps; which one steps first alternates by repeat
                classes = (vc.AsyncScheduler, SLAScheduler) if repeat % 2 == 0 else (SLAScheduler, vc.AsyncScheduler)
                runs = dict(zip(classes, _measure_pair(classes, size, args.steps, scenario, args.max_num_seqs)))
                stock_runs.append(runs[vc.AsyncScheduler])
                slaq_runs.append(runs[SLAScheduler])
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
            rows.append({"scenario": scenario, "waiting": size, "stock_mean_us": s_mean, "slaq_mean_us": q_mean,
                         "stock_p50_us": s_p50, "slaq_p50_us": q_p50, "ratio_mean": q_mean / s_mean, "ratio_p50": q_p50 / s_p50,
                         "stock_tokens_per_step": s_tok, "slaq_tokens_per_step": q_tok, "p50_per_token_ratio": per_token,
                         "stock_admitting_share": statistics.fmean(r.admitting for r in stock_runs),
                         "slaq_admitting_share": statistics.fmean(r.admitting for r in slaq_runs)})
    if args.out:
        write_report({"schema": "slaq.bench.sched_overhead/v1", "steps": args.steps, "repeats": args.repeats,
                      "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": MAX_BATCHED_TOKENS, "rows": rows},
                     args.out, run)
        print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
