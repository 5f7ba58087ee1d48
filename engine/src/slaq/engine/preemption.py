"""Preemption for SLA-urgent arrivals, decided before vLLM's `schedule()` runs.

Stock vLLM preempts only when a *running* request cannot get KV blocks; an urgent arrival waits
behind a full batch of low-priority decodes. Here, when the batch (`max_num_seqs`) or the KV
cache cannot take the waiting requests that have a TTFT objective, running decodes of a strictly
lower tier are preempted for them:

- `ThrashGuard`: a request preempted once may not be preempted again before it has produced
  `min_progress_tokens` new output tokens, and victims are always of a strictly lower tier than
  the request they make room for, so two requests can never preempt each other back and forth.
- The victim order is the pod policy's (`slaq.policy.victims`, by default lowest tier, then
  cheapest to recompute, then latest arrival); `VictimChooser` only hands it the running requests.
- `UrgentPreemption.plan` bounds preemptions per step (`max_preemptions_per_step`).
- A victim has a price (`VictimPrice`, victim_price.py): the time to get its KV back, recomputed or
  swapped in if the host cache can hold it; one that costs more than half the urgent request's TTFT
  objective is passed over, so a long context is never preempted for a short gain.
- A preemption costs the victim everything it computed (recomputed, or swapped out and back), so
  an urgent request that would still meet its TTFT objective by waiting does not preempt: when the
  running requests that finish soonest (at most their remaining `max_tokens` decode steps each, at
  the recent mean step time) free a slot and enough blocks for it with two steps to spare before
  `step.waitShare` of its objective has passed, it waits for them (`frees_in_time`). Not the whole
  objective: after the engine starts it come its prefill steps and the way back to the client (API
  server, sidecar, network), which the engine does not see (traced on the demo's overload, waiting
  up to two steps before the deadline started critical requests in time for the engine and late for
  the client). Nor past its deadline less its own prompt's step (the step-time model's prediction
  beside the running decodes): a 4,000-token prompt on a 32B model takes ~0.33 s of a 0.5 s
  objective, and one that waited half of it for room started too late to make it. Without a step
  time yet, it preempts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from slaq.engine import vllm_compat as vc
from slaq.engine.blocks import PlannedOutputLeft, RoomForecast
from slaq.engine.sla import RequestInfo
from slaq.engine.victim_price import VictimPrice
from slaq.engine.vllm_compat import Request
from slaq.policy.victims import LowestTierCheapest, VictimOrder, may_preempt_for

REASON_BATCH_FULL = "batch_full"
REASON_KV_FULL = "kv_full"
REASON_KV_EXHAUSTED = "kv_exhausted"  # vLLM's own running-loop preemption


@dataclass(frozen=True)
class ThrashGuard:
    min_progress_tokens: int = 4

    def protect(self, request: Request, info: RequestInfo) -> None:
        """Called when `request` is preempted."""
        info.preemptions += 1
        info.protected_until_output = vc.output_tokens(request) + self.min_progress_tokens

    def may_preempt(self, request: Request, info: RequestInfo) -> bool:
        return vc.output_tokens(request) >= info.protected_until_output


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A running request as the victim policy sees it."""

    tier_rank: int
    computed_tokens: int
    arrival: float
    request: Request


@dataclass(frozen=True)
class VictimChooser:
    policy: VictimOrder = LowestTierCheapest()

    def order(self, candidates: Sequence[Request], info_of: Callable[[Request], RequestInfo]) -> list[Request]:
        facts = [_Candidate(info_of(r).tier_rank, vc.computed_tokens(r), info_of(r).arrival, r) for r in candidates]
        return [c.request for c in self.policy.order(facts)]


@dataclass(frozen=True)
class Preemption:
    victim: Request
    reason: str


@dataclass(frozen=True)
class ResourceView:
    """What the planner needs to know about free capacity right now."""

    free_slots: int
    free_blocks: int
    headroom_blocks: int
    block_size: int
    step_tokens: int
    now: float = 0.0
    step_s: float = 0.0  # recent mean model step time; 0: not known yet
    wait_share: float = 0.5  # of a TTFT objective, the part an urgent request may spend waiting for room to free on its own (`step.waitShare`)
    # The predicted step that carries a prompt of n tokens beside the running decodes (the step-time model's);
    # None: not known, the wait share alone bounds the wait.
    prompt_step_s: Callable[[int], float] | None = None
    # The k-th smallest planned steps left among the running requests, kept across steps (`SoonestFinishers`);
    # None: read from the running batch.
    soonest_finisher: Callable[[int], int | None] | None = None


def frees_in_time(info: RequestInfo, room: RoomForecast, need_blocks: int,
                  free_slots: int, free_blocks: int, resources: ResourceView, prompt_tokens: int = 0) -> bool:
    """Whether running requests finishing on their own (`room`) free a slot and `need_blocks` blocks for the
    urgent request `info` describes early enough that it still starts two steps before `wait_share`
    of its objective has passed, and before its deadline less the step that carries its `prompt_tokens`
    (an upper bound on their remaining steps: a request may stop before `max_tokens`)."""
    step_s = resources.step_s
    if step_s <= 0.0 or info.ttft_s is None:
        return False
    start_by = min(info.deadline, info.arrival + resources.wait_share * info.ttft_s)
    if resources.prompt_step_s is not None and prompt_tokens:
        start_by = min(start_by, info.deadline - resources.prompt_step_s(prompt_tokens))
    budget_steps = (start_by - resources.now) / step_s - 2.0
    return budget_steps >= 1.0 and room.steps_until(need_blocks, free_blocks, free_slots) <= budget_steps


@dataclass(frozen=True)
class UrgentPreemption:
    max_per_step: int
    guard: ThrashGuard = ThrashGuard()
    chooser: VictimChooser = VictimChooser()
    price: VictimPrice | None = None  # None: every victim is worth it (as before victims had a price)

    def plan(
        self,
        urgent: Sequence[Request],
        running: Sequence[Request],
        resources: ResourceView,
        info_of: Callable[[Request], RequestInfo],
    ) -> list[Preemption]:
        """Victims to preempt so that the urgent waiting requests (best first) can be admitted this step."""
        if not urgent or self.max_per_step <= 0:
            return []
        if resources.free_slots >= len(urgent) and resources.free_blocks >= sum(
            self._blocks_needed(r, info_of(r), resources) for r in urgent
        ):
            return []  # room for all of them: the common case costs no scan of the running batch
        victims: list[Request] | None = None  # ordered when first needed: urgent requests that wait for room need none
        room = RoomForecast(running, resources.block_size, PlannedOutputLeft(info_of), resources.soonest_finisher)  # sorted once, if asked
        plan: list[Preemption] = []
        taken: set[str] = set()
        slots, blocks = resources.free_slots, resources.free_blocks
        for request in urgent:
            info = info_of(request)
            chunk_blocks = math.ceil(min(vc.total_tokens(request), resources.step_tokens) / resources.block_size)
            need_blocks = self._blocks_needed(request, info, resources)
            missed = resources.now >= info.deadline
            if (slots < 1 or blocks < need_blocks) and frees_in_time(info, room, need_blocks, slots, blocks, resources,
                                                                     vc.prefill_tokens_left(request)):
                continue  # it waits for requests finishing on their own: no one loses their work
            if victims is None:  # the batch scan, once a step at most
                victims = self.chooser.order([r for r in running if vc.is_decoding(r) and self.guard.may_preempt(r, info_of(r))], info_of)
            chosen: list[Preemption] = []
            free_slots, free_blocks = slots, blocks
            for victim in victims:
                if free_slots >= 1 and free_blocks >= need_blocks:
                    break
                if vc.request_id(victim) in taken or not may_preempt_for(info_of(victim).tier_rank, info.tier_rank, missed):
                    continue
                if self.price is not None and not self.price.worth(vc.computed_tokens(victim), info.ttft_s):
                    continue  # getting its KV back costs more than the urgent request gains
                chosen.append(Preemption(victim, REASON_BATCH_FULL if free_slots < 1 else REASON_KV_FULL))
                free_slots += 1
                free_blocks += math.ceil(vc.computed_tokens(victim) / resources.block_size)
            if free_slots < 1 or free_blocks < need_blocks or len(plan) + len(chosen) > self.max_per_step:
                break  # no room for this one within the bound; the rest are less urgent
            plan.extend(chosen)
            taken.update(vc.request_id(p.victim) for p in chosen)
            slots, blocks = free_slots - 1, free_blocks - chunk_blocks
        return plan

    @staticmethod
    def _blocks_needed(request: Request, info: RequestInfo, resources: ResourceView) -> int:
        """Blocks the request's first chunk needs, plus the critical headroom it may not touch."""
        chunk_blocks = math.ceil(min(vc.total_tokens(request), resources.step_tokens) / resources.block_size)
        return chunk_blocks + (0 if info.tier_rank == 0 else resources.headroom_blocks)
