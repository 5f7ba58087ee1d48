"""The oracle policy: a bound on what a scheduler could reach, not a deployable policy.

It knows what no real scheduler knows: every request's true output length (handed over by
the simulator) and the exact step-time model the simulator charges. With that it:

- orders the waiting queue by tier, then by TTFT deadline (EDF) in tiers with a TPOT
  objective, and by true remaining work (SRPT: prompt + true output tokens) in the others;
- shapes every step's token budget so that the step, by the cost model, finishes within the
  tightest TPOT objective among the running requests (times a safety factor), with every
  running decode scheduled first; when no running request has a TPOT objective the step gets
  vLLM's full budget.

It reads SLA facts from the request contract (`sampling_params.extra_args`), like any policy.
"""

from __future__ import annotations

from typing import Any, Mapping

from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from slaq.api.common import TIER_RANK
from slaq.api.contract import RequestSLA
from slaq.bench.stepcost import ScheduledWork, StepCostModel, StepLoad

# vLLM's priority heap orders by (priority, arrival_time, request_id); the oracle's key is
# packed into `priority` before the request is queued (never changed while it is queued).
_TIER_STRIDE = 10**13
TPOT_SAFETY = 0.9
MIN_PREFILL_TOKENS = 64


class OracleScheduler(AsyncScheduler):
    """AsyncScheduler with oracle ordering and objective-shaped step budgets (see module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cost: StepCostModel | None = None
        self._true_output: Mapping[str, int] = {}
        self._sla: dict[str, RequestSLA] = {}

    def bind_knowledge(self, cost: StepCostModel, true_output: Mapping[str, int]) -> None:
        self._cost, self._true_output = cost, true_output

    def add_request(self, request: Any) -> None:
        sla = RequestSLA.from_extra_args(request.sampling_params.extra_args if request.sampling_params else None)
        self._sla[request.request_id] = sla
        request.priority = self._key(request, sla)
        super().add_request(request)

    def _key(self, request: Any, sla: RequestSLA) -> int:
        rank = TIER_RANK[sla.tier]
        if sla.tpot_ms is not None and sla.ttft_ms is not None:
            arrival = sla.arrival if sla.arrival is not None else request.arrival_time
            return rank * _TIER_STRIDE + int(arrival * 1000.0 + sla.ttft_ms)
        work = request.num_prompt_tokens + self._true_output.get(request.request_id, request.max_tokens)
        return rank * _TIER_STRIDE + work

    def _tightest_tpot_s(self) -> float | None:
        tightest = None
        for request in self.running:
            tpot = self._sla.get(request.request_id, RequestSLA()).tpot_ms
            if tpot is not None and (tightest is None or tpot < tightest):
                tightest = tpot
        return None if tightest is None else tightest / 1000.0

    def _shaped_budget(self) -> int | None:
        if self._cost is None:
            return None
        tightest = self._tightest_tpot_s()
        if tightest is None:
            return None
        base, decodes, chunk_context = StepLoad(), 0, 0
        for request in self.running:
            if request.is_prefill_chunk:
                chunk_context = max(chunk_context, request.num_computed_tokens)
            else:
                base.add(ScheduledWork(1, request.num_computed_tokens, True))
                decodes += 1
        room = self._cost.prefill_tokens_within(tightest * TPOT_SAFETY, base, chunk_context)
        return min(self.max_num_scheduled_tokens, decodes + max(room, MIN_PREFILL_TOKENS))

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        # Decodes first (by tier), then running prefill chunks by key: the running loop hands
        # out the budget in list order, so this is what keeps decodes from starving.
        self.running.sort(key=lambda r: (r.is_prefill_chunk, r.priority, r.arrival_time))
        budget = self._shaped_budget()
        if budget is None:
            return super().schedule(*args, **kwargs)
        full = self.max_num_scheduled_tokens
        self.max_num_scheduled_tokens = budget
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_scheduled_tokens = full

