"""The status the operator writes on pools and tenants, rendered (pure functions).

Each function returns the whole `status` it wants; `changed` says whether the object's status
differs (the writer patches only then). Conditions keep their `lastTransitionTime` through
merge_conditions; `timestamp` (default: now) stamps the ones that moved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slaq.api.pool import InferencePool
from slaq.api.tenant import PoolShare, TenantSLA
from slaq.operator.attainment import AttainmentLedger, Verdict, judge
from slaq.operator.books import KeyProblem, PoolRecord
from slaq.operator.conditions import condition, merge_conditions
from slaq.operator.errors import SpecError
from slaq.operator.events import NORMAL, WARNING
from slaq.operator.names import pool_selector_labels, selector_string
from slaq.operator.quota_status import render_pool_quota_condition, render_quota_condition
from slaq.operator.tables import Refusal, TenantSplits, pool_key
from slaq.operator.usage import CARRY_READS

Event = tuple[str, str, str]  # (type, reason, message)


def condition_of(body: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


def changed(body: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether writing `status` would change the object's."""
    old = body.get("status") or {}
    return any(old.get(k) != v for k, v in status.items())


def invalid_status(body: Mapping[str, Any], error: SpecError, timestamp: str | None = None) -> dict[str, Any]:
    """Why the object is not served, on the object itself (`kubectl describe` shows it)."""
    generation = body["metadata"].get("generation")
    conditions = [condition("Ready", False, "InvalidSpec", str(error), generation),
                  condition("Degraded", True, "InvalidSpec", f"fix {error.field}: {error.message}", generation)]
    old = body.get("status") or {}
    return {"observedGeneration": generation, "conditions": merge_conditions(old.get("conditions"), conditions, timestamp)}


def invalid_reported(body: Mapping[str, Any], error: SpecError) -> bool:
    """Whether the object's status already says this error, for its current generation."""
    ready = condition_of(body, "Ready") or {}
    return (ready.get("reason") == "InvalidSpec" and ready.get("message") == str(error)
            and (body.get("status") or {}).get("observedGeneration") == (body.get("metadata") or {}).get("generation"))


def no_pool_message(tenant: TenantSLA, open_namespaces: frozenset[str], refused: Mapping[str, Refusal] | None = None) -> str:
    """Why no pool serves the tenant; `refused`: by pool key, the pools that claim it (or it names) and were refused."""
    why = "; refused by " + "; ".join(f"{key} ({r.rule}: {r.message})" for key, r in sorted(refused.items())) if refused else ""
    selector = tenant.spec.pool_selector
    if tenant.spec.pools or selector.match_labels or selector.match_expressions:
        return "no InferencePool matches spec.poolSelector (and selects this tenant) and agrees to serve it" + why
    opened = ", ".join(sorted(open_namespaces))
    return ("spec.poolSelector is empty: it binds only pools in the namespaces open to every tenant"
            + (f" ({opened})" if opened else " (none are: the chart's binding.openNamespaces)") + "; name the pools to use" + why)


def attainment_verdict(tenant: TenantSLA, body: Mapping[str, Any], ledger: AttainmentLedger, at: float,
                       min_requests: int) -> tuple[Verdict, float | None]:
    """The AtRisk verdict and `status.attainment` from the ledger's window at `at`; while the
    ledger warms up with too few requests to judge, what the object records is kept."""
    outcomes = ledger.outcomes(tenant.metadata.name, at)
    verdict = judge(tenant, outcomes, window_s=ledger.window_s, min_requests=min_requests, warming=ledger.warming(at))
    if verdict.status is not None:
        return verdict, outcomes.attainment
    recorded = condition_of(body, "AtRisk")
    kept = (Verdict(recorded["status"], recorded.get("reason", ""), recorded.get("message", "")) if recorded
            else Verdict("Unknown", verdict.reason, verdict.message))
    return kept, (body.get("status") or {}).get("attainment", outcomes.attainment)


def tenant_status(tenant: TenantSLA, body: Mapping[str, Any], *, shares: Sequence[PoolShare], key_count: int,
                  key_problem: KeyProblem | None, blocked: Mapping[str, tuple[str, str]], verdict: Verdict, attainment: float | None,
                  open_namespaces: frozenset[str] = frozenset(), splits: TenantSplits | None = None,
                  refused: Mapping[str, Refusal] | None = None, timestamp: str | None = None) -> dict[str, Any]:
    """A tenant's status: its shares per pool, its key count, and Ready / Degraded / AtRisk / QuotaSplit.
    `blocked`: by pool key, why (reason, message) that pool's table (which holds no current entry of the tenant) is not written."""
    generation = body["metadata"].get("generation")
    pools = [share.to_wire() for share in shares]
    problem = key_problem
    if problem is None and blocked:
        problem = (next(iter(blocked.values()))[0],
                   "; ".join(f"{why}: this tenant's entry there is not updated" for _, why in blocked.values()))
    ready = bool(pools) and problem is None
    conditions = [
        condition("Ready", ready, "Bound" if ready else (problem[0] if problem else "NoPool"),
                  f"in the tenant tables of {len(pools)} pool(s)" if ready else (problem[1] if problem else no_pool_message(tenant, open_namespaces, refused)),
                  generation),
        condition("Degraded", problem is not None, problem[0] if problem else "AsExpected", problem[1] if problem else "", generation),
        condition("AtRisk", None if verdict.status == "Unknown" else verdict.at_risk, verdict.reason, verdict.message, generation),
        render_quota_condition(splits, generation),
    ]
    old = body.get("status") or {}
    return {"observedGeneration": generation, "keyCount": key_count, "pools": pools, "attainment": attainment,
            "conditions": merge_conditions(old.get("conditions"), conditions, timestamp)}


def at_risk_event(body: Mapping[str, Any], verdict: Verdict) -> Event | None:
    """The Event to post when the tenant's AtRisk turns True, or back."""
    was = (condition_of(body, "AtRisk") or {}).get("status")
    if (was == "True") == verdict.at_risk:
        return None
    return (WARNING if verdict.at_risk else NORMAL, verdict.reason, verdict.message)


def pool_status(pool: InferencePool, body: Mapping[str, Any], deployment: Mapping[str, Any] | None, record: PoolRecord | None,
                key_problems: Mapping[str, KeyProblem], observed_pods: int | None = None,
                splits: Mapping[str, TenantSplits] | None = None, timestamp: str | None = None) -> dict[str, Any]:
    """A pool's status: replicas, the tenants its table holds, Ready / Degraded and the gateway's
    conditions. `record`: what the operator knows of the pool; `key_problems`: of its tenants."""
    record = record if record is not None else PoolRecord()
    generation = body["metadata"].get("generation")
    dstatus = (deployment or {}).get("status") or {}
    ready, wanted = int(dstatus.get("readyReplicas") or 0), pool.spec.replicas.current
    tenants = sorted(record.table.entries)
    missing = sorted(t for t in tenants if t in key_problems)
    degraded_reason, degraded_message = "AsExpected", ""
    if record.table_problem is not None:
        degraded_reason, degraded_message = record.table_problem_reason, record.table_problem
        if degraded_reason == "TableTooLarge":
            degraded_message += "; the table last written stays in force"
    elif record.foreign:
        degraded_reason = "NameTaken"
        degraded_message = (f"{', '.join(record.foreign)} exist(s) and are not owned by this pool; slaq leaves them alone "
                            "(delete them, or rename the pool)")
    elif missing:
        degraded_reason, degraded_message = "TenantKeysMissing", "; ".join(key_problems[t][1] for t in missing)
    elif observed_pods is not None and observed_pods < ready:
        degraded_reason = "UsageUnavailable"
        degraded_message = (f"{ready - observed_pods} of {ready} ready pod(s) did not report usage; the demand of their last "
                            f"report counts for {CARRY_READS} reads, then none")
    rival = record.rival if pool.spec.autoscaling.enabled else None
    if degraded_reason == "AsExpected" and rival is not None:
        degraded_reason = "ScaledByAnother"
        degraded_message = (f"{rival} also scales this pool, so the operator leaves its own HPA out: one autoscaler owns the "
                            "replicas. Set spec.autoscaling.enabled false, or remove the pool from that autoscaler "
                            "(the chart's autoscaling.keda.pools)")
    gateway = record.gateway if pool.spec.gateway.inference_pool else None
    if degraded_reason == "AsExpected" and gateway is not None and not gateway.ok:
        degraded_reason, degraded_message = f"Gateway{gateway.reason}", gateway.message
    conditions = [
        condition("Ready", ready >= wanted, "AllReplicasReady" if ready >= wanted else "ReplicasNotReady",
                  f"{ready}/{wanted} replicas ready", generation),
        condition("Degraded", degraded_reason != "AsExpected", degraded_reason, degraded_message, generation),
        render_pool_quota_condition(pool_key(pool), splits or {}, generation),
    ]
    if record.table.refused:  # only while some tenant is refused: `kubectl describe` says which, and by which rule
        refused = sorted(record.table.refused.items())
        conditions.append(condition("TenantsRefused", True, ",".join(sorted({r.rule for _, r in refused})),
                                    "; ".join(f"{name}: {r.rule}: {r.message}" for name, r in refused), generation))
    if gateway is not None:
        conditions.append(condition("GatewayInferencePool", gateway.ok, gateway.reason, gateway.message, generation))
    objectives = record.objectives if pool.spec.gateway.inference_pool else None
    if objectives is not None:
        conditions.append(condition("GatewayInferenceObjectives", objectives.ok, objectives.reason, objectives.message, generation))
    old = body.get("status") or {}
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "replicas": int(dstatus.get("replicas") or 0),
        "readyReplicas": ready,
        "selector": selector_string(pool_selector_labels(pool.metadata.name)),
        "tenants": tenants,
        "conditions": merge_conditions(old.get("conditions"), conditions, timestamp),
    }
    if record.risk is not None:
        status["slaRisk"] = record.risk
    return status
