"""Status rendering (status.py, pure): what a pool's and a tenant's status say, and which reason wins."""

from __future__ import annotations

from typing import Any

from slaq.api.tenant import PoolShare
from slaq.bench.scale_objects import pool_body, tenant_body
from slaq.operator.attainment import AttainmentLedger, Verdict
from slaq.operator.books import GatewayOutcome, PoolRecord
from slaq.operator.errors import SpecError
from slaq.operator.status import (
    at_risk_event, attainment_verdict, changed, condition_of, invalid_reported, invalid_status, no_pool_message, pool_status,
    tenant_status,
)
from slaq.operator.view import parse_pool, parse_tenant

STAMP = "2026-01-01T00:00:00Z"
UNKNOWN = Verdict("Unknown", "TooFewRequests", "0 request(s)")


def pool_of(**spec: Any) -> tuple[Any, dict[str, Any]]:
    body = pool_body(0, 1)
    body["metadata"].update(uid="u", generation=3)
    body["spec"].update(spec)
    return parse_pool(body), body


def message(status: dict[str, Any], type_: str) -> str:
    found = condition_of({"status": status}, type_)
    assert found is not None, type_
    return found["message"]


def reasons(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def deployment(ready: int, replicas: int | None = None) -> dict[str, Any]:
    return {"status": {"readyReplicas": ready, "replicas": ready if replicas is None else replicas}}


def test_a_pool_with_all_replicas_ready_and_nothing_wrong_is_ready_and_not_degraded() -> None:
    pool, body = pool_of()
    record = PoolRecord(risk=0.25)
    record.table.entries = dict.fromkeys(["b", "a"])  # type: ignore[arg-type]
    status = pool_status(pool, body, deployment(1), record, {}, observed_pods=1, timestamp=STAMP)
    assert reasons(status) == {"Ready": ("True", "AllReplicasReady"), "Degraded": ("False", "AsExpected"),
                               "QuotaSplit": ("True", "EveryReplica")}  # no tenant: no quota short of the replicas
    assert (status["observedGeneration"], status["tenants"], status["slaRisk"], status["readyReplicas"]) == (3, ["a", "b"], 0.25, 1)
    assert all(c["lastTransitionTime"] == STAMP and c["observedGeneration"] == 3 for c in status["conditions"])
    assert "slaRisk" not in pool_status(pool, body, deployment(1), PoolRecord(), {}, timestamp=STAMP)


def test_the_pool_degraded_reason_follows_its_order_of_precedence() -> None:
    pool, body = pool_of()
    record = PoolRecord(table_problem="pool x: too many", foreign=["Service inference/pool-000"], rival="HorizontalPodAutoscaler h")
    record.table.entries = dict.fromkeys(["t"])  # type: ignore[arg-type]
    problems = {"t": ("KeysMissing", "Secret k not found")}
    order, observed = [], 1
    for clear in ("table_problem", "foreign", "keys", "pods", None):
        status = pool_status(pool, body, deployment(2), record, problems, observed_pods=observed, timestamp=STAMP)
        order.append(reasons(status)["Degraded"][1])
        if clear == "table_problem":
            assert message(status, "Degraded") == "pool x: too many; the table last written stays in force"
            record.table_problem = None
        elif clear == "foreign":
            record.foreign = []
        elif clear == "keys":
            assert message(status, "Degraded") == "Secret k not found"
            problems = {}
        elif clear == "pods":
            assert message(status, "Degraded").startswith("1 of 2 ready pod(s) did not report usage")
            observed = 2
    assert order == ["TableTooLarge", "NameTaken", "TenantKeysMissing", "UsageUnavailable", "AsExpected"]
    # the rival autoscaler is named only while the pool's own autoscaling is enabled
    scaled, scaled_body = pool_of(autoscaling={"enabled": True})
    assert reasons(pool_status(scaled, scaled_body, deployment(2), record, {}, timestamp=STAMP))["Degraded"] == ("True", "ScaledByAnother")


def test_a_pool_without_ready_replicas_is_not_ready_and_its_gateway_conditions_are_shown() -> None:
    pool, body = pool_of(gateway={"inferencePool": True})
    record = PoolRecord(gateway=GatewayOutcome(False, "ApiNotServed", "install the CRDs"),
                        objectives=GatewayOutcome(True, "Applied", "objectives"))
    status = pool_status(pool, body, deployment(0), record, {}, timestamp=STAMP)
    assert reasons(status) == {"Ready": ("False", "ReplicasNotReady"), "Degraded": ("True", "GatewayApiNotServed"),
                               "GatewayInferencePool": ("False", "ApiNotServed"), "GatewayInferenceObjectives": ("True", "Applied"),
                               "QuotaSplit": ("True", "EveryReplica")}
    plain, plain_body = pool_of()  # gateway outcomes of a pool that no longer asks for one are not shown
    assert set(reasons(pool_status(plain, plain_body, deployment(1), record, {}, timestamp=STAMP))) == {"Ready", "Degraded", "QuotaSplit"}


def test_a_bound_tenant_is_ready_with_its_shares_and_key_count() -> None:
    tenant = parse_tenant(tenant_body(0, 1))
    body = {**tenant_body(0, 1), "metadata": {**tenant_body(0, 1)["metadata"], "generation": 2}}
    share = PoolShare(pool="inference/pool-000", replicas=2, requests_per_minute=300.0)
    status = tenant_status(tenant, body, shares=[share], key_count=1, key_problem=None, blocked={}, verdict=UNKNOWN,
                           attainment=None, timestamp=STAMP)
    assert reasons(status) == {"Ready": ("True", "Bound"), "Degraded": ("False", "AsExpected"), "AtRisk": ("Unknown", "TooFewRequests"),
                               "QuotaSplit": ("Unknown", "NoPool")}  # no splits given
    assert (status["keyCount"], status["pools"], status["observedGeneration"]) == (1, [share.to_wire()], 2)
    assert message(status, "Ready") == "in the tenant tables of 1 pool(s)"


def test_a_key_problem_wins_over_a_blocked_table_and_blocked_tables_are_named_in_order() -> None:
    tenant, body = parse_tenant(tenant_body(0, 1)), tenant_body(0, 1)
    blocked = {"a/one": ("TableTooLarge", "pool a/one: too many"), "b/two": ("TableTooLarge", "pool b/two: too many")}
    keys = tenant_status(tenant, body, shares=[], key_count=0, key_problem=("KeysMissing", "Secret k not found"), blocked=blocked,
                         verdict=UNKNOWN, attainment=None, timestamp=STAMP)
    assert reasons(keys)["Ready"] == ("False", "KeysMissing") and reasons(keys)["Degraded"] == ("True", "KeysMissing")
    table = tenant_status(tenant, body, shares=[], key_count=0, key_problem=None, blocked=blocked, verdict=UNKNOWN,
                          attainment=None, timestamp=STAMP)
    assert message(table, "Degraded") == ("pool a/one: too many: this tenant's entry there is not updated; "
                                                          "pool b/two: too many: this tenant's entry there is not updated")


def test_a_tenant_bound_to_no_pool_is_told_what_its_selector_lacks() -> None:
    named = parse_tenant(tenant_body(0, 1))
    status = tenant_status(named, tenant_body(0, 1), shares=[], key_count=0, key_problem=None, blocked={}, verdict=UNKNOWN,
                           attainment=None, timestamp=STAMP)
    assert reasons(status)["Ready"] == ("False", "NoPool") and "matches spec.poolSelector" in message(status, "Ready")
    empty = tenant_body(0, 1)
    empty["spec"]["poolSelector"] = {}
    assert "(none are: the chart's binding.openNamespaces)" in no_pool_message(parse_tenant(empty), frozenset())
    assert "(open-a, open-b)" in no_pool_message(parse_tenant(empty), frozenset({"open-b", "open-a"}))


def test_an_at_risk_event_is_posted_only_when_the_verdict_turns() -> None:
    risky = Verdict("True", "AttainmentBelowTarget", "90% of 50")
    fine = Verdict("False", "AttainmentMet", "99% of 50")
    was_fine = {"status": {"conditions": [{"type": "AtRisk", "status": "False"}]}}
    was_risky = {"status": {"conditions": [{"type": "AtRisk", "status": "True"}]}}
    assert at_risk_event(was_fine, risky) == ("Warning", "AttainmentBelowTarget", "90% of 50")
    assert at_risk_event(was_risky, fine) == ("Normal", "AttainmentMet", "99% of 50")
    assert at_risk_event(was_risky, risky) is None and at_risk_event({}, fine) is None


def test_a_warming_ledger_keeps_the_recorded_verdict_and_attainment() -> None:
    tenant = parse_tenant(tenant_body(0, 1))
    body = {"status": {"attainment": 0.5, "conditions": [{"type": "AtRisk", "status": "True", "reason": "R", "message": "M"}]}}
    ledger = AttainmentLedger()
    warming = attainment_verdict(tenant, body, ledger, at=1.0, min_requests=20)  # the first read: the ledger is warming up
    assert warming == (Verdict("True", "R", "M"), 0.5)
    assert attainment_verdict(tenant, {}, ledger, at=1.0, min_requests=20)[0].status == "Unknown"


def test_changed_compares_only_the_fields_written() -> None:
    body = {"status": {"a": 1, "b": [1], "other": "kept"}}
    assert not changed(body, {"a": 1, "b": [1]}) and changed(body, {"a": 2}) and changed({}, {"a": None}) is False
    assert changed({}, {"a": 0})


def test_an_invalid_spec_is_reported_once_per_generation() -> None:
    body = {"metadata": {"name": "t", "generation": 4}}
    error = SpecError("TenantSLA", "t", "spec.quotas", "must be positive")
    status = invalid_status(body, error, timestamp=STAMP)
    assert reasons(status) == {"Ready": ("False", "InvalidSpec"), "Degraded": ("True", "InvalidSpec")}
    assert message(status, "Degraded") == "fix spec.quotas: must be positive"
    assert not invalid_reported(body, error) and invalid_reported({**body, "status": status}, error)
    assert not invalid_reported({"metadata": {"name": "t", "generation": 5}, "status": status}, error)
