"""The oracle policy: a bound on what a scheduler could reach, not a deployable policy.

It knows what no real scheduler knows: every request's true output length (handed over by
the simulator) and the exact step-time model the simulator charges. With that it:

- orders the waiting queue by tier, then by TTFT deadline (EDF), then by true total work
  (SRPT: prompt + true output tokens); a tier without a TTFT objective is ordered by SRPT alone;
- shapes every step's token budget so that, by the cost model, every running request with a
  TPOT objective can still meet its *mean* TPOT: a request that has had its first token at f,
  has received d of its N true output tokens and must keep (last - f) / (N - 1) <= TPOT, can
  afford steps of (f + TPOT x (N - 1) - now) / (N - d) on average from now on; the step time
  target is the smallest such figure (before a request's first token: its TPOT objective),
  times a safety factor, and never longer than the request's TPOT objective (slack is not spent
  on longer steps: they would delay the first tokens of urgent arrivals). Requests that can no
  longer make it are left out. Running decodes are scheduled first; when no running
  request has a TPOT objective the step gets vLLM's full budget;
- lets a waiting request take the step from running prompt chunks of lower tiers: those are
  held out of the step (and their slots out of admission) while a higher tier waits, instead
  of the waiting request queueing behind their chunks.

It reads SLA facts from the request contract (`sampling_params.extra_args`), like any policy.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from slaq.api.common import TIER_RANK
from slaq.api.contract import RequestSLA
from slaq.bench.stepcost import ScheduledWork, StepCostModel, StepLoad
from slaq.engine import vllm_compat as vc

# vLLM's priority heap orders by (priority, arrival_time, request_id); the oracle's key is
# packed into `priority` before the request is queued (never changed while it is queued).
_WORK_STRIDE = 2**15  # more than max_model_len tokens
_DEADLINE_ORIGIN_MS = 1_600_000_000_000  # 2020-09-13: keeps deadline x work stride below the tier stride
_TIER_STRIDE = 10**20
TPOT_SAFETY = 0.9
MAX_TARGET_TPOTS = 1.0  # never plan a step longer than this many TPOT objectives
LOST_FRACTION = 0.5  # a request that can only afford steps shorter than this x TPOT is given up
MIN_PREFILL_TOKENS = 64


class OracleScheduler(vc.AsyncScheduler):
    """AsyncScheduler with oracle ordering and objective-shaped step budgets (see module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cost: StepCostModel | None = None
        self._true_output: Mapping[str, int] = {}
        self._sla: dict[str, RequestSLA] = {}
        self._first_token_at: dict[str, float] = {}

    def bind_knowledge(self, cost: StepCostModel, true_output: Mapping[str, int]) -> None:
        self._cost, self._true_output = cost, true_output

    def add_request(self, request: Any) -> None:
        sla = RequestSLA.from_extra_args(vc.extra_args(request))
        self._sla[vc.request_id(request)] = sla
        vc.set_priority(request, self._key(request, sla))
        super().add_request(request)

    def _key(self, request: Any, sla: RequestSLA) -> int:
        rank = TIER_RANK[sla.tier]
        work = vc.prompt_tokens(request) + self._true_output.get(vc.request_id(request), vc.max_tokens(request))
        if sla.ttft_ms is None:
            return rank * _TIER_STRIDE + work
        arrival = sla.arrival if sla.arrival is not None else vc.arrival_time(request)
        # Deadline in milliseconds, then work: within a millisecond the shorter request first.
        deadline_ms = int(arrival * 1000.0 + sla.ttft_ms)
        return rank * _TIER_STRIDE + (deadline_ms - _DEADLINE_ORIGIN_MS) * _WORK_STRIDE + min(work, _WORK_STRIDE - 1)

    def _step_target_s(self) -> float | None:
        """The longest step every running request with a TPOT objective can afford (see module doc)."""
        now = time.time()
        target = None
        for request in vc.running_requests(self):
            request_id = vc.request_id(request)
            tpot_ms = self._sla.get(request_id, RequestSLA()).tpot_ms
            if tpot_ms is None:
                continue
            tpot = tpot_ms / 1000.0
            delivered = vc.output_tokens(request)
            total = self._true_output.get(request_id)
            affordable = tpot
            if delivered >= 1 and total is not None and total > delivered:
                first = self._first_token_at.setdefault(request_id, now)
                affordable = (first + tpot * (total - 1) - now) / (total - delivered)
                if affordable < LOST_FRACTION * tpot:
                    continue
                affordable = min(affordable, MAX_TARGET_TPOTS * tpot)
            if target is None or affordable < target:
                target = affordable
        return target

    def _shaped_budget(self) -> int | None:
        if self._cost is None:
            return None
        target = self._step_target_s()
        if target is None:
            return None
        base, decodes, chunk_context = StepLoad(), 0, 0
        for request in vc.running_requests(self):
            if vc.is_prefilling(request):
                chunk_context = max(chunk_context, vc.computed_tokens(request))
            else:
                base.add(ScheduledWork(1, vc.computed_tokens(request), True))
                decodes += 1
        room = self._cost.prefill_tokens_within(target * TPOT_SAFETY, base, chunk_context)
        return min(vc.step_token_limit(self), decodes + max(room, MIN_PREFILL_TOKENS))

    def _lower_tier_prefills(self) -> list[Any]:
        """Running prompt chunks of a lower tier than the most urgent waiting request."""
        running = vc.running_requests(self)
        if not vc.waiting_queue(self) or not running or len(running) >= vc.active_request_limit(self):
            return []  # nothing waits, or no slot to admit it into: holding chunks back gains nothing
        head_rank = vc.priority(vc.first_waiting(self)) // _TIER_STRIDE
        return [r for r in running if vc.is_prefill_chunk(r) and vc.priority(r) // _TIER_STRIDE > head_rank]

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        # Decodes first (by tier), then running prefill chunks by key: the running loop hands
        # out the budget in list order, so this is what keeps decodes from starving.
        vc.running_requests(self).sort(key=lambda r: (vc.is_prefill_chunk(r), vc.priority(r), vc.arrival_time(r)))
        held, budget = self._lower_tier_prefills(), self._shaped_budget()
        # Held chunks are out of `running` for this one call, so the running loop skips them; their
        # slots stay taken (admission limit lowered by as many) and they come back after.
        with vc.hold_back(self, held), vc.step_token_budget(self, budget):
            return super().schedule(*args, **kwargs)
