"""The step token budget: how many tokens the next engine step (`schedule()`) may hand out.

A policy sees a read-only summary of the running batch (`BatchView`, O(1) to build: the engine's
block manager keeps it as requests come and go) and returns a cap (or None: vLLM's own
`max_num_scheduled_tokens`). The engine's scheduler applies the cap and reports each step's
measured duration back, so a policy can calibrate itself online.

Registered by name in `STEP_BUDGETS`, each by the module that defines it: `stock` (here) leaves
vLLM's budget, `tpot` (`slaq.policy.tpot_budget`) shapes each step to the tightest running TPOT
objective. Both are pure arithmetic on the batch view; what reads vLLM's requests to build that
view (the pace of each decoding request, `slaq.engine.tpot_budget.PaceClock`) is the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from slaq.policy.registry import Registry


@dataclass(frozen=True, slots=True)
class BatchView:
    tightest_tpot_s: float | None  # the smallest TPOT objective among running requests, None if none has one
    running: int  # requests in the running batch
    kv_tokens: int = 0  # tokens of KV cache the running batch holds (its attention reads them every step)
    # Seconds from now to the earliest pace deadline (see slaq.engine.tpot_budget.PaceClock) of a token the
    # step planned now would deliver; None when no decoding request has a TPOT objective (or it is not tracked).
    pace_slack_s: float | None = None
    steps_in_flight: int = 0  # steps scheduled before this one and not finished: they run first
    urgent_tokens: int = 0  # prompt tokens of the most urgent waiting request (0: none waits)
    # The longest context (tokens of KV already computed) at which a prompt chunk of the step starts: its
    # tokens' attention reads that much KV each (0: none known, every token priced alike).
    prefill_context_tokens: int = 0
    # The tightest TTFT objective among the requests the engine served lately (None: none had one) and
    # the mean prompt of that class, in tokens (`slaq.engine.ttft_class.TightestTtft`): a step for other
    # work must leave such an arrival room for its own prompt before its objective.
    tight_ttft_s: float | None = None
    tight_prompt_tokens: int = 0
    urgent_tight: bool = False  # the most urgent waiting request (`urgent_tokens`) is of that class
    # Seconds beyond `pace_slack_s` a step carrying that request's prompt may take: the least credit a
    # decoding request has left (slaq.engine.tpot_budget.PaceClock.credit_s).
    pace_credit_s: float = 0.0
    urgent_slack_s: float | None = None  # seconds from now to that request's TTFT deadline (None: not of the class)


@runtime_checkable
class StepBudget(Protocol):
    """A step token budget policy."""

    def budget(self, batch: BatchView, limit: int, now: float) -> int | None:
        """Token cap for the next step (<= limit), or None for no cap."""
        ...

    def observe(self, tokens: int, seconds: float, kv_tokens: int = 0, pairs: int = 0) -> None:
        """Measured duration of a step that scheduled `tokens` tokens while the batch held `kv_tokens` of KV,
        its prompt chunks attending over `pairs` (query, key) pairs."""
        ...


STEP_BUDGETS: Registry[type[StepBudget]] = Registry("step budget", StepBudget)


class StockStepBudget:
    """vLLM's behaviour: every step may use `max_num_scheduled_tokens`."""

    def budget(self, batch: BatchView, limit: int, now: float) -> int | None:
        return None

    def observe(self, tokens: int, seconds: float, kv_tokens: int = 0, pairs: int = 0) -> None:
        return None


STEP_BUDGETS.register("stock", StockStepBudget)
