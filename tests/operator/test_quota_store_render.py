"""The shared quota store from the operator's side: every table entry carries the tenant's whole
quota, and `--quota-store` reaches every sidecar (with its password from a Secret, never in args)."""

from __future__ import annotations

from pathlib import Path

import yaml

from slaq.api.pool import InferencePool
from slaq.api.runtime import QUOTA_STORE_PASSWORD_ENV
from slaq.api.table import ClusterQuota
from slaq.api.tenant import TenantSLA
from slaq.operator.children import render_deployment
from tests.support.images import TEST_IMAGES
from slaq.operator.pod import QuotaStoreRef
from slaq.operator.tables import plan_tables
from tests.helm.chart import named, render

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"


def _pool() -> InferencePool:
    return TEST_IMAGES.resolve(InferencePool.model_validate(yaml.safe_load((EXAMPLES / "pool-cpu.yaml").read_text())))


def _sidecar(store: QuotaStoreRef | None) -> dict:
    containers = render_deployment(_pool(), store)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["args"][0] == "sidecar")


def test_every_entry_carries_the_tenants_whole_quota_beside_its_share() -> None:
    tenants = [TenantSLA.model_validate(d) for d in yaml.safe_load_all((EXAMPLES / "tenants.yaml").read_text()) if d]
    plan = plan_tables([_pool()], tenants, {}, b"k" * 32, {"default/tiny-cpu": 2}, {})
    for entry in plan.tables["default/tiny-cpu"].tenants:
        quotas = next(t.spec.quotas for t in tenants if t.metadata.name == entry.name)
        assert entry.quota == ClusterQuota(requests_per_minute=quotas.requests_per_minute, tokens_per_minute=quotas.tokens_per_minute,
                                           max_concurrency=quotas.max_concurrency)
        if quotas.requests_per_minute is not None:  # two replicas: the share is at most half of it
            assert entry.share.requests_per_minute <= quotas.requests_per_minute / 2


def test_the_sidecar_gets_the_store_and_its_password_from_a_secret() -> None:
    plain = _sidecar(None)
    assert "--quota-store" not in plain["args"] and all(e["name"] != QUOTA_STORE_PASSWORD_ENV for e in plain["env"])
    sidecar = _sidecar(QuotaStoreRef("redis://redis.cache:6379/0", password_secret="redis-auth", password_key="pw"))
    args = sidecar["args"]
    assert args[args.index("--quota-store") + 1] == "redis://redis.cache:6379/0"
    assert {"name": QUOTA_STORE_PASSWORD_ENV, "valueFrom": {"secretKeyRef": {"name": "redis-auth", "key": "pw"}}} in sidecar["env"]
    from slaq.cli import build_parser

    parsed = build_parser().parse_args(args)  # `slaq sidecar` accepts what the operator renders
    assert parsed.quota_store == "redis://redis.cache:6379/0"


def test_the_chart_hands_the_store_to_the_operator_and_the_operator_cli_reads_it() -> None:
    from slaq.cli import build_parser
    from slaq.operator.cli import _quota_store

    def operator_args(values: dict | None) -> list[str]:
        return named(render(values), "Deployment", "slaq-operator")["spec"]["template"]["spec"]["containers"][0]["args"]

    assert not any(a.startswith("--quota-store") for a in operator_args(None))  # off by default: local shares
    parsed = build_parser().parse_args(operator_args({"quotaStore": {"redis": {"url": "redis://redis.cache:6379/0",
                                                                                 "passwordSecret": {"name": "redis-auth"}}}}))
    assert _quota_store(parsed.quota_store, parsed.quota_store_password_secret) == QuotaStoreRef(
        "redis://redis.cache:6379/0", password_secret="redis-auth", password_key="password")
