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
from slaq.operator.names import FINALIZER
from slaq.operator.reconciler import Reconciler

POOLS = (GROUP, VERSION, "inferencepools")
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
    settings.persistence.finalizer = FINALIZER
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

    # Pools and tenants are watched by the reconciler's own informers (informer.py): it starts
    # them here and returns once both are listed, so no table is planned from a partial view.
    # Tenants have no kopf handler: their tables and statuses follow the watch (reconciler.py).
    @kopf.on.startup(id="start_informers", registry=registry)
    async def start_informers(**_: Any) -> None:
        await reconciler.ensure_salt_key()
        await reconciler.start()

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

    return registry
