"""How many output tokens the scheduler plans a request for, when its client set no `max_tokens`.

vLLM gives a request without `max_tokens` the rest of the context as its bound, so every such
request looks as long as the context: room never frees in time (`blocks.steps_until_room`), EASY
backfill holds back what would be done long before, and urgent arrivals preempt where waiting would
have done. The sidecar predicts each request's output (`slaq_predicted_output`, the tenant's and
prompt bucket's running mean); the scheduler plans on that prediction raised to its error bound,
the `quantile` (0.9) of actual / predicted output that the engine learns from its own finished
requests (`OutputBound`, stochastic quantile tracking on the log ratio, starting at 2x), never above
the request's own bound. A request whose client set `max_tokens` (prompt + max_tokens short of the
context) is planned on it, as before: it is the client's hard bound. Without a prediction (no
sidecar), on `max_tokens`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def unbounded_by_client(prompt_tokens: int, max_tokens: int, max_model_len: int) -> bool:
    """Whether the request runs to the end of the context: what vLLM sets when the client set no `max_tokens`."""
    return prompt_tokens + max_tokens >= max_model_len


@dataclass
class OutputBound:
    quantile: float = 0.9
    rate: float = 0.05  # the log-ratio estimate's step per observation
    log_ratio: float = math.log(2.0)  # prior: twice the prediction
    observations: int = 0

    def bound(self, predicted: int) -> int:
        """The planned output for a prediction of `predicted` tokens: the learned quantile of where it ends."""
        return max(1, math.ceil(predicted * math.exp(self.log_ratio)))

    def observe(self, predicted: int, actual: int) -> None:
        """A finished request predicted at `predicted` tokens produced `actual`."""
        if predicted < 1 or actual < 1:
            return
        above = math.log(actual / predicted) > self.log_ratio
        self.log_ratio += self.rate * (self.quantile if above else self.quantile - 1.0)
        self.observations += 1

    def planned_output(self, predicted: int | None, prompt_tokens: int, max_tokens: int, max_model_len: int) -> int:
        """Output tokens to plan a request for: its prediction's bound when its client set no `max_tokens`."""
        if predicted is None or not unbounded_by_client(prompt_tokens, max_tokens, max_model_len):
            return max_tokens
        return min(max_tokens, self.bound(predicted))
