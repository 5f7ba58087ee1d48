"""A pool's children (children.py) and gateway objects (gateway.py), applied where the pool owns
them (writer.py), with what became of them recorded on the pool's record (books.py) for its status.
"""

from __future__ import annotations

import logging
from typing import Any

from slaq.api.common import GROUP, Tier
from slaq.api.pool import InferencePool
from slaq.operator.books import GatewayOutcome, PoolBook
from slaq.operator.children import owned_by, render_children
from slaq.operator.client import KubeClient
from slaq.operator.errors import ApiError, NotFound
from slaq.operator.netpol import NetworkPolicySettings
from slaq.operator.pod import QuotaStoreRef
from slaq.operator.gateway import (
    GIE_API_VERSION, GIE_PLURAL, OBJECTIVE_API_VERSION, OBJECTIVE_HEADER, OBJECTIVE_PLURAL, endpoint_picker_name,
    objective_name, render_gateway_inference_pool, render_inference_objectives,
)
from slaq.operator.tables import pool_key
from slaq.operator.writer import Writer

log = logging.getLogger("slaq.operator")


class PoolObjects:
    def __init__(self, api: KubeClient, pools: PoolBook, writer: Writer, quota_store: QuotaStoreRef | None = None,
                 network: NetworkPolicySettings | None = None) -> None:
        self.api = api
        self.quota_store = quota_store
        self.network = network  # every pool's NetworkPolicy (netpol.py); None: the operator renders none
        self.pools = pools
        self.writer = writer

    async def apply_children(self, pool: InferencePool, body: dict[str, Any]) -> None:
        """The pool's children; its HPA only while no other autoscaler scales the pool (one owner of
        the replicas: two HPAs on one scale subresource undo each other's decisions)."""
        children = render_children(pool, self.quota_store, self.network)
        rival = await self.rival_autoscaler(pool, body) if pool.spec.autoscaling.enabled else None
        self.pools.record(pool_key(pool)).rival = rival
        if rival is not None:
            children = [child for child in children if child["kind"] != "HorizontalPodAutoscaler"]
        foreign = []
        for child in children:
            if not await self.writer.apply_owned(child, body):
                foreign.append(f"{child['kind']} {pool.metadata.namespace}/{child['metadata']['name']}")
        record = self.pools.record(pool_key(pool))
        tables = [name for name in record.foreign if name.startswith("Secret ")]  # found by Writer.write_table
        record.foreign = foreign + tables
        if all(child["kind"] != "HorizontalPodAutoscaler" for child in children):
            await self.writer.delete_owned("horizontalpodautoscalers", pool.metadata.name, pool.metadata.namespace, body)

    async def rival_autoscaler(self, pool: InferencePool, body: dict[str, Any]) -> str | None:
        """Another HPA on the pool's scale subresource (KEDA's ScaledObject drives one named
        keda-hpa-<scaledobject>), described for the pool's status; None when there is none."""
        try:
            hpas = await self.api.list("horizontalpodautoscalers", pool.metadata.namespace)
        except ApiError as exc:
            if exc.status != 403:
                raise
            # A hand-made role without `list` on HPAs: the pool keeps its HPA, unchecked.
            log.debug("not allowed to list horizontalpodautoscalers in %s: %s", pool.metadata.namespace, exc)
            return None
        for hpa in hpas:
            target = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
            meta = hpa.get("metadata") or {}
            owners = meta.get("ownerReferences") or []
            if (target.get("kind") == "InferencePool" and str(target.get("apiVersion", "")).startswith(f"{GROUP}/")
                    and target.get("name") == pool.metadata.name and body["metadata"]["uid"] not in {o.get("uid") for o in owners}):
                made_by = next((f" (made by {o.get('kind')} {o.get('name')})" for o in owners if o.get("controller")), "")
                return f"HorizontalPodAutoscaler {pool.metadata.namespace}/{meta.get('name')}{made_by}"
        return None

    async def apply_gateway_pool(self, pool: InferencePool, body: dict[str, Any]) -> None:
        """Apply (or delete) the pool's GIE InferencePool (gateway.py). A cluster that does not serve
        that API, or an object of that name the pool does not own, is reported in the pool's
        status, never raised: the pool itself keeps being served."""
        key, name, namespace = pool_key(pool), pool.metadata.name, pool.metadata.namespace
        desired = render_gateway_inference_pool(pool)
        if desired is None:
            if (found := self.pools.get(key)) is not None:
                found.gateway = found.objectives = None
            await self._delete_gateway_object(GIE_PLURAL, name, namespace, body)
            for tier in Tier:
                await self._delete_gateway_object(OBJECTIVE_PLURAL, objective_name(name, tier), namespace, body)
            return
        try:
            existing = await self.api.get(GIE_PLURAL, name, namespace)
            owners = {ref.get("uid") for ref in ((existing or {}).get("metadata") or {}).get("ownerReferences") or []}
            if existing is not None and body["metadata"]["uid"] not in owners:
                self.pools.record(key).gateway = GatewayOutcome(
                    False, "NameTaken", f"{GIE_API_VERSION} InferencePool {namespace}/{name} exists "
                    "and is not owned by this pool; slaq leaves it alone (delete it, or rename one)")
                return
            await self.api.apply(owned_by(desired, body))
        except NotFound:
            self.pools.record(key).gateway = GatewayOutcome(
                False, "ApiNotServed", f"the cluster does not serve {GIE_API_VERSION} InferencePool: "
                "install the Gateway API Inference Extension CRDs (docs/gateway.md); retried on every usage tick")
            return
        except ApiError as exc:
            if exc.status != 403:
                raise
            self.pools.record(key).gateway = GatewayOutcome(
                False, "Forbidden", f"the operator may not read or write {GIE_PLURAL}: grant it "
                "get, create, patch and delete (the chart's RBAC does); retried on every usage tick")
            return
        picker = pool.spec.gateway.endpoint_picker
        self.pools.record(key).gateway = GatewayOutcome(
            True, "Applied", f"{GIE_API_VERSION} InferencePool {name} selects this pool's pods on port "
            f"{pool.spec.sidecar.port}; endpoint picker Service {endpoint_picker_name(pool)}:{picker.port} "
            f"({picker.failure_mode.value}). Tenant quotas are shared evenly over the pool's replicas, "
            "so routing a tenant unevenly gets 429s from its busy replica first (docs/gateway.md)")
        objectives = await self._apply_objectives(pool, body)
        self.pools.record(key).objectives = objectives

    async def _apply_objectives(self, pool: InferencePool, body: dict[str, Any]) -> GatewayOutcome:
        """The pool's llm-d InferenceObjectives (one per tier). Optional beside the InferencePool: a
        cluster without llm-d's CRDs is reported in the condition, not as Degraded."""
        objectives = render_inference_objectives(pool)
        taken = []
        try:
            for objective in objectives:
                if not await self.writer.apply_owned(objective, body):
                    taken.append(objective["metadata"]["name"])
        except NotFound:
            return GatewayOutcome(False, "ApiNotServed", f"the cluster does not serve {OBJECTIVE_API_VERSION} InferenceObjective: install the "
                                  "llm-d router's CRDs to order requests by tier at the gateway (docs/gateway.md); retried on every usage tick")
        except ApiError as exc:
            if exc.status != 403:
                raise
            return GatewayOutcome(False, "Forbidden", f"the operator may not write {OBJECTIVE_PLURAL}: grant it create, patch and delete "
                                  "(the chart's RBAC does); retried on every usage tick")
        if taken:
            return GatewayOutcome(False, "NameTaken", f"{OBJECTIVE_API_VERSION} InferenceObjective {', '.join(taken)} in "
                                  f"{pool.metadata.namespace} exist and are not owned by this pool; slaq leaves them alone "
                                  "(delete them, or rename the pool)")
        priorities = ", ".join(f"{o['metadata']['name']} ({o['spec']['priority']})" for o in objectives)
        return GatewayOutcome(True, "Applied", f"{OBJECTIVE_API_VERSION} InferenceObjectives {priorities}; a request names one in "
                              f"the {OBJECTIVE_HEADER} header")

    async def _delete_gateway_object(self, plural: str, name: str, namespace: str, owner: dict[str, Any]) -> None:
        """Delete a gateway object the pool no longer wants, only if it is the pool's (a foreign one of
        that name stays; none, or the API not served, is fine)."""
        try:
            await self.writer.delete_owned(plural, name, namespace, owner)
        except ApiError as exc:
            if exc.status != 403:
                raise
            # RBAC without the gateway's kinds (a hand-made role): a pool that does not use the
            # gateway must not fail for it.
            log.debug("not allowed to delete %s %s/%s: %s", plural, namespace, name, exc)
