"""Pure `render_*` functions: the objects an InferencePool owns, as plain dicts.

Owner references are added by the caller (`kopf.adopt` or `owned_by`), so these stay pure
functions of the pool spec and can be tested without any API server.
"""

from __future__ import annotations

import base64
from typing import Any

from slaq.api.pool import InferencePool
from slaq.api.runtime import SIDECAR_PORT_NAME
from slaq.api.table import TenantTable
from slaq.operator.gateway import render_gateway_inference_pool
from slaq.operator.netpol import DEFAULT_NETWORK_POLICY, NetworkPolicySettings, render_network_policy
from slaq.operator.names import pool_labels, pool_selector_labels, table_secret_name
from slaq.operator.tables import TableRenderer, split_table, table_texts
from slaq.operator.pod import ENGINE_STARTUP_FAILURES, ENGINE_STARTUP_PERIOD_SECONDS, QuotaStoreRef, render_pod_template


def _meta(pool: InferencePool, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": pool.metadata.namespace, "labels": pool_labels(pool.metadata.name)}


def render_deployment(pool: InferencePool, store: QuotaStoreRef | None = None) -> dict[str, Any]:
    name = pool.metadata.name
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(pool, name),
        "spec": {
            "replicas": pool.spec.replicas.current,
            "selector": {"matchLabels": pool_selector_labels(name)},
            # A new pod must be ready before an old one goes (needs room for one more replica):
            # a rollout never lowers serving capacity below the SLA's.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 5,
            # Longer than the engine's startup budget, so a slow model load is not a failed rollout.
            "progressDeadlineSeconds": ENGINE_STARTUP_PERIOD_SECONDS * ENGINE_STARTUP_FAILURES + 600,
            "template": render_pod_template(pool, store),
        },
    }


def render_service(pool: InferencePool) -> dict[str, Any]:
    name = pool.metadata.name
    port = pool.spec.sidecar.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool, name),
        "spec": {
            "type": "ClusterIP",
            "selector": pool_selector_labels(name),
            "ports": [{"name": SIDECAR_PORT_NAME, "port": port, "targetPort": SIDECAR_PORT_NAME,
                       "protocol": "TCP", "appProtocol": "http"}],
        },
    }


def render_pdb(pool: InferencePool) -> dict[str, Any]:
    # maxUnavailable (not minAvailable) so a one-replica pool never blocks a node drain forever.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(pool, pool.metadata.name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pool_selector_labels(pool.metadata.name)}},
    }


def milli_quantity(value: float) -> str:
    """A Kubernetes quantity for a fractional target (0.8 -> "800m")."""
    return f"{round(value * 1000)}m"


def _pods_metric(name: str, average_value: float) -> dict[str, Any]:
    return {"type": "Pods", "pods": {"metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": milli_quantity(average_value)}}}


def render_hpa(pool: InferencePool) -> dict[str, Any] | None:
    """The HPA on the per-pod `slaq_protected_load` metric, targeting the pool's scale subresource
    (docs/decisions/0025-scale-on-protected-load.md)."""
    autoscaling = pool.spec.autoscaling
    if not autoscaling.enabled:
        return None
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(pool, pool.metadata.name),
        "spec": {
            "scaleTargetRef": {"apiVersion": pool.api_version, "kind": "InferencePool", "name": pool.metadata.name},
            "minReplicas": pool.spec.replicas.min,
            "maxReplicas": pool.spec.replicas.max,
            "metrics": [_pods_metric(name, target) for name, target in (
                ("slaq_protected_load", autoscaling.target_protected_load),
                ("slaq_sla_risk", autoscaling.target_sla_risk),  # deprecated; the HPA takes the larger proposal
            ) if target is not None],
            "behavior": {
                "scaleDown": {"stabilizationWindowSeconds": autoscaling.scale_down_stabilization_seconds,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
                "scaleUp": {"stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
            },
        },
    }


def render_table_secret(pool: InferencePool, table: TenantTable, texts: dict[str, str] | None = None) -> dict[str, Any]:
    """The pool's tenant table (key hashes, never keys), mounted read-only into every sidecar, and
    its engine cut (KV shares, erase modes, salt fingerprints), the only key the engine mounts.

    One Secret per part of the table (tables.split_table), holding both keys, so both containers
    always see the same revision. `texts`: the data when the caller has already serialised it."""
    texts = texts if texts is not None else table_texts(table)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {**_meta(pool, table_secret_name(pool.metadata.name, table.part or 0)),
                     "annotations": {"slaq.dev/table-revision": table.revision}},
        "data": {key: base64.b64encode(text.encode("utf-8")).decode("ascii") for key, text in texts.items()},
    }


def render_children(pool: InferencePool, store: QuotaStoreRef | None = None,
                    network: NetworkPolicySettings | None = DEFAULT_NETWORK_POLICY) -> list[dict[str, Any]]:
    """The pool's serving objects (all but the tenant table), in the order the operator applies them:
    its NetworkPolicy first (netpol.py; `network` None: none), so no pod runs unfenced; `store`:
    the install's shared quota store, if it has one."""
    hpa = render_hpa(pool)
    fence = [render_network_policy(pool, network)] if network is not None else []
    return [*fence, render_service(pool), render_pdb(pool), render_deployment(pool, store), *([hpa] if hpa is not None else [])]


def render_pool_objects(pool: InferencePool, table: TenantTable, store: QuotaStoreRef | None = None,
                        network: NetworkPolicySettings | None = DEFAULT_NETWORK_POLICY) -> list[dict[str, Any]]:
    """Everything the operator applies for a pool: the table first (in as many Secrets as it
    takes), so pods mount it on their first start, and last the Gateway API InferencePool when
    `spec.gateway.inferencePool` asks for one (gateway.py)."""
    parts = split_table(table.pool, table.tenants, renderer=TableRenderer(table.key_hash_key))
    gateway = render_gateway_inference_pool(pool)
    return [*(render_table_secret(pool, part, texts) for part, texts in parts), *render_children(pool, store, network),
            *([gateway] if gateway is not None else [])]


def owned_by(child: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """The child with a controller owner reference to `owner` (a raw object with metadata.uid)."""
    meta = owner["metadata"]
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"],
           "controller": True, "blockOwnerDeletion": True}
    return {**child, "metadata": {**child["metadata"], "ownerReferences": [ref]}}

