"""The operator's in-memory view of pools and tenants, fed by kopf indexes (no list calls).

kopf keeps one index per kind from its own watch streams (`index_pool`, `index_tenant` are the
index functions handlers.py registers) and starts no handler before every index has taken in
the whole initial listing, so the view is complete from the first handler on: a restarted
operator never writes a table from a partial picture of the cluster.

Each entry holds the raw object and its parsed model, or the SpecError that kept it from
parsing; objects being deleted stay in the index until they are gone, and the view leaves them
out of what it serves.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
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


def pool_key_of(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


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


def index_pool(body: Mapping[str, Any]) -> dict[str, Indexed[InferencePool]]:
    """kopf index function: pools by `namespace/name`."""
    return {pool_key_of(body): indexed(InferencePool, "InferencePool", body)}


def index_tenant(body: Mapping[str, Any]) -> dict[str, Indexed[TenantSLA]]:
    """kopf index function: tenants by name (TenantSLA is cluster-scoped)."""
    return {name_of(body): indexed(TenantSLA, "TenantSLA", body)}


IndexLike = Mapping[str, Iterable[Indexed[Any]]]  # a kopf.Index: key -> store of values (one here)


def _one(index: IndexLike, key: str) -> Indexed[Any] | None:
    if key not in index:
        return None
    return next(iter(index[key]), None)


class ClusterView:
    """Read-only access to the indexed pools and tenants (kopf.Index objects, or plain dicts in tests)."""

    def __init__(self, pools: IndexLike | None = None, tenants: IndexLike | None = None) -> None:
        self._pools: IndexLike = pools if pools is not None else {}
        self._tenants: IndexLike = tenants if tenants is not None else {}

    def pool(self, key: str) -> Indexed[InferencePool] | None:
        """The pool if it is served (valid, not being deleted), else None."""
        found = _one(self._pools, key)
        return found if found is not None and found.served else None

    def tenant(self, name: str) -> Indexed[TenantSLA] | None:
        found = _one(self._tenants, name)
        return found if found is not None and found.served else None

    def pools(self) -> Iterator[Indexed[InferencePool]]:
        for key in list(self._pools):
            if (found := self.pool(key)) is not None:
                yield found

    def tenant_names(self) -> list[str]:
        return list(self._tenants)

    def tenants(self) -> Iterator[Indexed[TenantSLA]]:
        for name in list(self._tenants):
            if (found := self.tenant(name)) is not None:
                yield found
