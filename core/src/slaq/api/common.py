"""Pieces shared by every slaq API type: group/version, tiers, base model, selectors, conditions."""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

GROUP = "slaq.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


class Tier(str, enum.Enum):
    """Service tier of a tenant; the order of the members is the order of importance."""

    CRITICAL = "critical"
    STANDARD = "standard"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """0 for the most important tier; matches vLLM's polarity (lower runs earlier)."""
        return TIER_RANK[self]


TIER_RANK: dict[Tier, int] = {tier: index for index, tier in enumerate(Tier)}


class KvErase(str, enum.Enum):
    """When the engine zeroes KV blocks that held a tenant's data.

    `onReuse`: a block is zeroed when it is handed to another tenant, so the tenant's own prefix
    cache keeps working. `onFree`: zeroed as soon as the tenant's request frees it, and the tenant
    reads no prefix cache (nothing of it outlives the request)."""

    ON_REUSE = "onReuse"
    ON_FREE = "onFree"


class ApiModel(BaseModel):
    """Base of every model at a boundary: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
        validate_default=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict with camelCase keys, omitting unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL, min_length=1, max_length=63)]
DnsSubdomain = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN, min_length=1, max_length=253)]

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

Duration = Annotated[
    str,
    StringConstraints(pattern=DURATION_PATTERN),
    Field(description="A duration such as 30s, 1m30s or 500ms."),
]


def duration_seconds(value: str) -> float:
    """Seconds in a Duration string (`1m30s` -> 90.0)."""
    if not re.fullmatch(DURATION_PATTERN, value):
        raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 1m30s, 500ms)")
    return sum(float(n) * _DURATION_UNIT_S[u] for n, u in _DURATION_PART.findall(value))


QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
Quantity = Annotated[
    str,
    StringConstraints(pattern=QUANTITY_PATTERN),
    Field(description="A Kubernetes resource quantity such as 8, 500m or 64Gi."),
]

LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"


class LabelSelectorRequirement(ApiModel):
    key: Annotated[str, StringConstraints(pattern=LABEL_KEY)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(ApiModel):
    """A Kubernetes label selector; an empty selector selects everything."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    def matches(self, labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for req in self.match_expressions:
            present = req.key in labels
            if req.operator == "In" and not (present and labels[req.key] in req.values):
                return False
            if req.operator == "NotIn" and present and labels[req.key] in req.values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True


class ConditionStatus(str, enum.Enum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A status condition as `kubectl describe` shows it."""

    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class ObjectMeta(ApiModel):
    """The part of metadata slaq reads; everything else the API server owns is kept as is."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: DnsSubdomain
    namespace: DnsLabel | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
