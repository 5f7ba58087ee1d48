"""Binding both sides agree on (tables.binding): the tenant's owner names the pool or its namespace,
and the pool's namespace is open to every tenant or the pool's owner lists the tenant."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from slaq.api.pool import InferencePool
from slaq.api.runtime import TENANT_TABLE_KEY
from slaq.api.tenant import TenantSLA
from slaq.bench.scale_objects import pool_body, tenant_body, tenant_name
from slaq.operator.books import PoolRecord
from slaq.operator.status import no_pool_message, pool_status
from slaq.operator.tables import Refusal, binding, plan_tenant, pool_key
from tests.operator.planning import SALT_KEY, Harness

SHARED = {"slaq.dev/tenancy": "shared"}


def tenant(name: str = "vip", *, pools: list[dict[str, str]] | None = None, selector: dict[str, str] | None = None) -> TenantSLA:
    body = tenant_body(0, 1)
    body["metadata"]["name"] = name
    body["spec"]["poolSelector"] = {"matchLabels": SHARED if selector is None else selector}
    if pools is not None:
        body["spec"]["pools"] = pools
    return TenantSLA.model_validate(body)


def pool(namespace: str = "inference", name: str = "llama", *, tenants: list[str] | None = None,
         labels: dict[str, str] | None = None) -> InferencePool:
    body = pool_body(0, 1)
    body["metadata"].update(name=name, namespace=namespace, labels=SHARED if labels is None else labels)
    if tenants is not None:
        body["spec"]["tenants"] = tenants
    return InferencePool.model_validate(body)


OPEN = frozenset({"inference"})
VIP_HASH = "hmac-sha256:" + "a" * 64
NAMES_INFERENCE = [{"namespace": "inference"}]


@pytest.mark.parametrize("the_tenant, the_pool, opened", [
    (tenant(pools=NAMES_INFERENCE), pool(tenants=["vip"]), frozenset()),  # both owners agree
    (tenant(pools=NAMES_INFERENCE), pool(), OPEN),  # the tenant names it, the admin opened the namespace
    (tenant(pools=[{"namespace": "inference", "name": "llama"}]), pool(tenants=["vip"]), frozenset()),  # named by name
    (tenant(), pool(), OPEN),  # naming none: served in the open namespaces
    (tenant(selector={}), pool(labels={}), OPEN),  # no selector either (the chart's binding.openNamespaces as before)
], ids=["tenant-names-namespace-pool-lists", "tenant-names-namespace-open", "tenant-names-pool-pool-lists",
        "tenant-names-none-open", "empty-selector-open"])
def test_both_sides_agreeing_binds(the_tenant: TenantSLA, the_pool: InferencePool, opened: frozenset[str]) -> None:
    assert binding(the_tenant, the_pool, opened) is True


@pytest.mark.parametrize("the_tenant, the_pool, opened, rule", [
    # A pool created elsewhere with the tenant's labels: the hole this rule closes.
    (tenant(), pool("team-x"), frozenset(), "NamespaceNotOpen"),
    (tenant(), pool("team-x"), OPEN, "NamespaceNotOpen"),
    (tenant(pools=NAMES_INFERENCE), pool("team-x"), OPEN, "NotNamedByTenant"),
    # The pool's owner listing the tenant is not the tenant's consent.
    (tenant(pools=NAMES_INFERENCE), pool("team-x", tenants=["vip"]), frozenset(), "NotNamedByTenant"),
    (tenant(), pool("team-x", tenants=["vip"]), frozenset(), "NamespaceNotOpen"),
    (tenant(selector={}), pool("team-x", tenants=["vip"]), frozenset(), "NamespaceNotOpen"),
    # The tenant's consent is not the pool side's: a namespace not open needs the pool's list.
    (tenant(pools=NAMES_INFERENCE), pool(), frozenset(), "NotAccepted"),
    (tenant(pools=NAMES_INFERENCE), pool(tenants=["standard"]), frozenset(), "NotAccepted"),
    # Named by name: its neighbour in the namespace is not named.
    (tenant(pools=[{"namespace": "inference", "name": "llama"}]), pool(name="mistral", tenants=["vip"]), OPEN, "NotNamedByTenant"),
], ids=["labelled-foreign", "labelled-foreign-other-open", "labelled-not-named", "listed-not-named", "listed-names-none",
        "listed-empty-selector", "named-not-accepted", "named-other-listed", "neighbour-not-named"])
def test_a_one_sided_claim_is_refused_by_the_rule_named(the_tenant: TenantSLA, the_pool: InferencePool, opened: frozenset[str],
                                                         rule: str) -> None:
    verdict = binding(the_tenant, the_pool, opened)
    assert isinstance(verdict, Refusal) and verdict.rule == rule, verdict
    assert "vip" in verdict.message


def test_pools_nobody_claims_are_not_refusals() -> None:
    assert binding(tenant(), pool("team-x", labels={"other": "label"}), frozenset()) is False  # the tenant's selector leaves it out
    assert binding(tenant(selector={}), pool("team-x"), frozenset()) is False  # an empty selector is no claim
    assert binding(tenant(pools=NAMES_INFERENCE, selector={}), pool("team-x"), frozenset()) is False
    narrowed = pool(tenants=["vip"])
    narrowed.spec.tenant_selector.match_labels = {"team": "a"}
    assert binding(tenant(pools=NAMES_INFERENCE), narrowed, frozenset()) is False  # the pool's tenantSelector leaves it out


def test_a_refused_pool_gets_no_entry_no_hash_no_salt_and_says_why() -> None:
    ours, foreign = pool(tenants=["vip"]), pool("team-x", "copycat", tenants=["vip"])
    plan = plan_tenant(tenant(pools=NAMES_INFERENCE), [ours, foreign], [VIP_HASH], SALT_KEY,
                       {pool_key(ours): 1, pool_key(foreign): 1}, {})
    assert set(plan.entries) == {"inference/llama"}  # positive control: the agreed pool gets the hashes
    assert plan.entries["inference/llama"].key_hashes == [VIP_HASH]
    assert [share.pool for share in plan.pools] == ["inference/llama"]
    assert set(plan.refused) == {"team-x/copycat"} and plan.refused["team-x/copycat"].rule == "NotNamedByTenant"
    # Without a named namespace, the quota is not split over the copycat either: the whole of it stays here.
    assert plan.entries["inference/llama"].share.requests_per_minute == 600


def status_of(the_pool: InferencePool, record: PoolRecord) -> dict[str, Any]:
    body = {"metadata": {"generation": 1}, "status": {}}
    return pool_status(the_pool, body, None, record, {}, timestamp="2026-01-01T00:00:00Z")


def test_the_pools_status_names_each_refused_tenant_and_rule_and_says_nothing_when_none_is() -> None:
    copycat, record = pool("team-x", "copycat"), PoolRecord()
    assert "TenantsRefused" not in {c["type"] for c in status_of(copycat, record)["conditions"]}
    record.table.refused = {"vip": Refusal("NamespaceNotOpen", "TenantSLA vip names no pools ..."),
                            "free": Refusal("NotNamedByTenant", "TenantSLA free names ...")}
    (refused,) = [c for c in status_of(copycat, record)["conditions"] if c["type"] == "TenantsRefused"]
    assert refused["status"] == "True" and refused["reason"] == "NamespaceNotOpen,NotNamedByTenant"
    assert refused["message"].startswith("free: NotNamedByTenant: TenantSLA free names") and "vip: NamespaceNotOpen:" in refused["message"]


def test_the_tenants_no_pool_message_names_the_pools_that_refused_it() -> None:
    refused = {"team-x/copycat": Refusal("NotAccepted", "namespace team-x is not open")}
    message = no_pool_message(tenant(pools=[{"namespace": "team-x"}]), frozenset(), refused)
    assert "refused by team-x/copycat (NotAccepted: namespace team-x is not open)" in message


def copycat_table(harness: Harness) -> list[str]:
    """The tenants in the table Secret written for team-x/copycat."""
    secret = harness.api.objects[("secrets", "team-x", "copycat-tenants")]
    return [t["name"] for t in json.loads(base64.b64decode(secret["data"][TENANT_TABLE_KEY]))["tenants"]]


async def test_the_planner_records_refusals_on_the_pool_and_drops_them_once_both_agree() -> None:
    harness = Harness(pools=1, tenants=1, models=1)  # pool-000 in the open namespace, tenant-00000 naming none
    copycat = pool_body(0, 1)
    copycat["metadata"].update(name="copycat", namespace="team-x")
    harness.put_pool(copycat)
    await harness.refresh(everything=True)
    name = tenant_name(0)
    assert set(harness.books.pools.entries("inference/pool-000")) == {name}
    assert harness.books.pools.entries("team-x/copycat") == {}
    assert harness.books.pools.table("team-x/copycat").refused[name].rule == "NamespaceNotOpen"
    assert copycat_table(harness) == []  # its table Secret holds nobody
    # The tenant's owner names team-x, and the copycat's owner lists the tenant: both agree.
    body = tenant_body(0, 1)
    body["spec"]["pools"] = [{"namespace": "inference"}, {"namespace": "team-x"}]
    harness.put_tenant(body)
    copycat["spec"]["tenants"] = [name]
    harness.put_pool(copycat)
    await harness.refresh(tenants=[name], pools=["team-x/copycat"])
    assert set(harness.books.pools.entries("team-x/copycat")) == {name}
    assert harness.books.pools.table("team-x/copycat").refused == {}
    assert copycat_table(harness) == [name]  # written: the key hashes reach it now
