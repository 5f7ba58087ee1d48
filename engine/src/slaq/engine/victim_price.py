"""What a preemption costs the victim, and whether the urgent request is worth it.

A preempted request gets its KV back one of two ways: recomputed (its tokens go through the model
again, a prompt chunk at a time, each chunk attending over the ones before: tokens x the step-time
model's per-token cost + its per-pair cost x tokens^2 / 2), or swapped back in from the host cache
(sealed out and opened in again at the KV connector's measured throughput, `SwapOrRecompute`), which
is possible only while the host cache has room for it. Its price is the cheaper of the two that is
possible now: the capacity check is part of the price.

The urgent request gains at most its TTFT objective (the time it has to be served in), so a victim
whose restore costs more than `max_restore_share` of that objective is not preempted for it: a
100k-token context costs seconds of prefill that every running request waits behind, far more than a
2 s objective buys. `UrgentPreemption` asks `worth` about each victim in the pod policy's order
(`slaq.policy.victims`: lowest tier, then least KV, then latest arrival), so victims with little KV
go first and a long context is passed over. The share is the whole objective (it was half): on a
32B model a batch decode of ~4,500 tokens restores in ~0.35 s, more than half a critical request's
0.5 s, so at a full pod no victim was worth it and a critical arrival waited for a request to end
(decision 0027). The same object runs in the engine and in the benchmark's simulator, which drives
the engine's scheduler and connector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

MAX_RESTORE_SHARE = 1.0


class RestoreModel(Protocol):
    """What the price reads of the scheduler's step-time model (`slaq.policy.tpot_budget.StepTimeModel`)."""

    per_token_s: float
    per_pair_s: float


class SwapPricing(Protocol):
    """What the price reads of the KV connector's swap rule (`kv_security.swap.SwapOrRecompute`)."""

    def transfer_seconds(self, tokens: int) -> float: ...


def recompute_seconds(model: RestoreModel, tokens: int) -> float:
    """Computing `tokens` positions again: their GEMMs and their causal attention over one another."""
    return tokens * model.per_token_s + model.per_pair_s * tokens * tokens / 2.0


@dataclass(frozen=True)
class VictimPrice:
    model: RestoreModel
    swap: SwapPricing | None = None  # None: no host cache, every victim is recomputed
    host_room_tokens: Callable[[], int] = lambda: 0  # tokens of KV the host cache can take now
    max_restore_share: float = MAX_RESTORE_SHARE

    def restore_seconds(self, tokens: int) -> float:
        """The cheaper way back for `tokens` of KV that is possible now."""
        seconds = recompute_seconds(self.model, tokens)
        if self.swap is not None and 0 < tokens <= self.host_room_tokens():
            seconds = min(seconds, 2.0 * self.swap.transfer_seconds(tokens))
        return seconds

    def worth(self, victim_tokens: int, gain_s: float | None) -> bool:
        """Whether preempting a victim holding `victim_tokens` of KV is worth a gain of `gain_s` (the urgent
        request's TTFT objective; None: no objective, nothing to gain)."""
        if gain_s is None:
            return False
        return self.restore_seconds(victim_tokens) <= self.max_restore_share * gain_s
