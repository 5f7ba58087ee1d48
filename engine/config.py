"""The scheduler's knobs, as the engine core process receives them.

The operator renders the pool's `spec.scheduler` (wire JSON) into the environment variable named
by `slaq.api.runtime.SCHEDULER_CONFIG_ENV`; `slaq engine --scheduler-config JSON|FILE` sets it.
Per-tenant KV shares come from the pool's tenant table, when the engine can read it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from pydantic import ValidationError

from slaq.api.pool import SchedulerSpec
from slaq.api.runtime import SCHEDULER_CONFIG_ENV, TENANT_TABLE_DIR, TENANT_TABLE_KEY
from slaq.api.table import TenantTable
from slaq.engine.errors import SchedulerConfigError

TENANT_TABLE_ENV = "SLAQ_TENANT_TABLE"  # path of the tenant table file; default: the pod's mount


@dataclass(frozen=True)
class EngineSchedulerConfig:
    spec: SchedulerSpec = field(default_factory=SchedulerSpec)
    tenant_kv_share: Mapping[str, float] = field(default_factory=dict)
    min_progress_tokens: int = 4  # output tokens a preempted request makes before it may be preempted again

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "EngineSchedulerConfig":
        environ = os.environ if environ is None else environ
        return cls(spec=parse_scheduler_spec(environ.get(SCHEDULER_CONFIG_ENV, "")), tenant_kv_share=_tenant_shares(environ))


def parse_scheduler_spec(text: str) -> SchedulerSpec:
    """A SchedulerSpec from wire JSON (camelCase, as in the InferencePool); empty means defaults."""
    if not text.strip():
        return SchedulerSpec()
    try:
        return SchedulerSpec.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise SchedulerConfigError(f"{SCHEDULER_CONFIG_ENV} is not JSON: {exc}") from exc
    except ValidationError as exc:
        raise SchedulerConfigError(f"{SCHEDULER_CONFIG_ENV} is not a valid scheduler spec: {exc}") from exc


def read_scheduler_config_argument(value: str) -> str:
    """`--scheduler-config` takes JSON or a file holding it; returns validated wire JSON."""
    text = value
    if not value.lstrip().startswith("{"):
        path = Path(value)
        if not path.is_file():
            raise SchedulerConfigError(f"--scheduler-config: {value!r} is neither JSON nor a readable file")
        text = path.read_text(encoding="utf-8")
    return json.dumps(parse_scheduler_spec(text).to_wire())


def _tenant_shares(environ: Mapping[str, str]) -> dict[str, float]:
    path = Path(environ.get(TENANT_TABLE_ENV) or Path(TENANT_TABLE_DIR) / TENANT_TABLE_KEY)
    if not path.is_file():
        return {}
    try:
        table = TenantTable.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        raise SchedulerConfigError(f"tenant table {path} cannot be read: {exc}") from exc
    return {tenant.name: tenant.kv_cache_share for tenant in table.tenants}
