"""The `QuotaSplit` status condition: whether every replica holds a share of a tenant's quotas (pure).

A quota smaller than the replicas it is split over (in its units: whole concurrent requests,
milli-requests per minute) cannot give each replica one unit. quotas.py then puts the units on
the replicas with most demand; the others refuse the tenant (429) until demand seen there moves
a unit to them. The condition says so, with the numbers, on the TenantSLA and on each pool:

- `True`, reason `EveryReplica`: each replica holds a share of each quota;
- `False`, reason `QuotaBelowReplicas`: the message names the quota, the replicas it is split
  over, how many replicas hold a share, and how many of those with demand do;
- `Unknown`, reason `NoPool`: the tenant is bound to no pool yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slaq.operator.conditions import condition
from slaq.operator.quotas import Coverage, Split
from slaq.operator.tables import TenantSplits

CONDITION_TYPE = "QuotaSplit"
SHORT_REASON = "QuotaBelowReplicas"
FULL_REASON = "EveryReplica"
POOL_MESSAGE_TENANTS = 5  # a pool's message names this many short tenants, then counts the rest


def _sum(coverages: list[Coverage]) -> Coverage:
    return Coverage(sum(c.replicas for c in coverages), sum(c.holding for c in coverages),
                    sum(c.with_demand for c in coverages), sum(c.with_demand_holding for c in coverages))


def _demand_clause(c: Coverage) -> str:
    if c.with_demand == 0:
        return "none has demand yet"
    return f"{c.with_demand_holding} of the {c.with_demand} with demand"


def _describe(field: str, split: Split, scope: Coverage, where: str) -> str:
    """One short quota: `maxConcurrency 4 over 8 replica(s): 3 of the 8 hold a share (3 of the 5 with demand)`."""
    total = sum(split.replicas.values())
    return (f"{field} {split.quota} over {total} replica(s): {scope.holding} of {where}{scope.replicas} hold a share "
            f"({_demand_clause(scope)})")


ADVICE = ("a replica without a share refuses the tenant (429) until the demand it sees moves a unit to it at the next "
          "usage tick; give the quota at least one unit per replica, or run fewer replicas, for a share on every replica")


def render_quota_condition(splits: TenantSplits | None, generation: int | None) -> dict[str, Any]:
    """The tenant's QuotaSplit condition, from its splits across every pool it binds."""
    if splits is None:
        return condition(CONDITION_TYPE, None, "NoPool", "bound to no pool: nothing to split", generation)
    named = splits.named()
    if not named:
        return condition(CONDITION_TYPE, True, FULL_REASON, "no quota is set: every replica admits the tenant", generation)
    if not any(split.replicas for _, split in named):
        return condition(CONDITION_TYPE, None, "NoPool", "bound to no pool: nothing to split", generation)
    short = [(field, split) for field, split in named if split.short_of_replicas()]
    if not short:
        return condition(CONDITION_TYPE, True, FULL_REASON, "each replica of every bound pool holds a share of each quota", generation)
    parts = [_describe(field, split, _sum(list(split.coverage.values())), "the ") for field, split in short]
    return condition(CONDITION_TYPE, False, SHORT_REASON, "; ".join(parts) + "; " + ADVICE, generation)


def render_pool_quota_condition(pool: str, splits: Mapping[str, TenantSplits], generation: int | None) -> dict[str, Any]:
    """The pool's QuotaSplit condition: which of its tenants (`splits` by name) leave some of its replicas without a share."""
    short: list[str] = []
    for tenant in sorted(splits):
        for field, split in splits[tenant].named():
            here = split.coverage.get(pool)
            if here is not None and split.quota > 0 and here.holding < here.replicas:
                short.append(f"tenant {tenant}: " + _describe(field, split, here, "this pool's "))
    if not short:
        return condition(CONDITION_TYPE, True, FULL_REASON, "each replica holds a share of each tenant's quotas", generation)
    named = short[:POOL_MESSAGE_TENANTS]
    more = f"; and {len(short) - len(named)} more" if len(short) > len(named) else ""
    return condition(CONDITION_TYPE, False, SHORT_REASON, "; ".join(named) + more + "; " + ADVICE, generation)
