"""`SLAScheduler`: vLLM 0.32's `AsyncScheduler` with slaq's policies plugged in (and its KV load
failure recovery made to finish under async scheduling: `vllm_compat.RecomputesLoadFailures`).

`schedule()` is vLLM's own; around it, each step:
1. fixes the clock and load for the waiting queue (`SLARequestQueue.begin_step`),
2. preempts lower-tier running decodes for SLA-urgent waiting requests when the batch or the
   KV cache is full (`UrgentPreemption`) — before vLLM's schedule(), whose waiting admission is
   skipped in any step where its own running loop preempted,
3. lets the waiting queue pass over requests refused for a reason of their own and backfill
   past a head that does not fit in the free KV cache (`SLARequestQueue`, `admission_refusal`),
4. caps the step's token budget (`StepBudgetPolicy`: by default shaped to the tightest running
   TPOT objective, see tpot_budget.py) and, while an urgent request waits, lets running prefill
   chunks of lower tiers sit out the step so it takes their share,
5. runs vLLM's schedule(), which admits from the slaq queue and allocates through the slaq
   block manager, then charges the scheduled tokens to the tenants' fairness counters and
   records metrics.

Per request it keeps the facts of the engine's audit line (queue waits, preemptions by reason;
the KV connector adds erased and swapped blocks) and writes the line when vLLM frees the request
(`request_log.py`, `vllm_compat.ReportsFreedRequests`).

Use it through vLLM: `scheduler_cls="slaq.engine.scheduler.SLAScheduler"`,
`scheduling_policy="priority"` (`slaq engine` sets both).
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Mapping

from slaq.api.common import Tier
from slaq.api.contract import RequestSLA
from slaq.engine import vllm_compat as vc
from slaq.engine.blocks import BlockBudgetRule, SLABlockManager
from slaq.engine.kv_admission import REFUSED_TPOT_KV, KvTpotAdmission
from slaq.api.table import EngineTable
from slaq.engine.config import TABLE_CHECK_INTERVAL_S, EngineSchedulerConfig, EngineTableWatcher
from slaq.engine.metrics import engine_metrics
from slaq.engine.ordering import WaitingOrder
from slaq.engine.output_plan import OutputBound
from slaq.engine.preemption import REASON_KV_EXHAUSTED, ResourceView, ThrashGuard, UrgentPreemption, VictimChooser
from slaq.engine.queue import SLARequestQueue
from slaq.engine.request_log import RequestFacts, RequestLog, new_facts
from slaq.engine.sla import TIER_NAMES, RequestInfo, request_info
from slaq.engine.tpot_budget import PaceClock
from slaq.engine.ttft_class import TightestTtft
from slaq.engine.victim_price import VictimPrice
from slaq.engine.vllm_compat import Request, SchedulerOutput
from slaq.policy import PodPolicy
from slaq.policy.discipline import first_token_lead
from slaq.policy.step_budget import BatchView, StepBudget
from slaq.policy.tpot_budget import StepTimeModel
from slaq.policy.views import RequestView

STEP_MODEL_EXPORT_EVERY = 64  # timed steps between two exports of the step-time model to the metrics


class SLAScheduler(vc.ReportsFreedRequests, vc.RecomputesLoadFailures):
    # Tests and embedders may set this before construction; vLLM constructs the class itself.
    config_override: EngineSchedulerConfig | None = None
    # Plan requests without a client max_tokens on the sidecar's predicted output (output_plan.py);
    # False: on max_tokens, the rest of the context (the benchmark's `slaq-max-tokens`, for comparison).
    plans_on_prediction: bool = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = self.config_override or EngineSchedulerConfig.from_environment()
        self.slaq_config = config
        spec = config.spec
        # Not `self.policy`: that is vLLM's SchedulingPolicy, and its running loop picks the victim of
        # a KV-exhaustion preemption by it (lowest priority under PRIORITY, else the last admitted).
        self.pod_policy = PodPolicy.from_spec(spec)
        self.step_spec = spec.step  # step-time smoothing, urgent waits, hold-back bound
        self.fairness = self.pod_policy.accounting
        self.order = WaitingOrder(self.pod_policy, max_length_tokens=vc.max_model_len(self))
        vc.install_waiting_queues(self, lambda: SLARequestQueue(self.order, self.info_of))
        self.block_manager = SLABlockManager.adopt(
            self,
            self._block_rule(config.tenant_kv_share),
            self.info_of,
            on_allocated=self._charge_fairness,
        )
        self.waiting_queue.admission = self._admission_refusal
        self.waiting_queue.held = lambda request, ahead: self.block_manager.held_for(request, self, ahead)
        self.waiting_queue.lead = self._first_token_lead
        self.guard = ThrashGuard(config.min_progress_tokens)
        self.step_budget: StepBudget = self.pod_policy.step_budget()
        self.pace = PaceClock()
        self.ttft_classes = TightestTtft()  # the tightest TTFT objective served lately: the step budget keeps room for it
        self._tight_prefill: Request | None = None  # a request of that class whose prompt the steps are prefilling
        # The step budget's learned model, or one of the scheduler's own: it also prices a preempted
        # request's recompute for the KV connector's swap rule (kv_security/swap.py).
        self.step_model: StepTimeModel = getattr(self.step_budget, "model", None) or StepTimeModel()
        self._feeds_step_model = self.step_model is not getattr(self.step_budget, "model", None)
        self.kv_admission = KvTpotAdmission(self.step_model)
        self.output_bound = OutputBound()
        self._max_model_len = vc.max_model_len(self)
        # (output, scheduled at, KV tokens held, its prompt chunks' attention pairs) awaiting their model step
        self._in_flight: deque[tuple[SchedulerOutput, float, int, int]] = deque()
        self._last_step_done: float | None = None
        self._step_s = 0.0  # EWMA of model step durations (urgent preemption's time-to-free estimate)
        self._steps_timed = 0
        self.metrics = engine_metrics()
        self.request_log = RequestLog.from_environment()
        self.metrics.info.labels(scheduler=type(self).__name__, vllm=vc.VLLM_VERSION).set(1)
        self.table_watcher = self.watch_engine_table(config.engine_table) if config.engine_table is not None else None
        self._install_swap_rule()  # before the victim price, which reads the swap rule it installs
        self.preemption = UrgentPreemption(spec.max_preemptions_per_step, self.guard, VictimChooser(self.pod_policy.victims),
                                           self._victim_price())

    def watch_engine_table(self, path: Path, interval_s: float = TABLE_CHECK_INTERVAL_S) -> EngineTableWatcher:
        reloads = self.metrics.table_reloads
        return EngineTableWatcher(path, interval_s=interval_s, on_reload=lambda outcome: reloads.labels(outcome=outcome).inc())

    def apply_engine_table(self, table: EngineTable) -> None:
        """A changed table: the block budget's KV shares, and (when vLLM runs it) slaq's KV
        connector's erase modes and salt fingerprints."""
        from slaq.engine.kv_security.connector import SlaqKVConnector

        self.apply_tenant_shares(table.kv_shares())
        connector = vc.kv_connector(self)
        if isinstance(connector, SlaqKVConnector):
            connector.apply_table(table)

    def _install_swap_rule(self) -> None:
        from slaq.engine.kv_security.connector import SlaqKVConnector

        connector = vc.kv_connector(self)
        if isinstance(connector, SlaqKVConnector):
            connector.use_step_model(self.step_model)

    def _victim_price(self) -> VictimPrice:
        """Victims priced by the step-time model, and by the KV connector's swap rule and host room when it swaps."""
        from slaq.engine.kv_security.connector import SlaqKVConnector

        connector = vc.kv_connector(self)
        ledger = connector.planner.swap if isinstance(connector, SlaqKVConnector) and connector.planner is not None else None
        if ledger is None or ledger.choice is None:
            return VictimPrice(self.step_model)
        return VictimPrice(self.step_model, ledger.choice, lambda: (ledger.capacity_blocks - ledger.used_blocks) * ledger.block_size)

    def apply_tenant_shares(self, tenant_kv_share: Mapping[str, float]) -> None:
        self.block_manager.set_rule(self._block_rule(tenant_kv_share))

    def _block_rule(self, tenant_kv_share: Mapping[str, float]) -> BlockBudgetRule:
        return BlockBudgetRule.from_shares(vc.usable_blocks(vc.block_manager(self)), self.slaq_config.spec.critical_kv_headroom, tenant_kv_share)

    # -- request facts -----------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        sla = None
        if vc.attached_info(request) is None:
            sla = RequestSLA.from_extra_args(vc.extra_args(request))
            # Whatever priority arrived (a header, a body field, a future vLLM path), vLLM's own
            # preemption orders by the tier the sidecar put in `vllm_xargs`.
            vc.set_priority(request, sla.tier.rank)
            vc.attach_info(
                request,
                request_info(
                    sla,
                    arrival=vc.arrival_time(request),
                    prompt_tokens=vc.prompt_tokens(request),
                    max_tokens=vc.max_tokens(request),
                    aging_bound_s=self.slaq_config.spec.aging_bound_seconds,
                ),
            )
            info = self.info_of(request)
            self.ttft_classes.arrived(info.ttft_s, info.prompt_tokens, info.arrival)
            if self.plans_on_prediction:
                info.planned_output = self.output_bound.planned_output(sla.predicted_output, info.prompt_tokens,
                                                                       vc.max_tokens(request), self._max_model_len)
            self.metrics.count_arrival(sla.tier)
        super().add_request(request)  # tells the KV connector, which starts its count for the request
        if sla is not None and self.request_log.enabled:
            self.info_of(request).facts = self._new_facts(request, sla)

    def _new_facts(self, request: Request, sla: RequestSLA) -> RequestFacts:
        from slaq.engine.kv_security.connector import SlaqKVConnector

        facts = new_facts(request_id=sla.request_id, engine_request_id=vc.request_id(request), tenant=sla.tenant, tier=sla.tier.value)
        connector = vc.kv_connector(self)
        if isinstance(connector, SlaqKVConnector):
            facts.kv = connector.request_facts(vc.request_id(request))
        return facts

    def request_freed(self, request: Request) -> None:
        """The request left the scheduler: the output bound learns from it, and its audit line, once."""
        info = vc.attached_info(request)
        if info is not None and info.sidecar_prediction is not None and vc.finish_reason(request) == "stop":
            self.output_bound.observe(info.sidecar_prediction, vc.output_tokens(request))  # how far predictions fall short
            info.sidecar_prediction = None  # once
        facts = info.facts if info is not None else None
        if facts is None:
            return
        info.facts = None
        self.request_log.write(facts.record(finish=vc.finish_reason(request), prompt_tokens=vc.prompt_tokens(request),
                                            output_tokens=vc.output_tokens(request), now=time.monotonic()))

    def _facts_of(self, request: Request) -> RequestFacts | None:
        info = vc.attached_info(request)
        return info.facts if info is not None else None

    # The SLA facts attached when the request arrived (`add_request`): vLLM calls add_request for
    # every request it schedules. A C-speed getter (the queue reads it for its heads several times a step).
    info_of: Callable[[Request], RequestInfo] = staticmethod(vc.known_info)

    def _admission_refusal(self, request: Request) -> str | None:
        """Why the waiting loop should pass over `request` now: the block manager's reasons, then the
        running KV priced against the tightest running TPOT objective (`KvTpotAdmission`)."""
        reason = self.block_manager.admission_refusal(request, self)
        if reason is not None:
            return reason
        ledger = self.block_manager.ledger
        tightest = ledger.tightest_tpot_s()
        if tightest is not None and self.kv_admission.refuses(tightest, len(vc.running_requests(self)),
                                                              ledger.blocks_held() * vc.block_size(self), vc.total_tokens(request)):
            return REFUSED_TPOT_KV  # (no TPOT objective running: nothing to price, the common case first)
        return None

    def _first_token_lead(self, view: RequestView) -> float:
        """Seconds from a waiting request's admission to its first token (`first_token_lead`, at the
        mean step time; 0 until `step.stepsBeforeStepTime` steps were timed)."""
        return first_token_lead(self._trusted_step_s(), view.prompt_tokens, vc.step_token_limit(self))

    def _trusted_step_s(self) -> float:
        return self._step_s if self._steps_timed >= self.step_spec.steps_before_step_time else 0.0

    def _charge_fairness(self, tier_rank: int, tenant: str, tokens: int) -> None:
        self.fairness.charge(TIER_NAMES[tier_rank], tenant, tokens)

    def _charge_decodes(self) -> None:
        """One token per running request and step, charged per tenant: O(tenants), not O(batch)."""
        for (tier_rank, tenant), running in self.block_manager.ledger.running_by_tenant.items():
            self.fairness.charge(TIER_NAMES[tier_rank], tenant, running)

    @property
    def waiting_queue(self) -> SLARequestQueue:
        return vc.waiting_queue(self)  # type: ignore[return-value]

    # -- the step ------------------------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        started = time.perf_counter()
        now = time.time()
        running = vc.running_requests(self)
        limit = vc.active_request_limit(self)
        self.order.set_load(self.pod_policy.load(len(running), limit, vc.kv_cache_usage(self)))
        for queue in vc.waiting_queues(self):
            queue.begin_step(now)  # type: ignore[attr-defined]
        if self.table_watcher is not None:
            table = self.table_watcher.poll()
            if table is not None:
                self.apply_engine_table(table)
        ours = self._preempt_for_urgent(now, running, limit)
        self.block_manager.promote_evict_first()
        ledger = self.block_manager.ledger
        kv_tokens = ledger.blocks_held() * vc.block_size(self)
        cap = self.step_budget.budget(self._batch_view(ledger.tightest_tpot_s(), kv_tokens, now), vc.step_token_limit(self), now)
        if cap is not None:
            vc.decodes_first(self)
        held = self._prefills_to_hold_back(cap if cap is not None else vc.step_token_limit(self))
        try:
            if cap is None and not held:  # the common case: the step is vLLM's as it stands
                output = self._vllm_schedule(args, kwargs)
            else:
                with vc.step_token_budget(self, cap), vc.hold_back(self, held):
                    output = self._vllm_schedule(args, kwargs)
        finally:
            self.waiting_queue.end_step()
        self._in_flight.append((output, time.monotonic(), kv_tokens, vc.prefill_pairs(self, output)))
        self._after_step(output, ours)
        self.metrics.observe_step(time.perf_counter() - started, self.waiting_queue.depth_by_rank(), self.block_manager.ledger.blocks_by_tier)
        return output

    def _vllm_schedule(self, args: tuple, kwargs: dict) -> SchedulerOutput:
        if vc.batch_full(self):
            self.waiting_queue.admits_nothing()  # the waiting loop stops at its first check
        return super().schedule(*args, **kwargs)

    def _batch_view(self, tightest_tpot_s: float | None, kv_tokens: int, now: float) -> BatchView:
        running = vc.running_requests(self)
        tight = self.ttft_classes.tightest(now)
        if tightest_tpot_s is None and tight is None:
            return BatchView(None, len(running), kv_tokens)
        tight_ttft_s, tight_prompt = tight if tight is not None else (None, 0)
        in_flight = len(self._in_flight)
        urgent_tokens, urgent_tight, urgent_deadline = self._urgent_prompt(tight_ttft_s)
        pace = self.pace.slack(running, self.info_of, now, in_flight) if tightest_tpot_s is not None else None
        return BatchView(tightest_tpot_s, len(running), kv_tokens, None if pace is None else pace.slack_s, in_flight, urgent_tokens,
                         vc.longest_prefill_context(running), tight_ttft_s, tight_prompt, urgent_tight,
                         0.0 if pace is None else pace.credit_s, None if urgent_deadline is None else urgent_deadline - now)

    def _urgent_prompt(self, tight_ttft_s: float | None) -> tuple[int, bool, float | None]:
        """(prompt tokens left of the most urgent request, whether it is of the tightest TTFT class, its
        TTFT deadline when it is: time.time() clock). A
        request of that class admitted in a step too short for its whole prompt stays the urgent one
        while it prefills: vLLM schedules the running requests' chunks first, and its first token waits
        for the last of them."""
        carried = self._tight_prefill
        if carried is not None:
            if vc.is_prefilling(carried):
                return vc.prefill_tokens_left(carried), True, self.info_of(carried).deadline
            self._tight_prefill = None
        urgent = self.waiting_queue.urgent_heads(1) if len(self.waiting_queue) else []  # len: the queue's truth is the waiting loop's (queue.py)
        if not urgent:
            return 0, False, None
        info = self.info_of(urgent[0])
        tight = info.ttft_s is not None and tight_ttft_s is not None and info.ttft_s <= tight_ttft_s
        if tight:
            self._tight_prefill = urgent[0]
        return vc.prefill_tokens_left(urgent[0]), tight, info.deadline if tight else None

    def _preempt_for_urgent(self, now: float, running: list[Request], limit: int) -> set[str]:
        if not len(self.waiting_queue):  # len: the queue's truth is the waiting loop's (queue.py)
            return set()
        holders = self.block_manager.ledger.requests_by_tier
        if not any(holders[1:]):
            return set()  # nothing below the critical tier is running: there is no one to preempt
        urgent = self.waiting_queue.urgent_heads(self.preemption.max_per_step or 1)
        if not urgent or not any(holders[self.info_of(urgent[0]).tier_rank + 1:]):
            return set()
        resources = ResourceView(
            free_slots=limit - len(running),
            free_blocks=self.block_manager.free_block_count(),
            headroom_blocks=self.block_manager.headroom_left(),
            block_size=vc.block_size(self),
            step_tokens=vc.step_token_limit(self),
            now=now,
            step_s=self._trusted_step_s(),
            wait_share=self.step_spec.wait_share,
            prompt_step_s=self._prompt_step_s(len(running)),
            soonest_finisher=self.block_manager.finishers.kth_steps_left,
        )
        plan = self.preemption.plan(urgent, running, resources, self.info_of)
        for preemption in plan:
            info = self.info_of(preemption.victim)
            self.guard.protect(preemption.victim, info)
            vc.preempt(self, preemption.victim, now)
            self.metrics.count_preemption(info.tier, preemption.reason)
            if info.facts is not None:
                info.facts.preempted(preemption.reason, time.monotonic())
        return {vc.request_id(p.victim) for p in plan}

    def _prompt_step_s(self, running: int) -> Callable[[int], float]:
        """The step-time model's step of a whole prompt of n tokens beside `running` decodes."""
        model, kv_tokens = self.step_model, self.block_manager.ledger.blocks_held() * vc.block_size(self)
        return lambda tokens: model.prompt_step_s(tokens, running, kv_tokens)

    def _prefills_to_hold_back(self, budget: int) -> list[Request]:
        """Running prefill chunks of tiers below an urgent waiting request sit out this step when the
        step's budget cannot hold them and the urgent request's prompt, so it takes the budget instead
        of queueing behind their chunks. A request sits out at most `step.maxHoldBackSteps` steps in a row
        (no starvation), and nothing sits out when the urgent request has no slot to take."""
        if not len(self.waiting_queue):  # len: the queue's truth is the waiting loop's (queue.py)
            return []
        running = vc.running_requests(self)
        if vc.active_request_limit(self) - len(running) <= 0 or not vc.any_prefill_chunk(running):
            return []  # no slot to take, or no prefill chunk to hold back
        urgent = self.waiting_queue.urgent_heads(1)
        if not urgent:
            return []
        rank = self.info_of(urgent[0]).tier_rank
        chunks = [request for request in filter(vc.is_prefill_chunk, running) if vc.is_prefilling(request)]  # C-speed scan first
        demand = vc.total_tokens(urgent[0]) + len(running) - len(chunks)  # a token for each decode
        candidates: list[Request] = []
        for request in chunks:
            demand += vc.prefill_tokens_left(request)
            info = self.info_of(request)
            if info.tier_rank > rank and info.held_back_steps < self.step_spec.max_hold_back_steps:
                candidates.append(request)
            else:
                info.held_back_steps = 0
        held: list[Request] = []
        for request in reversed(candidates):  # the latest admitted sit out first
            if demand <= budget:
                break
            demand -= vc.prefill_tokens_left(request)
            self.info_of(request).held_back_steps += 1
            held.append(request)
        for request in candidates:
            if request not in held:
                self.info_of(request).held_back_steps = 0
        return held

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: Any) -> Any:
        result = super().update_from_output(scheduler_output, model_runner_output)
        self.block_manager.finishers.tick(vc.most_tokens_per_request(model_runner_output))
        self._observe_step(scheduler_output)
        return result

    def _observe_step(self, output: SchedulerOutput) -> None:
        """A step's duration: from the later of its scheduling and the previous step's end, to now."""
        now = time.monotonic()
        scheduled_at = None
        kv_tokens = pairs = 0
        while self._in_flight:
            queued, at, kv, chunk_pairs = self._in_flight.popleft()
            if queued is output:
                scheduled_at, kv_tokens, pairs = at, kv, chunk_pairs
                break
        if scheduled_at is not None:
            started = scheduled_at if self._last_step_done is None else max(scheduled_at, self._last_step_done)
            seconds = now - started
            self.step_budget.observe(vc.total_scheduled_tokens(output), seconds, kv_tokens, pairs)
            if self._feeds_step_model:
                self.step_model.observe(vc.total_scheduled_tokens(output), seconds, kv_tokens, pairs)
            if self._steps_timed % STEP_MODEL_EXPORT_EVERY == 0:
                model = self.step_model
                self.metrics.observe_step_model(model.fixed_s, model.per_token_s, model.per_kv_token_s, model.per_pair_s)
            self._step_s = seconds if not self._steps_timed else self._step_s + self.step_spec.step_time_alpha * (seconds - self._step_s)
            self._steps_timed += 1
        self._last_step_done = now

    def _after_step(self, output: SchedulerOutput, ours: set[str]) -> None:
        self._charge_decodes()
        now = time.monotonic()
        for request_id in vc.preempted_ids(output) - ours:
            request = vc.request_by_id(self, request_id)
            if request is not None:
                info = self.info_of(request)
                self.guard.protect(request, info)
                self.metrics.count_preemption(info.tier, REASON_KV_EXHAUSTED)
                if info.facts is not None:
                    info.facts.preempted(REASON_KV_EXHAUSTED, now)
        if self.request_log.enabled:
            for request_id in vc.admitted_ids(output):
                request = vc.request_by_id(self, request_id)
                facts = self._facts_of(request) if request is not None else None
                if facts is not None:
                    facts.scheduled(now)
        self._export_prefix_counts()

    def _export_prefix_counts(self) -> None:
        ledger = self.block_manager.ledger
        for key, queried in ledger.prefix_query_tokens.items():
            self.metrics.count_prefix(key[0], key[1], queried, ledger.prefix_hit_tokens.get(key, 0))
        ledger.prefix_query_tokens.clear()
        ledger.prefix_hit_tokens.clear()
