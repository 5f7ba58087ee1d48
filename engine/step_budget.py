"""Step token budget policies: how many tokens the next `schedule()` may hand out.

A policy sees read-only views of the running batch (a lazy iterable: a policy that does not
look costs nothing) and returns a cap (or None: vLLM's own
`max_num_scheduled_tokens`). The scheduler applies the cap through
`vllm_compat.step_token_budget` and reports each step's measured duration back, so a policy
can calibrate itself online.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol


@dataclass(frozen=True, slots=True)
class RunningView:
    tpot_s: float | None  # the request's TPOT objective, None when it has none
    decoding: bool


class StepBudgetPolicy(Protocol):
    def budget(self, running: Iterable[RunningView], limit: int, now: float) -> int | None:
        """Token cap for the next step (<= limit), or None for no cap."""
        ...

    def observe(self, tokens: int, seconds: float) -> None:
        """Measured duration of a step that scheduled `tokens` tokens."""
        ...


class StockStepBudget:
    """vLLM's behaviour: every step may use `max_num_scheduled_tokens`."""

    def budget(self, running: Iterable[RunningView], limit: int, now: float) -> int | None:
        return None

    def observe(self, tokens: int, seconds: float) -> None:
        return None
