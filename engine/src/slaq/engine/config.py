"""The scheduler's knobs, as the engine core process receives them.

The operator renders the pool's `spec.scheduler` (wire JSON) into the environment variable named
by `slaq.api.runtime.SCHEDULER_CONFIG_ENV`; `slaq engine --scheduler-config JSON|FILE` sets it.
Per-tenant KV shares (and the KV connector's erase modes) come from the pool's engine table
(`slaq.api.table.EngineTable`: no key hashes, no salts), when the engine can read it; the
operator rewrites that Secret when a TenantSLA changes, and `EngineTableWatcher` picks the new
file up while the engine runs.
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
from slaq.api.runtime import ENGINE_TABLE_DIR, ENGINE_TABLE_ENV, ENGINE_TABLE_KEY, SCHEDULER_CONFIG_ENV
from slaq.api.table import EngineTable
from slaq.engine.errors import SchedulerConfigError
from slaq.table_file import TableFile

TABLE_CHECK_INTERVAL_S = 2.0  # how often the engine looks at the table file (a stat, not a read)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSchedulerConfig:
    spec: SchedulerSpec = field(default_factory=SchedulerSpec)
    tenant_kv_share: Mapping[str, float] = field(default_factory=dict)
    min_progress_tokens: int = 4  # output tokens a preempted request makes before it may be preempted again
    engine_table: Path | None = None  # the file the shares came from, watched for changes (None: fixed shares)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "EngineSchedulerConfig":
        environ = os.environ if environ is None else environ
        path = engine_table_path(environ)
        shares = read_engine_table(path).kv_shares() if path.is_file() else {}
        return cls(spec=parse_scheduler_spec(environ.get(SCHEDULER_CONFIG_ENV, "")), tenant_kv_share=shares, engine_table=path)


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


def engine_table_path(environ: Mapping[str, str]) -> Path:
    return Path(environ.get(ENGINE_TABLE_ENV) or Path(ENGINE_TABLE_DIR) / ENGINE_TABLE_KEY)


def engine_table_file(path: Path, interval_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> TableFile[EngineTable]:
    return TableFile(path, EngineTable, what="engine table", interval_s=interval_s, clock=clock)


def read_engine_table(path: Path) -> EngineTable:
    try:
        return engine_table_file(path).read()
    except ValueError as exc:
        raise SchedulerConfigError(str(exc)) from exc


class EngineTableWatcher:
    """Re-reads the engine table when its file changes, so new tenants, changed KV shares and erase
    modes take effect without an engine restart.

    `poll()` is called every step but looks at the file at most every `interval_s`, and then only
    stats it (slaq.table_file.TableFile, the sidecar's watcher too). A table that cannot be read
    or parsed is logged and skipped: what is in force stays, and the next change is picked up.
    """

    def __init__(self, path: Path, *, interval_s: float = TABLE_CHECK_INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 on_reload: Callable[[str], None] = lambda outcome: None) -> None:
        """`on_reload(outcome)` hears of every change seen: "applied" or "kept_previous"."""
        self.path = path
        self._file = engine_table_file(path, interval_s, clock)
        self._file.mark_seen()  # the engine read it at startup (EngineSchedulerConfig.from_environment)
        self._on_reload = on_reload

    def poll(self) -> EngineTable | None:
        """The new table when the file changed since the last look, else None."""
        change = self._file.poll()
        if change is None:
            return None
        if change.table is None:
            log.warning("%s; keeping the tenants' KV settings in force", change.error)
            self._on_reload("kept_previous")
            return None
        log.info("engine table %s changed: %d tenants", self.path, len(change.table.tenants))
        self._on_reload("applied")
        return change.table
