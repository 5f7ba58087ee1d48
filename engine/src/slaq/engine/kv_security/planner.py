"""The scheduler side of slaq's KV connector: one `KVSecurityPlan` per step for the worker.

It hears what vLLM's scheduler did through the connector interface (a request arrived, blocks were
allocated for a load, a request finished, a step was scheduled) and turns it into orders: blocks
to zero (ownership.py), preempted requests to seal into host memory and readmitted ones to fill
from there (swap.py). Tenants' erase modes come from the engine table (`kvErase`); a tenant that
leaves the table or whose cache salt changes has all its blocks erased (the engine table carries
only a fingerprint of each salt, to notice the change).

Per request it counts the blocks zeroed for it and the blocks of its KV sealed and restored
(`KVRequestFacts`, which the scheduler's audit line reads: request_log.py); the count lives while
the request does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from slaq.api.common import KvErase
from slaq.api.contract import RequestSLA
from slaq.api.table import EngineTable
from slaq.engine import vllm_compat as vc
from slaq.engine.config import read_engine_table
from slaq.engine.errors import SchedulerConfigError
from slaq.engine.kv_security.ownership import REASON_REUSE, REASON_SALT_CHANGED, REASON_TENANT_REMOVED, BlockOwnership, HeldBlocks, Reassignment
from slaq.engine.kv_security.swap import NO_HOST_CACHE, NO_ROOM, NO_RULE, BY_COST, LoadOrder, RecomputeModel, SaveOrder, SwapLedger, SwapOrRecompute
from slaq.engine.metrics import EngineMetrics
from slaq.engine.request_log import KVRequestFacts

log = logging.getLogger(__name__)


@dataclass
class KVSecurityPlan:
    """What the worker does before a step's forward pass, in this order: seal `saves` into host
    memory, drop the host copies of `drops`, zero `erase`, fill `loads` from host copies."""

    erase: list[int] = field(default_factory=list)
    saves: list[SaveOrder] = field(default_factory=list)
    loads: list[LoadOrder] = field(default_factory=list)
    drops: list[str] = field(default_factory=list)
    reassigned: list[Reassignment] = field(default_factory=list)  # only when the test hook inspects


@dataclass(frozen=True)
class TenantKV:
    erase: KvErase
    salt_fingerprint: str


def tenant_kv_policies(table: EngineTable) -> dict[str, TenantKV]:
    return {t.name: TenantKV(t.kv_erase, t.salt_fingerprint) for t in table.tenants}


class KVSecurityPlanner:
    def __init__(self, *, num_blocks: int, block_size: int, erase: bool, host_capacity_blocks: int,
                 metrics: EngineMetrics, inspect: bool = False, engine_table: Path | None = None) -> None:
        self.ownership = BlockOwnership(num_blocks, block_size, erase_on_reuse=erase)
        self.swap = SwapLedger(host_capacity_blocks, block_size) if host_capacity_blocks > 0 else None
        self._tier_of: dict[str, str] = {}
        self.erase_enabled = erase
        self.metrics = metrics
        self.inspect = inspect
        self.manager: Any = None  # vLLM's KVCacheManager, bound after the scheduler built it
        self._tenant_of: dict[str, str] = {}
        self._facts: dict[str, KVRequestFacts] = {}  # live requests only: dropped when one finishes
        self._policies: dict[str, TenantKV] = {}
        self._loads: list[LoadOrder] = []
        self._drops: list[str] = []
        if engine_table is not None and engine_table.is_file():
            try:
                self.apply_table(read_engine_table(engine_table))
            except SchedulerConfigError as exc:
                log.warning("%s; no tenant KV erase modes until it changes", exc)

    # -- tenants ---------------------------------------------------------------------------------
    def apply_table(self, table: EngineTable) -> None:
        """New erase modes; every block of a tenant that left the table or whose cache salt changed is erased."""
        self.apply_policies(tenant_kv_policies(table))

    def apply_policies(self, policies: Mapping[str, TenantKV]) -> None:
        if self.erase_enabled:
            for tenant, old in self._policies.items():
                new = policies.get(tenant)
                if new is None:
                    self.ownership.retire(tenant, REASON_TENANT_REMOVED)
                elif new.salt_fingerprint != old.salt_fingerprint:
                    self.ownership.retire(tenant, REASON_SALT_CHANGED)
            self.ownership.erase_when_freed = {t for t, p in policies.items() if p.erase is KvErase.ON_FREE}
        self._policies = dict(policies)
        self._evict()

    # -- requests --------------------------------------------------------------------------------
    def use_swap_rule(self, step_model: RecomputeModel, *, bytes_per_token: float, seal_seconds_per_byte: float,
                      always: bool = False) -> SwapOrRecompute | None:
        """Give the ledger its swap-or-recompute rule (the scheduler calls this with its step-time model)."""
        if self.swap is None:
            return None
        self.swap.choice = SwapOrRecompute(step_model, bytes_per_token, seal_seconds_per_byte, always)
        self.metrics.kv_swap_seal_seconds_per_token.set(2 * self.swap.choice.transfer_seconds(1))
        return self.swap.choice

    def arrived(self, request: vc.Request) -> None:
        sla = RequestSLA.from_extra_args(vc.extra_args(request))
        tenant = sla.tenant
        self._tenant_of[vc.request_id(request)] = tenant
        self._tier_of[vc.request_id(request)] = sla.tier.value
        self._facts[vc.request_id(request)] = KVRequestFacts()
        if self.erase_enabled and tenant in self.ownership.erase_when_freed:
            vc.skip_prefix_cache_reads(request)

    def matched_tokens(self, request: vc.Request, num_computed: int) -> int:
        if self.swap is None:
            return 0
        return self.swap.matched_tokens(vc.request_id(request), num_computed, vc.total_tokens(request))

    def allocated(self, request: vc.Request, blocks: Any, num_external: int) -> None:
        if self.swap is None or num_external <= 0:
            return
        order = self.swap.allocated(vc.request_id(request), vc.first_group_block_ids(blocks), num_external)
        if order is not None:
            facts = self._facts.get(vc.request_id(request))
            erased = self.ownership.written(order.tenant, order.block_ids)
            if facts is not None:
                facts.count_erased(REASON_REUSE, erased)
                facts.swap_in_blocks += len(order.block_ids)
            self._loads.append(order)

    def request_facts(self, request_id: str) -> KVRequestFacts | None:
        """The live count for a request (the scheduler keeps a reference; it stays valid after the request finished)."""
        return self._facts.get(request_id)

    def finished(self, request: vc.Request) -> None:
        request_id = vc.request_id(request)
        self._count_release(request_id, self.ownership.released(request_id))
        self._facts.pop(request_id, None)
        if self.swap is not None and self.swap.forget(request_id):
            self._drops.append(request_id)
        self._tenant_of.pop(request_id, None)
        self._tier_of.pop(request_id, None)
        self._evict()  # before the next schedule() can hit a block about to be zeroed

    def load_failed(self, block_ids: set[int]) -> None:
        if block_ids:
            self.metrics.kv_swap_blocks.labels(direction="in", outcome="failed").inc(len(block_ids))

    # -- the step --------------------------------------------------------------------------------
    def plan(self, output: vc.SchedulerOutput) -> KVSecurityPlan:
        plan = KVSecurityPlan(loads=self._loads, drops=self._drops)
        self._loads, self._drops = [], []
        facts = self._facts
        for request_id in vc.preempted_ids(output):
            held = self.ownership.released(request_id)
            if held is None:
                continue
            self._count_release(request_id, held)
            if self.swap is None:
                self._count_victim(request_id, "recomputed", NO_HOST_CACHE)
                continue
            order = self.swap.preempted(request_id, held)
            if isinstance(order, SaveOrder):
                plan.saves.append(order)
                if (victim := facts.get(request_id)) is not None:
                    victim.swap_out_blocks += len(order.block_ids)
                self._count_victim(request_id, "swapped", self.swap.choice.reason if self.swap.choice is not None else BY_COST)
            else:
                self.metrics.kv_swap_blocks.labels(direction="out", outcome=order).inc(max(1, held.computed_tokens // self.ownership.block_size))
                reason = NO_ROOM if order == NO_ROOM else (BY_COST if self.swap.choice is not None else NO_RULE)
                self._count_victim(request_id, "recomputed", reason)
        tenant_of = self._tenant_of
        for request_id, block_ids, computed, scheduled, replaces in vc.scheduled_blocks(output):
            tenant = tenant_of.get(request_id)
            if tenant is not None:
                erased = self.ownership.scheduled(request_id, tenant, block_ids, computed, scheduled, replaces=replaces)
                if erased and (scheduled_facts := facts.get(request_id)) is not None:
                    scheduled_facts.count_erased(REASON_REUSE, erased)
        orders = self.ownership.take_erase_orders()
        plan.erase = sorted(orders)
        for reason in set(orders.values()):
            self.metrics.kv_erased_blocks.labels(reason=reason).inc(sum(1 for r in orders.values() if r == reason))
        reassigned = self.ownership.take_reassignments()
        if self.inspect:
            plan.reassigned = reassigned
        if plan.saves:
            self.metrics.kv_swap_blocks.labels(direction="out", outcome="ok").inc(sum(len(s.block_ids) for s in plan.saves))
        if plan.loads:
            self.metrics.kv_swap_blocks.labels(direction="in", outcome="ordered").inc(sum(len(l.block_ids) for l in plan.loads))
        self._evict()
        return plan

    def _count_release(self, request_id: str, held: HeldBlocks | None) -> None:
        facts = self._facts.get(request_id)
        if held is not None and facts is not None:
            for reason, blocks in held.erased.items():
                facts.count_erased(reason, blocks)

    def _count_victim(self, request_id: str, choice: str, reason: str) -> None:
        tier = self._tier_of.get(request_id, "standard")
        self.metrics.kv_swap_victims.labels(tier=tier, choice=choice, reason=reason).inc()

    def _evict(self) -> None:
        evictions = self.ownership.take_evictions()
        if evictions and self.manager is not None:
            vc.evict_cached_blocks(self.manager, sorted(evictions))
