"""kopf handlers: one decorator, one job; each calls one Reconciler method.

Errors are translated in one place: a SpecError becomes kopf.PermanentError (the user must fix
the named field), a retryable API error becomes kopf.TemporaryError (kopf tries again).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from slaq.api.common import GROUP, VERSION
from slaq.operator.client import Connection
from slaq.operator.errors import RetryableApiError, SpecError
from slaq.operator.reconciler import Reconciler
from slaq.operator.view import ClusterView, index_pool, index_tenant

POOLS = (GROUP, VERSION, "inferencepools")
TENANTS = (GROUP, VERSION, "tenantslas")
RETRY_DELAY_S = 5.0

Handler = Callable[..., Awaitable[None]]


def translating_errors(retry_delay_s: float) -> Callable[[Handler], Handler]:
    def decorate(fn: Handler) -> Handler:
        @functools.wraps(fn)
        async def wrapper(**kwargs: Any) -> None:
            try:
                await fn(**kwargs)
            except SpecError as exc:
                raise kopf.PermanentError(str(exc)) from exc
            except RetryableApiError as exc:
                raise kopf.TemporaryError(f"{exc}; retrying", delay=retry_delay_s) from exc
        return wrapper
    return decorate


def configure(settings: kopf.OperatorSettings) -> None:
    """slaq's own finalizer and annotation names, so `kubectl describe` says who holds an object."""
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.SmartProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key="last-handled-configuration")
    settings.posting.reporting_component = "slaq-operator"
    # kopf's own Events ("Handler ... succeeded") would add two API writes to every change of every
    # object; failures are still posted, and the operator posts its own (AtRisk, InvalidSpec).
    settings.posting.level = logging.WARNING


def build_registry(reconciler: Reconciler, *, observe_interval_s: float = 15.0, connection: Connection | None = None,
                   retry_delay_s: float = RETRY_DELAY_S) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    errors = translating_errors(retry_delay_s)

    if connection is not None:
        @kopf.on.login(id="login", registry=registry)
        def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
            return connection.kopf_login(**kwargs)

    # The view the tables are planned from: kopf runs no handler before both indexes hold the
    # whole initial listing (view.py).
    @kopf.index(*POOLS, id="pool_index", registry=registry)
    def pool_index(body: kopf.Body, **_: Any) -> dict[str, Any]:
        return index_pool(body)

    @kopf.index(*TENANTS, id="tenant_index", registry=registry)
    def tenant_index(body: kopf.Body, **_: Any) -> dict[str, Any]:
        return index_tenant(body)

    @kopf.on.startup(id="create_salt_key", registry=registry)
    async def create_salt_key(pool_index: kopf.Index[str, Any], tenant_index: kopf.Index[str, Any], **_: Any) -> None:
        reconciler.bind_view(ClusterView(pool_index, tenant_index))
        await reconciler.ensure_salt_key()

    @kopf.on.resume(*POOLS, id="pool_children", registry=registry)
    @kopf.on.create(*POOLS, id="pool_children", registry=registry)
    @kopf.on.update(*POOLS, id="pool_children", registry=registry)
    @errors
    async def pool_children(body: kopf.Body, **_: Any) -> None:
        await reconciler.reconcile_pool(dict(body))

    @kopf.on.delete(*POOLS, id="pool_gone", optional=True, registry=registry)
    @errors
    async def pool_gone(name: str, namespace: str, **_: Any) -> None:
        reconciler.forget_pool(namespace, name)
        await reconciler.refresh(pools=[f"{namespace}/{name}"])  # its tenants' quotas are re-split over the remaining pools

    @kopf.timer(*POOLS, id="pool_usage", interval=observe_interval_s, initial_delay=observe_interval_s, idle=None, registry=registry)
    @errors
    async def pool_usage(body: kopf.Body, **_: Any) -> None:
        await reconciler.observe_pool(dict(body))

    @kopf.on.resume(*TENANTS, id="tenant_tables", registry=registry)
    @kopf.on.create(*TENANTS, id="tenant_tables", registry=registry)
    @kopf.on.update(*TENANTS, id="tenant_tables", registry=registry)
    @errors
    async def tenant_tables(body: kopf.Body, **_: Any) -> None:
        await reconciler.reconcile_tenant(dict(body))

    @kopf.on.delete(*TENANTS, id="tenant_removed", registry=registry)
    @errors
    async def tenant_removed(body: kopf.Body, **_: Any) -> None:
        await reconciler.forget_tenant(dict(body))

    return registry
