"""Objective-driven step token budget: keep the tightest running TPOT promise, otherwise run full.

With async scheduling every decoding request gets one token per engine step, so a request's
time per output token is the duration of the steps it runs in. A step that carries a long
prefill chunk (vLLM's default budget, e.g. 8,192 tokens) takes far longer than a decode-only
step, and every decoding request in it waits that long for its token. The rule:

    T      = min TPOT objective over running requests that have one
    budget = (safety * T - a) / b   tokens, if some running request has a TPOT objective
           = vLLM's max_num_scheduled_tokens otherwise (throughput does not collapse)
    budget is clamped to [running + 1, max_num_scheduled_tokens]: every decode keeps its token
    (the scheduler also puts decodes ahead of prefill chunks whenever a cap applies)

where step time ≈ a + b * tokens is calibrated online from measured step durations
(`StepTimeModel`, exponentially weighted least squares), starting from a prior. A step's
duration is measured as the time from the later of (its scheduling, the previous step's
completion) to its own completion, which is what a pipelined engine spends on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from slaq.engine.step_budget import BatchView

PRIOR_COVARIANCE = ((1.0, 0.0), (0.0, 1e-6))  # (s², s²/token²): how far the prior may be off
SAFETY = 0.85  # fraction of the tightest objective a step may take (measurement noise, sampling, detokenisation)


@dataclass
class StepTimeModel:
    """step seconds ≈ fixed + per_token * tokens, refined from observations.

    Recursive least squares on (1, tokens) with forgetting factor `forget`, so the model follows
    the hardware it runs on (or a simulator's cost model) within a few dozen steps.
    """

    fixed_s: float = 0.010
    per_token_s: float = 30e-6
    forget: float = 0.98
    _p: list[list[float]] = field(default_factory=lambda: [list(row) for row in PRIOR_COVARIANCE])
    observations: int = 0

    def predict(self, tokens: int) -> float:
        return self.fixed_s + self.per_token_s * tokens

    def tokens_within(self, seconds: float) -> float:
        per_token = max(self.per_token_s, 1e-9)
        return (seconds - self.fixed_s) / per_token

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0.0:
            return
        x0, x1 = 1.0, float(tokens)
        p = self._p
        px0 = p[0][0] * x0 + p[0][1] * x1
        px1 = p[1][0] * x0 + p[1][1] * x1
        denominator = self.forget + x0 * px0 + x1 * px1
        k0, k1 = px0 / denominator, px1 / denominator
        error = seconds - self.predict(tokens)
        self.fixed_s = max(0.0, self.fixed_s + k0 * error)
        self.per_token_s = max(1e-9, self.per_token_s + k1 * error)
        self._p = [
            [(p[0][0] - k0 * px0) / self.forget, (p[0][1] - k0 * px1) / self.forget],
            [(p[1][0] - k1 * px0) / self.forget, (p[1][1] - k1 * px1) / self.forget],
        ]
        self.observations += 1


@dataclass
class TpotStepBudget:
    """The `StepBudgetPolicy` of the rule above."""

    model: StepTimeModel = field(default_factory=StepTimeModel)
    safety: float = SAFETY
    last_budget: int | None = None

    def budget(self, batch: BatchView, limit: int, now: float) -> int | None:
        if batch.tightest_tpot_s is None:
            self.last_budget = None
            return None
        tokens = int(self.model.tokens_within(self.safety * batch.tightest_tpot_s))
        self.last_budget = max(batch.running + 1, min(limit, tokens))
        return self.last_budget

    def observe(self, tokens: int, seconds: float) -> None:
        self.model.observe(tokens, seconds)
