"""Running the operator: kopf's operator() coroutine with slaq's registry and settings."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import kopf

from slaq.operator.attainment import MIN_REQUESTS, WINDOW_S, AttainmentLedger
from slaq.operator.client import Connection, KubeClient
from slaq.operator.handlers import build_registry, configure
from slaq.operator.pod import QuotaStoreRef
from slaq.operator.images import PoolImages
from slaq.operator.reconciler import Reconciler
from slaq.operator.usage import HttpUsageSource, UsageSource


@dataclass
class OperatorOptions:
    namespace: str = "slaq-system"  # the operator's own namespace (cache-salt key Secret)
    observe_interval_s: float = 15.0
    attainment_window_s: float = WINDOW_S  # TenantSLA.status.attainment looks back this far
    attainment_min_requests: int = MIN_REQUESTS  # fewer in the window: AtRisk is Unknown
    retry_delay_s: float = 5.0
    liveness_endpoint: str | None = None
    standalone: bool = True  # one replica; kopf peering is not needed
    key_secret_namespaces: tuple[str, ...] = ()  # where apiKeySecretRefs may point, beside `namespace` (rbac.secretNamespaces)
    open_namespaces: tuple[str, ...] = ()  # open to every tenant (binding.openNamespaces; tables.binding)
    quota_store: QuotaStoreRef | None = None  # the install's shared quota store for sidecars (quotaStore.redis); None: local shares
    images: PoolImages = field(default_factory=PoolImages)  # pools' default images (the chart's pools.images)
    network_policies: bool = True  # a NetworkPolicy per pool (networkPolicy.enabled)
    monitoring_namespaces: tuple[str, ...] = ("monitoring",)  # admitted to every pool's metrics port (networkPolicy.monitoringNamespaces)
    tune: dict[str, Any] = field(default_factory=dict)  # dotted kopf settings, e.g. {"watching.server_timeout": 60}


def build_settings(options: OperatorOptions) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    configure(settings)
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    for dotted, value in options.tune.items():
        section, name = dotted.split(".", 1)
        setattr(getattr(settings, section), name, value)
    return settings


Flag = asyncio.Event | threading.Event


async def run_operator(connection: Connection, options: OperatorOptions, *, usage_source: UsageSource | None = None,
                       stop_flag: Flag | None = None, ready_flag: Flag | None = None) -> Reconciler:
    """Run until `stop_flag` is set (or forever); returns the Reconciler it ran (for inspection).

    kopf owns its event loop: at exit it cancels every task created after it started, so run it
    on a loop (or thread) of its own rather than beside other servers.
    """
    api = KubeClient(connection)
    reconciler = Reconciler(api, usage_source or HttpUsageSource(api), namespace=options.namespace,
                            key_secret_namespaces=options.key_secret_namespaces, open_namespaces=options.open_namespaces,
                            quota_store=options.quota_store,
                            monitoring_namespaces=options.monitoring_namespaces if options.network_policies else None,
                            attainment=AttainmentLedger(window_s=options.attainment_window_s),
                            min_requests=options.attainment_min_requests, images=options.images)
    registry = build_registry(reconciler, observe_interval_s=options.observe_interval_s, connection=connection,
                              retry_delay_s=options.retry_delay_s)
    try:
        await kopf.operator(registry=registry, settings=build_settings(options), clusterwide=True,
                            standalone=options.standalone, liveness_endpoint=options.liveness_endpoint,
                            stop_flag=stop_flag, ready_flag=ready_flag)
    finally:
        await reconciler.close()
        await api.close()
    return reconciler


def main(connection: Connection, options: OperatorOptions, verbose: bool = False) -> int:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run_operator(connection, options))
    return 0


class OperatorThread:
    """The operator on an event loop of its own, in a thread (tests, local runs beside other servers).

    kopf cancels every task created on its loop after it started when it exits; on a loop of its
    own that is only its own work.
    """

    def __init__(self, connection: Connection, options: OperatorOptions, *, usage_source: UsageSource | None = None) -> None:
        self._args = (connection, options, usage_source)
        self.stop_flag, self.ready_flag = threading.Event(), threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="slaq-operator", daemon=True)

    def _run(self) -> None:
        connection, options, usage_source = self._args
        try:
            asyncio.run(run_operator(connection, options, usage_source=usage_source,
                                     stop_flag=self.stop_flag, ready_flag=self.ready_flag))
        except BaseException as exc:  # handed to whoever stops or checks the thread
            self.failure = exc

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Set the stop flag and wait (blocking: from async code, `await asyncio.to_thread(op.stop)`)."""
        self.stop_flag.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the operator did not stop within {timeout_s} s")
        if self.failure is not None:
            raise self.failure
