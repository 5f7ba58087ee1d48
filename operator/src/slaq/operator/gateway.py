"""The Gateway API Inference Extension's InferencePool over a slaq pool's pods (pure rendering).

With `spec.gateway.inferencePool: true`, a slaq InferencePool (slaq.dev) also owns an
`inference.networking.k8s.io/v1` InferencePool of the same name and namespace: it selects the
pool's pods by the same labels as the Deployment and targets the sidecar's tenant port, so a GIE
gateway's endpoint picker spreads requests across replicas while slaq orders them inside each
pod. The picker scrapes each pod's metrics port (`vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`). The two kinds share a name; `kubectl get inferencepools.slaq.dev`
(short name `ipool`) and `kubectl get inferencepools.inference.networking.k8s.io` tell them apart.

Beside it the pool owns one llm-d router `llm-d.ai/v1alpha2` InferenceObjective per tier,
`<pool>-critical`, `<pool>-standard` and `<pool>-batch`, whose `priority` orders requests in the
router's flow control when the pool is saturated; a request names its objective in the
`x-llm-d-inference-objective` header. A request without one has priority 0 there, as standard's
objective does here: slaq treats a request without its tier as standard too.
"""

from __future__ import annotations

from typing import Any

from slaq.api.common import Tier
from slaq.api.pool import InferencePool
from slaq.operator.names import pool_labels, pool_selector_labels

GIE_GROUP = "inference.networking.k8s.io"
GIE_VERSION = "v1"
GIE_API_VERSION = f"{GIE_GROUP}/{GIE_VERSION}"
GIE_PLURAL = f"inferencepools.{GIE_GROUP}"  # the operator client's name for the kind (slaq's is "inferencepools")

OBJECTIVE_GROUP = "llm-d.ai"
OBJECTIVE_VERSION = "v1alpha2"
OBJECTIVE_API_VERSION = f"{OBJECTIVE_GROUP}/{OBJECTIVE_VERSION}"
OBJECTIVE_PLURAL = f"inferenceobjectives.{OBJECTIVE_GROUP}"
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
# Higher runs first in the router; 0 is what a request without an objective gets.
TIER_PRIORITY = {Tier.CRITICAL: 10, Tier.STANDARD: 0, Tier.BATCH: -10}


def endpoint_picker_name(pool: InferencePool) -> str:
    return pool.spec.gateway.endpoint_picker.name or f"{pool.metadata.name}-epp"


def render_gateway_inference_pool(pool: InferencePool) -> dict[str, Any] | None:
    """The GIE InferencePool for `pool`, or None when `spec.gateway.inferencePool` is off."""
    gateway = pool.spec.gateway
    if not gateway.inference_pool:
        return None
    name = pool.metadata.name
    return {
        "apiVersion": GIE_API_VERSION,
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": pool.metadata.namespace, "labels": pool_labels(name)},
        "spec": {
            "selector": {"matchLabels": pool_selector_labels(name)},
            # The tenant port only: the gateway forwards tenants' requests, which slaq admits by key.
            "targetPorts": [{"number": pool.spec.sidecar.port}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": endpoint_picker_name(pool),
                "port": {"number": gateway.endpoint_picker.port},
                "failureMode": gateway.endpoint_picker.failure_mode.value,
            },
        },
    }


def objective_name(pool_name: str, tier: Tier) -> str:
    return f"{pool_name}-{tier.value}"


def render_inference_objectives(pool: InferencePool) -> list[dict[str, Any]]:
    """One llm-d InferenceObjective per tier over the pool's GIE InferencePool; none when
    `spec.gateway.inferencePool` is off."""
    if not pool.spec.gateway.inference_pool:
        return []
    name = pool.metadata.name
    return [{
        "apiVersion": OBJECTIVE_API_VERSION,
        "kind": "InferenceObjective",
        "metadata": {"name": objective_name(name, tier), "namespace": pool.metadata.namespace, "labels": pool_labels(name)},
        "spec": {"poolRef": {"group": GIE_GROUP, "kind": "InferencePool", "name": name}, "priority": TIER_PRIORITY[tier]},
    } for tier in Tier]
