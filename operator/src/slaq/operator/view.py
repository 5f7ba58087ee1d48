"""The operator's in-memory view of pools and tenants (informer.py keeps it current: no list calls).

Each entry holds the raw object and its parsed model, or the SpecError that kept it from
parsing; objects being deleted stay until they are gone, and the view leaves them out of what
it serves.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from slaq.api.pool import InferencePool
from slaq.api.tenant import TenantSLA
from slaq.operator.errors import SpecError

Model = TypeVar("Model", bound=BaseModel)


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(object)"


def name_of(body: Mapping[str, Any]) -> str:
    return (body.get("metadata") or {}).get("name", "?")


def deleting(body: Mapping[str, Any]) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


def parse(model: type[Model], kind: str, body: Mapping[str, Any]) -> Model:
    """The object as its API model; SpecError naming the first bad field."""
    try:
        return model.model_validate({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SpecError(kind, name_of(body), _field(first["loc"]), first["msg"]) from exc


def parse_pool(body: Mapping[str, Any]) -> InferencePool:
    return parse(InferencePool, "InferencePool", body)


def parse_tenant(body: Mapping[str, Any]) -> TenantSLA:
    return parse(TenantSLA, "TenantSLA", body)


@dataclass(frozen=True)
class Indexed(Generic[Model]):
    """One object as the index holds it: its body, and its model or why it has none."""

    body: dict[str, Any]
    model: Model | None = None
    error: SpecError | None = None

    @property
    def served(self) -> bool:
        """Valid and not being deleted: what tables are planned from."""
        return self.model is not None and not deleting(self.body)


def indexed(model: type[Model], kind: str, body: Mapping[str, Any]) -> Indexed[Model]:
    raw = copy.deepcopy(dict(body))
    try:
        return Indexed(raw, parse(model, kind, raw))
    except SpecError as exc:
        return Indexed(raw, error=exc)


def indexed_pool(body: Mapping[str, Any]) -> Indexed[InferencePool]:
    return indexed(InferencePool, "InferencePool", body)


def indexed_tenant(body: Mapping[str, Any]) -> Indexed[TenantSLA]:
    return indexed(TenantSLA, "TenantSLA", body)


class ClusterView:
    """Read-only access to the stored pools (by `namespace/name`) and tenants (by name)."""

    def __init__(self, pools: Mapping[str, Indexed[InferencePool]] | None = None,
                 tenants: Mapping[str, Indexed[TenantSLA]] | None = None) -> None:
        self._pools = pools if pools is not None else {}
        self._tenants = tenants if tenants is not None else {}

    def pool(self, key: str) -> Indexed[InferencePool] | None:
        """The pool if it is served (valid, not being deleted), else None."""
        found = self._pools.get(key)
        return found if found is not None and found.served else None

    def tenant(self, name: str) -> Indexed[TenantSLA] | None:
        found = self._tenants.get(name)
        return found if found is not None and found.served else None

    def tenant_entry(self, name: str) -> Indexed[TenantSLA] | None:
        """The tenant as stored, invalid or being deleted too."""
        return self._tenants.get(name)

    def pools(self) -> Iterator[Indexed[InferencePool]]:
        return (found for found in list(self._pools.values()) if found.served)

    def tenant_names(self) -> list[str]:
        return list(self._tenants)

    def tenants(self) -> Iterator[Indexed[TenantSLA]]:
        return (found for found in list(self._tenants.values()) if found.served)
