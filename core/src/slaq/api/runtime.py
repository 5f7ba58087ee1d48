"""The pod contract: how the operator wires a pool pod and what the sidecar and engine expect.

The operator renders containers from these names; `slaq sidecar` and `slaq engine` accept them.
Changing one side without the other breaks pods, so both import them from here.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from slaq.api.common import ApiModel

ENGINE_HOST = "127.0.0.1"  # the engine is reachable only from its sidecar, inside the pod
ENGINE_PORT = 8001
SIDECAR_PORT_NAME = "http"

TENANT_TABLE_DIR = "/etc/slaq/tenants"  # the pool's tenant-table Secret is mounted here
TENANT_TABLE_KEY = "tenants.json"  # the Secret's data key, and the file name under the mount

# The same Secret's engine key (slaq.api.table.EngineTable: KV shares, erase modes, salt
# fingerprints; no key hashes, no salts), the only key mounted into the engine container.
ENGINE_TABLE_DIR = "/etc/slaq/engine"
ENGINE_TABLE_KEY = "engine.json"
# A pool's table is split over at most this many Secrets (`<pool>-tenants`, `<pool>-tenants-1`...),
# each at most 1 MiB of data; the pod projects all of them, the missing ones being optional.
MAX_TABLE_PARTS = 16

# Environment variable carrying the pool's SchedulerSpec (wire JSON) into the engine core process.
SCHEDULER_CONFIG_ENV = "SLAQ_SCHEDULER_CONFIG"
# The engine reads its table at this path (default: the engine mount above) and re-reads it when it changes.
ENGINE_TABLE_ENV = "SLAQ_ENGINE_TABLE"
QUOTA_STORE_PASSWORD_ENV = "SLAQ_QUOTA_STORE_PASSWORD"  # the sidecar's quota store password (`slaq sidecar --quota-store`)

HEALTH_PATH = "/health"  # liveness: the sidecar process answers
READY_PATH = "/ready"  # readiness: the engine behind it answers and the tenant table is loaded
METRICS_PATH = "/metrics"  # Prometheus text format, on the metrics port only
USAGE_PATH = "/slaq/usage"  # per-tenant usage the operator reads to split quotas, on the metrics port only
METRICS_PORT = 9090  # the sidecar's metrics port: Prometheus, a gateway's endpoint picker and the operator
METRICS_PORT_NAME = "metrics"


class TenantUsage(ApiModel):
    """One tenant's demand on one replica over the last minute."""

    requests_per_minute: Annotated[float, Field(ge=0.0)] = 0.0
    tokens_per_minute: Annotated[float, Field(ge=0.0)] = 0.0
    concurrency: Annotated[int, Field(ge=0)] = 0
    refused_per_minute: Annotated[float, Field(ge=0.0, description="Requests refused for quota in the last minute: demand beyond the share.")] = 0.0
    slo_met_per_minute: Annotated[float, Field(ge=0.0, description="Finished requests with objectives that met them all, in the last minute.")] = 0.0
    slo_missed_per_minute: Annotated[float, Field(ge=0.0, description="Finished requests with objectives that missed one (TTFT, TPOT or the whole-answer budget), in the last minute.")] = 0.0


class UsageReport(ApiModel):
    """What `GET /slaq/usage` on a sidecar answers."""

    pool: str
    table_revision: str = ""
    window_seconds: float = 60.0
    tenants: dict[str, TenantUsage] = Field(default_factory=dict)

# How long the sidecar waits for the engine's /health before it calls the pod not ready and refuses new
# requests with 503 (`slaq sidecar --engine-health-timeout`): a hung engine is told apart from a busy one.
ENGINE_HEALTH_TIMEOUT_S = 2.0
