"""The engine's part of the TPOT step budget: each decoding request's pace, read from vLLM's requests.

The budget rule and the step-time model are pure arithmetic on the batch view and live in the pod
policy (`slaq.policy.tpot_budget`, re-exported here for the engine's importers); `PaceClock` turns
the running requests into the view's `pace_slack_s`.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, NamedTuple

from slaq.engine.sla import RequestInfo
from slaq.engine.vllm_compat import Request, decoded_tokens
from slaq.policy.tpot_budget import MAX_STEP_TPOTS, MIN_PREFILL_TOKENS, SAFETY, StepTimeModel, TpotStepBudget

__all__ = ["CREDIT_SHARE", "CREDIT_TPOTS", "MAX_STEP_TPOTS", "MIN_PREFILL_TOKENS", "SAFETY", "PaceClock", "PaceSlack",
           "StepTimeModel", "TpotStepBudget"]


# The pace runs this much under each objective: a TPOT objective is a mean over the request's own
# tokens, and a step that overruns its plan near a request's end leaves no later step to catch up in
# (pacing at exactly the objective left critical requests' mean TPOT at 50.05-50.09 ms of 50 on the
# long-context workload).
PACE_SHARE = 0.995

# A step that carries a prompt of the tightest TTFT class may put a decoding request behind its pace
# by its credit (decision 0028): CREDIT_SHARE x T for each output token it is still planned to
# deliver after that step, at most CREDIT_TPOTS x T. Once behind, its steps fall to the floor and it
# catches up (1 - SAFETY) x T a token, 7.5 times faster than its credit grows with its remaining
# tokens, so it is back on pace long before the end it was planned for. The credit shrinks as that
# end nears; a request that stops well before it (an EOS under a generous max_tokens) can end up to
# CREDIT_TPOTS x T / (its tokens) over its objective.
CREDIT_SHARE = 0.02
CREDIT_TPOTS = 8.0


class PaceSlack(NamedTuple):
    """What the decoding requests' paces leave a step planned now."""

    slack_s: float  # to the earliest pace deadline among the tokens it delivers
    credit_s: float  # beyond that, what a prompt of the tightest TTFT class may take: the least credit any request has left


class PaceClock:
    """Each decoding request's pace: its output token i is due at anchor_s + (i - anchor_index) x
    PACE_SHARE x TPOT.

    The anchor is (time, tokens delivered, preemptions) at the first step that sees the request
    decode, which with async scheduling is the step planned right after its first token arrived;
    a request resumed after a preemption is anchored again (the time it lost is not slack to claw
    back from the others). Anchors live on the request's `RequestInfo`, so nothing to clean up.
    """

    def slack(self, requests: Iterable[Request], info_of: Callable[[Request], RequestInfo], now: float,
              steps_in_flight: int) -> PaceSlack | None:
        """Seconds from `now` to the earliest pace deadline among the tokens a step planned now
        delivers to `requests` (each request's token after those of the `steps_in_flight`), and the
        credit beyond it (`PaceSlack`); None when none of them has a TPOT objective and decodes."""
        earliest = credited = math.inf
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
            earliest = min(earliest, due)
            credited = min(credited, due + self.credit_s(info, delivered + steps_in_flight + 1, tpot))
        return None if earliest == math.inf else PaceSlack(earliest - now, credited - earliest)

    @staticmethod
    def credit_s(info: RequestInfo, delivered: int, tpot_s: float) -> float:
        """How far a request that will have `delivered` tokens may fall behind its pace (the rule at CREDIT_SHARE)."""
        planned = min(info.predicted_output, info.planned_output or info.predicted_output)
        return min(CREDIT_TPOTS * tpot_s, CREDIT_SHARE * tpot_s * max(0, planned - delivered))
