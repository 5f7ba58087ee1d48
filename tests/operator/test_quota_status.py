"""The QuotaSplit condition, rendered without an API server."""

from __future__ import annotations

from slaq.operator.quota_status import render_pool_quota_condition, render_quota_condition
from slaq.operator.quotas import Slot, split_quota
from slaq.operator.tables import TenantSplits

IDLE = {f"pod-{i}": 0.0 for i in range(8)}


def splits(concurrency: int | None, slots: list[Slot], rpm: int | None = 600) -> TenantSplits:
    return TenantSplits(
        requests=split_quota(rpm, slots, unit=1000, min_floor_units=1) if rpm is not None else None,
        tokens=None,
        concurrency=split_quota(concurrency, slots, min_floor_units=1) if concurrency is not None else None,
    )


def test_a_quota_below_the_replicas_is_reported_with_the_numbers() -> None:
    short = splits(4, [Slot("ns/p", 8, pods={**IDLE, **{f"pod-{i}": 5.0 + i for i in range(6)}})])
    tenant = render_quota_condition(short, 7)
    assert (tenant["type"], tenant["status"], tenant["reason"], tenant["observedGeneration"]) == ("QuotaSplit", "False", "QuotaBelowReplicas", 7)
    assert tenant["message"].startswith("maxConcurrency 4 over 8 replica(s): 4 of the 8 hold a share (4 of the 6 with demand); ")
    assert "requestsPerMinute" not in tenant["message"]  # 600,000 milli-requests cover 8 replicas
    pool = render_pool_quota_condition("ns/p", {"vip": short, "other": splits(8, [Slot("ns/p", 8, pods=IDLE)])}, 7)
    assert pool["status"] == "False" and pool["message"].startswith(
        "tenant vip: maxConcurrency 4 over 8 replica(s): 4 of this pool's 8 hold a share (4 of the 6 with demand); ")
    assert "other" not in pool["message"]


def test_every_replica_holding_a_share_is_true() -> None:
    full = splits(8, [Slot("ns/p", 8, pods=IDLE)])
    assert render_quota_condition(full, 1)["reason"] == "EveryReplica" and render_quota_condition(full, 1)["status"] == "True"
    assert render_pool_quota_condition("ns/p", {"vip": full}, 1)["status"] == "True"
    assert render_pool_quota_condition("ns/p", {}, 1)["status"] == "True"
    assert render_quota_condition(splits(None, [Slot("ns/p", 8)], rpm=None), 1)["status"] == "True"  # no quota at all
    # A quota of 0 refuses the tenant everywhere by its spec: not a split that falls short.
    assert render_quota_condition(splits(0, [Slot("ns/p", 8, pods=IDLE)]), 1)["status"] == "True"
    assert render_pool_quota_condition("ns/p", {"vip": splits(0, [Slot("ns/p", 8, pods=IDLE)])}, 1)["status"] == "True"


def test_a_tenant_bound_nowhere_is_unknown() -> None:
    assert render_quota_condition(None, 1)["reason"] == "NoPool"
    nowhere = render_quota_condition(splits(4, []), 1)
    assert (nowhere["status"], nowhere["reason"]) == ("Unknown", "NoPool")


def test_a_pool_names_a_few_short_tenants_and_counts_the_rest() -> None:
    short = {f"t{i}": splits(2, [Slot("ns/p", 8, pods=IDLE)]) for i in range(7)}
    message = render_pool_quota_condition("ns/p", short, 1)["message"]
    assert message.count("tenant t") == 5 and "; and 2 more; " in message
    # A tenant short on another pool is not this pool's business.
    elsewhere = splits(2, [Slot("ns/q", 8, pods=IDLE), Slot("ns/p", 1, pods={"p-0": 0.0})])
    assert render_pool_quota_condition("ns/p", {"vip": elsewhere}, 1)["status"] == "True"
    assert render_pool_quota_condition("ns/q", {"vip": elsewhere}, 1)["status"] == "False"
