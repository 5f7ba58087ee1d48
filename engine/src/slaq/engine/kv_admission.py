"""Admission that prices the running KV against the tightest running TPOT objective.

Every decode step reads the whole running batch's KV: with long contexts that alone can outlast a
TPOT objective, and once it does no token budget saves the step (`slaq.policy.tpot_budget` can only
shrink what a step adds to it). So a waiting request is admitted only if the decode steps after it
still fit: the calibrated step-time model (`StepTimeModel`, its KV term learned from the engine's own
steps) predicts a decode-only step of the batch with the request's tokens of KV added, and it must
stay within `safety` x the tightest running TPOT objective. The rule prices KV only: when the step
outlasts that line with no KV at all (an engine too slow for the objective, e.g. a loaded CPU), no
admission restores it, and refusing would only run the batch a few requests at a time. A request it refuses waits like one that
does not fit in the free KV cache (`queue.py`: passed over while in the first `queue.backfillSlack`
of its horizon, smaller requests going first; after that it goes in), so it is delayed, never
starved. A pod router can read the same figures (the predicted decode step, the objective) from the
engine's `slaq_engine_step_time_model` series.
"""

from __future__ import annotations

from dataclasses import dataclass

from slaq.policy.tpot_budget import SAFETY, StepTimeModel

REFUSED_TPOT_KV = "tpot_kv"


@dataclass(frozen=True)
class KvTpotAdmission:
    model: StepTimeModel
    safety: float = SAFETY

    def decode_step_s(self, running: int, kv_tokens: int) -> float:
        """A decode-only step of `running` requests holding `kv_tokens` of KV, as the model predicts it."""
        return self.model.predict(running, kv_tokens)

    def refuses(self, tightest_tpot_s: float | None, running: int, kv_tokens: int, request_tokens: int) -> bool:
        """Whether admitting a request that brings `request_tokens` of KV would make the decode steps that
        follow outlast `safety` x the tightest running objective (False with no objective running,
        before the model has learned what KV costs, or when the step outlasts the line without KV)."""
        if tightest_tpot_s is None or self.model.per_kv_token_s <= 0.0:
            return False
        line = self.safety * tightest_tpot_s
        if self.decode_step_s(running + 1, 0) > line:
            return False
        return self.decode_step_s(running + 1, kv_tokens + request_tokens) > line
