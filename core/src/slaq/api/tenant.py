"""TenantSLA: a tenant's tier, latency objectives, cluster-wide quotas and API keys."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from slaq.api.common import (
    API_VERSION,
    ApiModel,
    Condition,
    DnsLabel,
    DnsSubdomain,
    KvErase,
    LabelSelector,
    ObjectMeta,
    Tier,
)


class Objectives(ApiModel):
    """Latency objectives; a request meets its SLO when it meets both TTFT and mean TPOT."""

    ttft_ms: Annotated[float | None, Field(gt=0.0, le=3_600_000.0, description="Time-to-first-token objective in milliseconds.")] = None
    tpot_ms: Annotated[float | None, Field(gt=0.0, le=600_000.0, description="Mean time-per-output-token objective in milliseconds.")] = None
    attainment_target: Annotated[float, Field(gt=0.0, le=1.0, description="Fraction of requests that must meet the objectives.")] = 0.99


class Quotas(ApiModel):
    """Limits that hold cluster-wide, across every replica of every pool the tenant is bound to."""

    requests_per_minute: Annotated[int | None, Field(ge=0, le=100_000_000, description="Requests admitted per minute; unset means unlimited.")] = None
    tokens_per_minute: Annotated[int | None, Field(ge=0, le=10_000_000_000, description="Prompt plus reserved output tokens per minute; unset means unlimited.")] = None
    max_concurrency: Annotated[int | None, Field(ge=1, le=1_000_000, description="Requests in flight at once; unset means unlimited.")] = None
    kv_cache_share: Annotated[float, Field(gt=0.0, le=1.0, description="Most of a replica's KV cache this tenant may hold.")] = 1.0


class SecretKeyRef(ApiModel):
    """The Secret holding the tenant's API keys: every entry of its data is one key."""

    name: DnsSubdomain
    namespace: DnsLabel


class PoolRef(ApiModel):
    """A pool the tenant's owner names: one pool, or (no name) every pool of a namespace."""

    namespace: DnsLabel
    name: Annotated[DnsSubdomain | None, Field(description="The InferencePool's name; unset: every pool of the namespace (that poolSelector matches).")] = None

    def names(self, namespace: str | None, name: str) -> bool:
        return self.namespace == namespace and (self.name is None or self.name == name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else f"{self.namespace}/*"


class TenantSLASpec(ApiModel):
    tier: Tier
    display_name: Annotated[str | None, Field(max_length=128)] = None
    objectives: Objectives = Field(default_factory=Objectives)
    quotas: Quotas = Field(default_factory=Quotas)
    pool_selector: Annotated[LabelSelector, Field(description="Narrows the pools this tenant may use by their labels (empty: any labels); labels alone never bind a pool: see pools.")] = Field(default_factory=LabelSelector)
    pools: Annotated[list[PoolRef], Field(max_length=256, description="The pools (or namespaces of pools) this tenant's owner names; a pool named here receives the tenant when its namespace is open to every tenant (the chart's binding.openNamespaces) or its spec.tenants lists the tenant. Empty: the tenant is served only by pools in the open namespaces.")] = Field(default_factory=list)
    api_key_secret_ref: Annotated[SecretKeyRef, Field(description="The Secret holding the tenant's API keys; it must carry the label slaq.dev/tenant=<this tenant's name> and live in a namespace the operator reads key Secrets in (the chart's rbac.secretNamespaces).")]
    max_keys: Annotated[int, Field(ge=1, le=1000, description="Most API keys the Secret may hold; beyond it the keys accepted before stay in force and the tenant is Degraded (TooManyKeys). Bounds the tenant's share of a pool's table.")] = 100
    kv_erase: Annotated[KvErase, Field(description="When the engine zeroes KV blocks that held this tenant's data: onReuse (before another tenant gets them; keeps the prefix cache) or onFree (as soon as freed; no prefix cache).")] = KvErase.ON_REUSE
    prefix_cache_group: Annotated[str | None, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63, description="Tenants naming the same group share prefix-cache blocks; unset keeps the tenant's cache private.")] = None

    @model_validator(mode="after")
    def _objectives_fit_tier(self) -> "TenantSLASpec":
        if self.tier is not Tier.BATCH and self.objectives.ttft_ms is None:
            raise ValueError(f"objectives.ttftMs is required for tier {self.tier.value}")
        return self


class PoolShare(ApiModel):
    """A tenant's quota share on one pool (per replica) and the usage observed there."""

    pool: str
    replicas: int = 0
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrency: int | None = None
    observed_requests_per_minute: float = 0.0
    observed_tokens_per_minute: float = 0.0


class TenantSLAStatus(ApiModel):
    observed_generation: int | None = None
    key_count: int | None = None
    pools: list[PoolShare] = Field(default_factory=list)
    attainment: Annotated[float | None, Field(ge=0.0, le=1.0)] = None
    conditions: list[Condition] = Field(default_factory=list)


class TenantSLA(ApiModel):
    api_version: Literal["slaq.dev/v1alpha1"] = API_VERSION
    kind: Literal["TenantSLA"] = "TenantSLA"
    metadata: ObjectMeta
    spec: TenantSLASpec
    status: TenantSLAStatus | None = None


TENANT_CEL_RULES: dict[str, list[dict[str, str]]] = {
    "spec": [
        {"rule": "self.tier == 'batch' || (has(self.objectives) && has(self.objectives.ttftMs))", "message": "objectives.ttftMs is required unless tier is batch", "fieldPath": ".objectives.ttftMs"},
    ],
}
