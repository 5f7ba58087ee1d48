"""The operator's work, independent of kopf: read the cluster, render, apply, write status.

Handlers (handlers.py) call one method each. Every method applies the whole desired state,
so running it twice, after a restart, or after a failed attempt converges to the same objects.
Table planning and writing are serialised by one lock: every table write comes from a fresh
snapshot, and all pools' shares of a tenant come from the same one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from slaq.api.pool import InferencePool
from slaq.api.runtime import TenantUsage
from slaq.api.table import TenantTable
from slaq.api.tenant import TenantSLA
from slaq.operator.attainment import MIN_REQUESTS, AttainmentLedger, Verdict, judge
from slaq.operator.children import owned_by, render_children, render_table_secret
from slaq.operator.client import KubeClient
from slaq.operator.conditions import condition, merge_conditions, now
from slaq.operator.errors import ApiError, NotFound, OperatorError, RetryableApiError, SpecError
from slaq.operator.events import NORMAL, WARNING, render_event
from slaq.operator.gateway import GIE_API_VERSION, GIE_PLURAL, endpoint_picker_name, render_gateway_inference_pool
from slaq.operator.keys import KeyWatch
from slaq.operator.names import MANAGER, SALT_SECRET_KEY, SALT_SECRET_NAME, pool_selector_labels, selector_string
from slaq.operator.tables import TablePlan, TenantSplits, plan_tables, pool_key
from slaq.operator.usage import UsageSource, mean_sla_risk, sum_usage

log = logging.getLogger("slaq.operator")
SALT_KEY_BYTES = 32


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(object)"


def parse_pool(body: dict[str, Any]) -> InferencePool:
    """The pool as the API model; SpecError naming the first bad field."""
    try:
        return InferencePool.model_validate({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SpecError("InferencePool", _name(body), _field(first["loc"]), first["msg"]) from exc


def parse_tenant(body: dict[str, Any]) -> TenantSLA:
    """The tenant as the API model; SpecError naming the first bad field."""
    try:
        tenant = TenantSLA.model_validate({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SpecError("TenantSLA", _name(body), _field(first["loc"]), first["msg"]) from exc
    return tenant


def _name(body: dict[str, Any]) -> str:
    return (body.get("metadata") or {}).get("name", "?")


def _deleting(body: dict[str, Any]) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


def render_salt_secret(namespace: str, key: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": SALT_SECRET_NAME, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "slaq", "app.kubernetes.io/managed-by": MANAGER}},
        "data": {SALT_SECRET_KEY: base64.b64encode(key).decode("ascii")},
    }


@dataclass(frozen=True)
class GatewayOutcome:
    """What became of a pool's GIE InferencePool: the `GatewayInferencePool` condition's content."""

    ok: bool
    reason: str
    message: str


def _condition_of(body: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


class Reconciler:
    def __init__(self, api: KubeClient, usage_source: UsageSource, *, namespace: str,
                 attainment: AttainmentLedger | None = None, min_requests: int = MIN_REQUESTS,
                 clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.usage_source = usage_source
        self.namespace = namespace  # the operator's own namespace: holds the cache-salt key
        self._lock = asyncio.Lock()
        self._salt_key: bytes | None = None
        self._splits: dict[str, TenantSplits] = {}
        self._usage: dict[str, dict[str, TenantUsage]] = {}
        self._risk: dict[str, float | None] = {}
        self._observed_replicas: dict[str, int] = {}
        self._gateway: dict[str, GatewayOutcome] = {}
        self._written: dict[str, TenantTable] = {}
        self._key_problems: dict[str, str] = {}
        self._key_refs: set[tuple[str, str]] = set()
        self.keys = KeyWatch(api, self.on_key_secret_change)
        self.last_plan: TablePlan | None = None
        self.attainment = attainment or AttainmentLedger()
        self.min_requests = min_requests
        self.clock = clock  # wall clock: the sidecars' `_created` times are wall-clock times too

    # ------------------------------------------------------------------ cache-salt key

    async def ensure_salt_key(self) -> bytes:
        """The secret every cache salt derives from: read it, or create it on first start."""
        if self._salt_key is not None:
            return self._salt_key
        secret = await self.api.get("secrets", SALT_SECRET_NAME, self.namespace)
        if secret is None:
            try:
                secret = await self.api.create(render_salt_secret(self.namespace, secrets.token_bytes(SALT_KEY_BYTES)))
                log.info("created the cache-salt key Secret %s/%s", self.namespace, SALT_SECRET_NAME)
            except RetryableApiError as exc:
                if exc.status != 409:
                    raise
                secret = await self.api.get("secrets", SALT_SECRET_NAME, self.namespace)  # another start won the race
        try:
            key = base64.b64decode((secret or {}).get("data", {}).get(SALT_SECRET_KEY, ""), validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) < 16:
            raise OperatorError(f"Secret {self.namespace}/{SALT_SECRET_NAME}: data.{SALT_SECRET_KEY} must hold at least "
                                "16 random bytes; delete the Secret to have a new key generated (cache salts will change)")
        self._salt_key = key
        return key

    # ------------------------------------------------------------------ tenant tables

    async def _read_keys(self, tenants: Sequence[TenantSLA]) -> dict[str, list[str]]:
        """Key hashes from the watched Secrets (keys.py): no Secret is read per event."""
        hashes: dict[str, list[str]] = {}
        self._key_problems = {}
        refs: set[tuple[str, str]] = set()
        for tenant in tenants:
            ref = tenant.spec.api_key_secret_ref
            await self.keys.ensure(ref.namespace)
            found = self.keys.get(ref.namespace, ref.name)
            refs.add((ref.namespace, ref.name))
            if found.problem is not None:
                self._key_problems[tenant.metadata.name] = found.problem
            hashes[tenant.metadata.name] = list(found.hashes)
        self._key_refs = refs
        return hashes

    async def on_key_secret_change(self, namespace: str, name: str) -> None:
        """A watched Secret changed: when a tenant names it, its tables are rewritten now."""
        if (namespace, name) not in self._key_refs:
            return
        log.info("key Secret %s/%s changed: rewriting the tenant tables", namespace, name)
        try:
            await self.sync_tables()
        except OperatorError as exc:  # the next event or usage tick tries again
            log.warning("after key Secret %s/%s changed: %s", namespace, name, exc)

    async def _snapshot(self) -> tuple[list[tuple[InferencePool, dict[str, Any]]], list[tuple[TenantSLA, dict[str, Any]]]]:
        pools, tenants = [], []
        for body in await self.api.list("inferencepools"):
            if not _deleting(body):
                try:
                    pools.append((parse_pool(body), body))
                except SpecError as exc:
                    log.warning("skipping pool: %s", exc)
        for body in await self.api.list("tenantslas"):
            if not _deleting(body):
                try:
                    tenants.append((parse_tenant(body), body))
                except SpecError as exc:
                    log.warning("skipping tenant: %s", exc)
        return pools, tenants

    def _lowers_a_share(self, key: str, table: TenantTable) -> bool:
        old = {t.name: t.share for t in (self._written[key].tenants if key in self._written else [])}
        for entry in table.tenants:
            before = old.get(entry.name)
            if before is None:
                continue
            for field in ("requests_per_minute", "tokens_per_minute", "max_concurrency"):
                a, b = getattr(before, field), getattr(entry.share, field)
                if b is not None and (a is None or b < a):
                    return True
        return False

    async def sync_tables(self) -> TablePlan:
        """Plan every pool's tenant table from one snapshot and write them, then tenant statuses."""
        async with self._lock:
            salt_key = await self.ensure_salt_key()
            pools, tenants = await self._snapshot()
            keys = await self._read_keys([t for t, _ in tenants])
            replicas = {pool_key(p): max(p.spec.replicas.current, self._observed_replicas.get(pool_key(p), 0)) for p, _ in pools}
            live = set(replicas)
            plan = plan_tables([p for p, _ in pools], [t for t, _ in tenants], keys, salt_key, replicas,
                               {k: v for k, v in self._usage.items() if k in live}, self._splits)
            # Lowered shares are written first, so the sum in force stays within the quota while
            # raised shares wait for the next write (docs/operator.md: overshoot bound).
            ordered = sorted(pools, key=lambda pb: 0 if self._lowers_a_share(pool_key(pb[0]), plan.tables[pool_key(pb[0])]) else 1)
            for pool, body in ordered:
                key = pool_key(pool)
                table = plan.tables[key]
                if self._written.get(key) != table:
                    await self.api.apply(owned_by(render_table_secret(pool, table), body))
                    self._written[key] = table
                await self._patch_pool_tenants(body, [t.name for t in table.tenants])
            self._splits = plan.splits
            for key in set(self._written) - live:
                del self._written[key]
            for tenant, body in tenants:
                await self._write_tenant_status(tenant, body, plan, len(keys.get(tenant.metadata.name, [])))
            self.last_plan = plan
            return plan

    async def _patch_pool_tenants(self, body: dict[str, Any], names: list[str]) -> None:
        if (body.get("status") or {}).get("tenants") != names:
            meta = body["metadata"]
            await self.api.patch_status("inferencepools", meta["name"], meta["namespace"], {"tenants": names})

    async def _write_tenant_status(self, tenant: TenantSLA, body: dict[str, Any], plan: TablePlan, key_count: int) -> None:
        name, generation = tenant.metadata.name, body["metadata"].get("generation")
        pools = [share.to_wire() for share in plan.tenant_pools.get(name, [])]
        problem = self._key_problems.get(name)
        ready = bool(pools) and problem is None
        conditions = [
            condition("Ready", ready, "Bound" if ready else ("KeysMissing" if problem else "NoPool"),
                      f"in the tenant tables of {len(pools)} pool(s)" if ready else (problem or "no InferencePool selects this tenant"),
                      generation),
            condition("Degraded", problem is not None, "KeysMissing" if problem else "AsExpected", problem or "", generation),
        ]
        old = body.get("status") or {}
        verdict, attainment = self._attainment_verdict(tenant, body)
        conditions.append(condition("AtRisk", None if verdict.status == "Unknown" else verdict.at_risk,
                                    verdict.reason, verdict.message, generation))
        status = {"observedGeneration": generation, "keyCount": key_count, "pools": pools, "attainment": attainment,
                  "conditions": merge_conditions(old.get("conditions"), conditions)}
        if any(old.get(k) != v for k, v in status.items()):
            await self.api.patch_status("tenantslas", name, None, status)
        was = (_condition_of(body, "AtRisk") or {}).get("status")
        if (was == "True") != verdict.at_risk:
            await self._post_event(body, WARNING if verdict.at_risk else NORMAL, verdict.reason, verdict.message)

    def _attainment_verdict(self, tenant: TenantSLA, body: dict[str, Any]) -> tuple[Verdict, float | None]:
        """The AtRisk verdict and `status.attainment` from the ledger's window; while the ledger
        warms up with too few requests to judge, what the object records is kept."""
        at = self.clock()
        outcomes = self.attainment.outcomes(tenant.metadata.name, at)
        verdict = judge(tenant, outcomes, window_s=self.attainment.window_s, min_requests=self.min_requests,
                        warming=self.attainment.warming(at))
        if verdict.status is not None:
            return verdict, outcomes.attainment
        recorded = _condition_of(body, "AtRisk")
        kept = (Verdict(recorded["status"], recorded.get("reason", ""), recorded.get("message", "")) if recorded
                else Verdict("Unknown", verdict.reason, verdict.message))
        return kept, (body.get("status") or {}).get("attainment", outcomes.attainment)

    async def _post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event is a notice, not state: failing to post one is logged, never retried."""
        try:
            await self.api.create(render_event(body, type_=type_, reason=reason, message=message, timestamp=now()))
        except OperatorError as exc:
            log.warning("could not post the %s event for %s: %s", reason, _name(body), exc)

    # ------------------------------------------------------------------ pools

    async def report_invalid(self, plural: str, body: dict[str, Any], error: SpecError) -> None:
        """Say on the object itself why it is not served (`kubectl describe` shows it)."""
        meta = body["metadata"]
        generation = meta.get("generation")
        conditions = [condition("Ready", False, "InvalidSpec", str(error), generation),
                      condition("Degraded", True, "InvalidSpec", f"fix {error.field}: {error.message}", generation)]
        old = body.get("status") or {}
        await self.api.patch_status(plural, meta["name"], meta.get("namespace"),
                                    {"observedGeneration": generation, "conditions": merge_conditions(old.get("conditions"), conditions)})

    async def reconcile_pool(self, body: dict[str, Any]) -> None:
        """Apply the pool's children (table first, so pods mount it on their first start)."""
        try:
            pool = parse_pool(body)
        except SpecError as exc:
            await self.report_invalid("inferencepools", body, exc)
            raise
        plan = await self.sync_tables()
        children = render_children(pool)
        for child in children:
            await self.api.apply(owned_by(child, body))
        if all(child["kind"] != "HorizontalPodAutoscaler" for child in children):
            await self.api.delete("horizontalpodautoscalers", pool.metadata.name, pool.metadata.namespace)
        await self.apply_gateway_pool(pool, body)
        deployment = await self.api.get("deployments", pool.metadata.name, pool.metadata.namespace)
        await self._write_pool_status(pool, body, deployment, plan)

    async def apply_gateway_pool(self, pool: InferencePool, body: dict[str, Any]) -> None:
        """Apply (or delete) the pool's GIE InferencePool (gateway.py). A cluster that does not serve
        that API, or an object of that name the pool does not own, is reported in the pool's
        status, never raised: the pool itself keeps being served."""
        key, name, namespace = pool_key(pool), pool.metadata.name, pool.metadata.namespace
        desired = render_gateway_inference_pool(pool)
        if desired is None:
            self._gateway.pop(key, None)
            try:
                await self.api.delete(GIE_PLURAL, name, namespace)  # a 404 (none, or the API not served) is fine
            except ApiError as exc:
                if exc.status != 403:
                    raise
                # RBAC without the Inference Extension's kind (a hand-made role): a pool that does
                # not use the gateway must not fail for it.
                log.debug("not allowed to delete %s %s/%s: %s", GIE_PLURAL, namespace, name, exc)
            return
        try:
            existing = await self.api.get(GIE_PLURAL, name, namespace)
            owners = {ref.get("uid") for ref in ((existing or {}).get("metadata") or {}).get("ownerReferences") or []}
            if existing is not None and body["metadata"]["uid"] not in owners:
                self._gateway[key] = GatewayOutcome(False, "NameTaken", f"{GIE_API_VERSION} InferencePool {namespace}/{name} exists "
                                                    "and is not owned by this pool; slaq leaves it alone (delete it, or rename one)")
                return
            await self.api.apply(owned_by(desired, body))
        except NotFound:
            self._gateway[key] = GatewayOutcome(False, "ApiNotServed", f"the cluster does not serve {GIE_API_VERSION} InferencePool: "
                                                "install the Gateway API Inference Extension CRDs (docs/gateway.md); retried on every usage tick")
            return
        except ApiError as exc:
            if exc.status != 403:
                raise
            self._gateway[key] = GatewayOutcome(False, "Forbidden", f"the operator may not read or write {GIE_PLURAL}: grant it "
                                                "get, create, patch and delete (the chart's RBAC does); retried on every usage tick")
            return
        picker = pool.spec.gateway.endpoint_picker
        self._gateway[key] = GatewayOutcome(True, "Applied", f"{GIE_API_VERSION} InferencePool {name} selects this pool's pods on port "
                                            f"{pool.spec.sidecar.port}; endpoint picker Service {endpoint_picker_name(pool)}:{picker.port} "
                                            f"({picker.failure_mode.value})")

    async def observe_pool(self, body: dict[str, Any]) -> None:
        """Read usage from the pool's pods, re-split quotas, and refresh the pool's status."""
        pool = parse_pool(body)
        key = pool_key(pool)
        observations = await self.usage_source.observe(pool)
        self._usage[key] = sum_usage(observations)
        self._risk[key] = mean_sla_risk(observations)
        self.attainment.record(key, [(o.pod, o.outcomes) for o in observations], self.clock())
        if key in self._gateway and not self._gateway[key].ok:
            await self.apply_gateway_pool(pool, body)  # the CRDs may have been installed since
        deployment = await self.api.get("deployments", pool.metadata.name, pool.metadata.namespace)
        running = int(((deployment or {}).get("status") or {}).get("replicas") or 0)
        self._observed_replicas[key] = max(running, len(observations))
        plan = await self.sync_tables()
        fresh = await self.api.get("inferencepools", pool.metadata.name, pool.metadata.namespace) or body
        await self._write_pool_status(pool, fresh, deployment, plan, observed_pods=len(observations))

    def forget_pool(self, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        for book in (self._usage, self._risk, self._observed_replicas, self._written, self._gateway):
            book.pop(key, None)
        self.attainment.forget_pool(key)

    async def _write_pool_status(self, pool: InferencePool, body: dict[str, Any], deployment: dict[str, Any] | None,
                                 plan: TablePlan, observed_pods: int | None = None) -> None:
        key, generation = pool_key(pool), body["metadata"].get("generation")
        dstatus = (deployment or {}).get("status") or {}
        ready, wanted = int(dstatus.get("readyReplicas") or 0), pool.spec.replicas.current
        table = plan.tables.get(key)
        tenants = [t.name for t in table.tenants] if table else []
        missing = sorted(t for t in tenants if t in self._key_problems)
        degraded_reason, degraded_message = "AsExpected", ""
        if missing:
            degraded_reason, degraded_message = "TenantKeysMissing", "; ".join(self._key_problems[t] for t in missing)
        elif observed_pods is not None and observed_pods < ready:
            degraded_reason = "UsageUnavailable"
            degraded_message = f"{ready - observed_pods} of {ready} ready pod(s) did not report usage; their demand is not counted"
        gateway = self._gateway.get(key) if pool.spec.gateway.inference_pool else None
        if degraded_reason == "AsExpected" and gateway is not None and not gateway.ok:
            degraded_reason, degraded_message = f"Gateway{gateway.reason}", gateway.message
        conditions = [
            condition("Ready", ready >= wanted, "AllReplicasReady" if ready >= wanted else "ReplicasNotReady",
                      f"{ready}/{wanted} replicas ready", generation),
            condition("Degraded", degraded_reason != "AsExpected", degraded_reason, degraded_message, generation),
        ]
        if gateway is not None:
            conditions.append(condition("GatewayInferencePool", gateway.ok, gateway.reason, gateway.message, generation))
        old = body.get("status") or {}
        status: dict[str, Any] = {
            "observedGeneration": generation,
            "replicas": int(dstatus.get("replicas") or 0),
            "readyReplicas": ready,
            "selector": selector_string(pool_selector_labels(pool.metadata.name)),
            "tenants": tenants,
            "conditions": merge_conditions(old.get("conditions"), conditions),
        }
        if self._risk.get(key) is not None:
            status["slaRisk"] = self._risk[key]
        if any(old.get(k) != v for k, v in status.items()):
            await self.api.patch_status("inferencepools", pool.metadata.name, pool.metadata.namespace, status)

    # ------------------------------------------------------------------ tenants

    async def reconcile_tenant(self, body: dict[str, Any]) -> None:
        try:
            parse_tenant(body)
        except SpecError as exc:
            await self.report_invalid("tenantslas", body, exc)
            raise
        await self.sync_tables()

    async def forget_tenant(self, body: dict[str, Any]) -> None:
        """Remove a deleted tenant from every table (it is excluded: it carries a deletionTimestamp)."""
        await self.sync_tables()
        self._splits.pop(_name(body), None)
