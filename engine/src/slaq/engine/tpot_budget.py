"""The engine's part of the TPOT step budget: each decoding request's pace, read from vLLM's requests.

The budget rule and the step-time model are pure arithmetic on the batch view and live in the pod
policy (`slaq.policy.tpot_budget`, re-exported here for the engine's importers); `PaceClock` turns
the running requests into the view's `pace_slack_s`.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

from slaq.engine.sla import RequestInfo
from slaq.engine.vllm_compat import Request, decoded_tokens
from slaq.policy.tpot_budget import MAX_STEP_TPOTS, MIN_PREFILL_TOKENS, SAFETY, StepTimeModel, TpotStepBudget

__all__ = ["MAX_STEP_TPOTS", "MIN_PREFILL_TOKENS", "SAFETY", "PaceClock", "StepTimeModel", "TpotStepBudget"]


# The pace runs this much under each objective: a TPOT objective is a mean over the request's own
# tokens, and a step that overruns its plan near a request's end leaves no later step to catch up in
# (pacing at exactly the objective left critical requests' mean TPOT at 50.05-50.09 ms of 50 on the
# long-context workload).
PACE_SHARE = 0.995


class PaceClock:
    """Each decoding request's pace: its output token i is due at anchor_s + (i - anchor_index) x
    PACE_SHARE x TPOT.

    The anchor is (time, tokens delivered, preemptions) at the first step that sees the request
    decode, which with async scheduling is the step planned right after its first token arrived;
    a request resumed after a preemption is anchored again (the time it lost is not slack to claw
    back from the others). Anchors live on the request's `RequestInfo`, so nothing to clean up.
    """

    def slack(self, requests: Iterable[Request], info_of: Callable[[Request], RequestInfo], now: float,
              steps_in_flight: int) -> float | None:
        """Seconds from `now` to the earliest pace deadline among the tokens a step planned now
        delivers to `requests` (each request's token after those of the `steps_in_flight`)."""
        earliest = math.inf
        for request in requests:
            info = info_of(request)
            if info.tpot_s is None:
                continue
            tpot = PACE_SHARE * info.tpot_s
            delivered = decoded_tokens(request)
            if delivered < 1:
                continue
            anchor = info.pace_anchor
            if anchor is None or anchor[2] != info.preemptions:
                anchor = info.pace_anchor = (now, delivered, info.preemptions)
            # Index of the token the planned step delivers: delivered + steps_in_flight; the anchor's
            # last token has index anchor[1] - 1 and arrived at anchor[0].
            due = anchor[0] + (delivered + steps_in_flight - anchor[1] + 1) * tpot
            if due < earliest:
                earliest = due
        return None if earliest == math.inf else earliest - now
