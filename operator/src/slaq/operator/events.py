"""Kubernetes Events the operator posts (core/v1, what `kubectl describe` and `kubectl events` show).

Pure rendering; the reconciler creates them through its client. Events of a cluster-scoped
object (a TenantSLA) live in the `default` namespace, as kubectl and kopf expect.
"""

from __future__ import annotations

from typing import Any

from slaq.operator.names import MANAGER

CLUSTER_SCOPED_EVENT_NAMESPACE = "default"
NORMAL, WARNING = "Normal", "Warning"


def render_event(involved: dict[str, Any], *, type_: str, reason: str, message: str, timestamp: str) -> dict[str, Any]:
    """One Event about `involved` (a raw object with apiVersion, kind and metadata.uid)."""
    meta = involved["metadata"]
    ref = {"apiVersion": involved["apiVersion"], "kind": involved["kind"], "name": meta["name"], "uid": meta["uid"]}
    if meta.get("namespace"):
        ref["namespace"] = meta["namespace"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace") or CLUSTER_SCOPED_EVENT_NAMESPACE,
                     "labels": {"app.kubernetes.io/managed-by": MANAGER}},
        "involvedObject": ref,
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "firstTimestamp": timestamp,
        "lastTimestamp": timestamp,
        "count": 1,
        "source": {"component": MANAGER},
        "reportingComponent": MANAGER,
        "reportingInstance": MANAGER,
    }
