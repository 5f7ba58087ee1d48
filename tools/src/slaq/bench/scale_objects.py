"""The cluster `tools/src/slaq/bench/operator_scale.py` (and its tests) put in the API emulator: P pools and N
tenants, each tenant with its own key Secret.

Pools are spread over `models` model labels (`slaq.dev/model: m<k>`); tenant j selects the pools
of model j % models. With models=1 every pool serves every tenant (the largest tables); with
models=P each tenant has a pool of its own.
"""

from __future__ import annotations

import base64
from typing import Any

from slaq.operator.keys import TENANT_LABEL

KEY_NAMESPACE = "tenant-keys"
POOL_NAMESPACE = "inference"
# The cluster admin opens the pools' namespace to every tenant (the operator's --open-namespaces): the
# tenants name no pools, and so are served there (tables.binding).
OPEN_NAMESPACES = (POOL_NAMESPACE,)
MODEL_LABEL = "slaq.dev/model"


def model_of_pool(index: int, models: int) -> str:
    return f"m{index % models}"


def model_of_tenant(index: int, models: int) -> str:
    return f"m{index % models}"


def tenant_name(index: int) -> str:
    return f"tenant-{index:05d}"


def pool_name(index: int) -> str:
    return f"pool-{index:03d}"


def pool_body(index: int, models: int) -> dict[str, Any]:
    return {
        "apiVersion": "slaq.dev/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": pool_name(index), "namespace": POOL_NAMESPACE, "labels": {MODEL_LABEL: model_of_pool(index, models)}},
        "spec": {
            "model": {"name": "slaq-tiny", "dtype": "float32", "maxModelLen": 2048, "loadFormat": "dummy"},
            "engine": {"device": "cpu", "maxNumSeqs": 16, "maxNumBatchedTokens": 2048},
            "resources": {"gpus": 0, "cpu": "2", "memory": "8Gi", "sharedMemory": "1Gi"},
            "replicas": {"min": 1, "max": 4},
            "drainTimeout": "30s",
        },
    }


def tenant_body(index: int, models: int, requests_per_minute: int = 600) -> dict[str, Any]:
    tier = ("critical", "standard", "batch")[index % 3]
    return {
        "apiVersion": "slaq.dev/v1alpha1", "kind": "TenantSLA",
        "metadata": {"name": tenant_name(index), "labels": {"slaq.dev/tier": tier}},
        "spec": {
            "tier": tier,
            "objectives": {"ttftMs": 200, "tpotMs": 100, "attainmentTarget": 0.95},
            "quotas": {"requestsPerMinute": requests_per_minute, "tokensPerMinute": 600_000, "maxConcurrency": 32},
            "poolSelector": {"matchLabels": {MODEL_LABEL: model_of_tenant(index, models)}},
            "apiKeySecretRef": {"name": f"{tenant_name(index)}-keys", "namespace": KEY_NAMESPACE},
        },
    }


def key_secret(index: int) -> dict[str, Any]:
    key = f"sk-{tenant_name(index)}-0123456789abcdef"
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": f"{tenant_name(index)}-keys", "namespace": KEY_NAMESPACE, "labels": {TENANT_LABEL: tenant_name(index)}},
        "data": {"key": base64.b64encode(key.encode()).decode()},
    }


def pools_of_tenant(index: int, pools: int, models: int) -> list[str]:
    """The pools tenant `index` binds: those of its model."""
    model = model_of_tenant(index, models)
    return [pool_name(p) for p in range(pools) if model_of_pool(p, models) == model]
