"""The NetworkPolicy a pool owns, in the pool's namespace (pure render function).

A pool pod exposes two ports, both the sidecar's: the tenant port (the OpenAI API) and the
metrics port (/metrics and /slaq/usage, which name every tenant of the pool and its rates). The
engine listens on 127.0.0.1 and no rule names its port. The policy admits:

- the tenant port from the peers `spec.network.ingressFrom` names (the pool's gateway or
  ingress); unset, from pods of the pool's own namespace only;
- the metrics port from the monitoring namespaces the cluster admin names (the operator's
  `--monitoring-namespaces`, the chart's `networkPolicy.monitoringNamespaces`), the operator's
  own namespace (it reads /slaq/usage there), and the peers `spec.network.metricsFrom` adds;
- nothing else: once a policy selects a pod, every ingress it does not admit is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slaq.api.common import LabelSelector
from slaq.api.pool import InferencePool, NetworkPeer
from slaq.api.runtime import METRICS_PORT_NAME, SIDECAR_PORT_NAME
from slaq.operator.names import pool_labels, pool_selector_labels

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace


@dataclass(frozen=True)
class NetworkPolicySettings:
    """What the cluster admin decides for every pool's policy (operator flags, fed by the chart)."""

    operator_namespace: str = "slaq-system"  # the operator reads each pod's usage on the metrics port
    monitoring_namespaces: tuple[str, ...] = ("monitoring",)  # Prometheus scrapes the metrics port


DEFAULT_NETWORK_POLICY = NetworkPolicySettings()  # the chart's defaults: what `slaq render` shows


def _selector(selector: LabelSelector) -> dict[str, Any]:
    wire = selector.to_wire()
    return {key: value for key, value in wire.items() if value}  # {} selects everything, as the API reads it


def render_peer(peer: NetworkPeer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if peer.namespace_selector is not None:
        out["namespaceSelector"] = _selector(peer.namespace_selector)
    if peer.pod_selector is not None:
        out["podSelector"] = _selector(peer.pod_selector)
    return out


def namespace_peer(namespace: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}}


def tenant_port_peers(pool: InferencePool) -> list[dict[str, Any]]:
    """Who may reach the tenant port: `spec.network.ingressFrom`, or the pool's own namespace."""
    listed = pool.spec.network.ingress_from
    if listed is None:
        return [namespace_peer(pool.metadata.namespace or "")]
    return [render_peer(peer) for peer in listed]


def metrics_port_peers(pool: InferencePool, settings: NetworkPolicySettings) -> list[dict[str, Any]]:
    """Who may reach the metrics port: monitoring, the operator, and `spec.network.metricsFrom`."""
    namespaces = dict.fromkeys([*settings.monitoring_namespaces, settings.operator_namespace])  # ordered, no repeats
    return [*(namespace_peer(ns) for ns in namespaces), *(render_peer(peer) for peer in pool.spec.network.metrics_from)]


def render_network_policy(pool: InferencePool, settings: NetworkPolicySettings = DEFAULT_NETWORK_POLICY) -> dict[str, Any]:
    """The pool's NetworkPolicy: its pods reachable on the sidecar's two ports only, each from its own peers."""
    name = pool.metadata.name
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": pool.metadata.namespace, "labels": pool_labels(name)},
        "spec": {
            "podSelector": {"matchLabels": pool_selector_labels(name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": SIDECAR_PORT_NAME}], "from": tenant_port_peers(pool)},
                {"ports": [{"protocol": "TCP", "port": METRICS_PORT_NAME}], "from": metrics_port_peers(pool, settings)},
            ],
        },
    }
