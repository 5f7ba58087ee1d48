"""The scheduler's knobs, as the engine core process receives them.

The operator renders the pool's `spec.scheduler` (wire JSON) into the environment variable named
by `slaq.api.runtime.SCHEDULER_CONFIG_ENV`; `slaq engine --scheduler-config JSON|FILE` sets it.
Per-tenant KV shares come from the pool's tenant table, when the engine can read it; the operator
rewrites that Secret when a TenantSLA changes, and `TenantShareWatcher` picks the new file up
while the engine runs.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from pydantic import ValidationError

from slaq.api.pool import SchedulerSpec
from slaq.api.runtime import SCHEDULER_CONFIG_ENV, TENANT_TABLE_DIR, TENANT_TABLE_ENV, TENANT_TABLE_KEY
from slaq.api.table import TenantTable
from slaq.engine.errors import SchedulerConfigError

TABLE_CHECK_INTERVAL_S = 2.0  # how often the engine looks at the table file (a stat, not a read)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSchedulerConfig:
    spec: SchedulerSpec = field(default_factory=SchedulerSpec)
    tenant_kv_share: Mapping[str, float] = field(default_factory=dict)
    min_progress_tokens: int = 4  # output tokens a preempted request makes before it may be preempted again
    tenant_table: Path | None = None  # the file the shares came from, watched for changes (None: fixed shares)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "EngineSchedulerConfig":
        environ = os.environ if environ is None else environ
        path = tenant_table_path(environ)
        shares = read_tenant_shares(path) if path.is_file() else {}
        return cls(spec=parse_scheduler_spec(environ.get(SCHEDULER_CONFIG_ENV, "")), tenant_kv_share=shares, tenant_table=path)


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


def tenant_table_path(environ: Mapping[str, str]) -> Path:
    return Path(environ.get(TENANT_TABLE_ENV) or Path(TENANT_TABLE_DIR) / TENANT_TABLE_KEY)


def read_tenant_table(path: Path) -> TenantTable:
    try:
        return TenantTable.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        raise SchedulerConfigError(f"tenant table {path} cannot be read: {exc}") from exc


def read_tenant_shares(path: Path) -> dict[str, float]:
    return {tenant.name: tenant.kv_cache_share for tenant in read_tenant_table(path).tenants}


class TenantShareWatcher:
    """Re-reads the tenant table when its file changes, so new tenants and changed KV shares take
    effect without an engine restart.

    `poll()` is called every step but looks at the file at most every `interval_s`, and then only
    stats it (Kubernetes swaps a Secret volume's files atomically, which changes the inode and
    mtime). A table that cannot be read or parsed is logged and skipped: the shares in force stay,
    and the next change is picked up.
    """

    def __init__(self, path: Path, *, interval_s: float = TABLE_CHECK_INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 on_reload: Callable[[str], None] = lambda outcome: None) -> None:
        """`on_reload(outcome)` hears of every change seen: "applied" or "kept_previous"."""
        self.path = path
        self.interval_s = interval_s
        self._clock = clock
        self._on_reload = on_reload
        self._next_check = clock() + interval_s
        self._seen = self._signature()

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def poll(self) -> dict[str, float] | None:
        """The new shares when the table changed since the last look, else None."""
        now = self._clock()
        if now < self._next_check:
            return None
        self._next_check = now + self.interval_s
        signature = self._signature()
        if signature == self._seen:
            return None
        self._seen = signature
        if signature is None:
            log.warning("tenant table %s is gone; keeping the KV shares in force", self.path)
            self._on_reload("kept_previous")
            return None
        try:
            shares = read_tenant_shares(self.path)
        except SchedulerConfigError as exc:
            log.warning("%s; keeping the KV shares in force", exc)
            self._on_reload("kept_previous")
            return None
        log.info("tenant table %s changed: KV shares for %d tenants", self.path, len(shares))
        self._on_reload("applied")
        return shares
