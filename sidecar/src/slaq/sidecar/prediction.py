"""Online output-length prediction, per tenant and prompt-length bucket.

Output length is unknown at admission but drives both the length term of the score and the
engine scheduler's plan (`slaq_predicted_output`). Each (tenant, prompt bucket) keeps an
exponentially weighted mean of observed output tokens; a cell with too few observations falls
back to the tenant's mean, then to the pod's, then to a fixed prior. The prediction never exceeds
the request's own `max_tokens`, which is a hard bound.
"""

from __future__ import annotations

from dataclasses import dataclass


def prompt_bucket(prompt_tokens: int) -> int:
    """Power-of-two buckets: 0 for <64 tokens, then 64-127, 128-255, … (capped at 2^20)."""
    if prompt_tokens < 64:
        return 0
    return min(prompt_tokens.bit_length() - 6, 15)


@dataclass(slots=True)
class RunningMean:
    """EWMA whose first observations average plainly, so early values are not dominated by the prior."""

    mean: float = 0.0
    count: int = 0

    def observe(self, value: float, alpha: float) -> None:
        self.count += 1
        weight = max(alpha, 1.0 / self.count)
        self.mean += weight * (value - self.mean)


class OutputLengthPredictor:
    def __init__(self, *, prior_tokens: int = 256, alpha: float = 0.1, min_observations: int = 3) -> None:
        self.prior_tokens = prior_tokens
        self.alpha = alpha
        self.min_observations = min_observations
        self._cells: dict[tuple[str, int], RunningMean] = {}
        self._tenants: dict[str, RunningMean] = {}
        self._pod = RunningMean()

    def predict(self, tenant: str, prompt_tokens: int, max_tokens: int | None) -> int:
        estimate = float(self.prior_tokens)
        for stats in (self._cells.get((tenant, prompt_bucket(prompt_tokens))), self._tenants.get(tenant), self._pod):
            if stats is not None and stats.count >= self.min_observations:
                estimate = stats.mean
                break
        predicted = max(1, round(estimate))
        return predicted if max_tokens is None else min(predicted, max_tokens)

    def observe(self, tenant: str, prompt_tokens: int, output_tokens: int) -> None:
        if output_tokens < 0:
            return
        key = (tenant, prompt_bucket(prompt_tokens))
        for stats in (self._cells.setdefault(key, RunningMean()), self._tenants.setdefault(tenant, RunningMean()), self._pod):
            stats.observe(float(output_tokens), self.alpha)
