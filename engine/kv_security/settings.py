"""The connector's settings and the `--kv-transfer-config` that loads it.

Kept apart from connector.py on purpose: the launcher builds the flag before vLLM starts, and
importing the connector (vLLM, prometheus_client) that early would fix prometheus_client's value
store before `PROMETHEUS_MULTIPROC_DIR` is set, and the API server's `vllm:*` series would vanish
from `/metrics` (tests/engine/test_launcher.py checks nothing heavy is imported)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

CONNECTOR_NAME = "SlaqKVConnector"
CONNECTOR_MODULE = "slaq.engine.kv_security.connector"


@dataclass(frozen=True)
class KVSecuritySettings:
    erase: bool = True
    host_cache_bytes: int = 0
    inspect_path: str | None = None
    tamper_flag: str | None = None

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> "KVSecuritySettings":
        known = {"erase", "hostCacheBytes", "inspectPath", "tamperFlag"}
        unknown = set(extra) - known
        if unknown:
            raise ValueError(f"{CONNECTOR_NAME}: unknown setting(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        return cls(
            erase=bool(extra.get("erase", True)),
            host_cache_bytes=int(extra.get("hostCacheBytes", 0)),
            inspect_path=extra.get("inspectPath"),
            tamper_flag=extra.get("tamperFlag"),
        )

    def to_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"erase": self.erase, "hostCacheBytes": self.host_cache_bytes}
        if self.inspect_path:
            extra["inspectPath"] = self.inspect_path
        if self.tamper_flag:
            extra["tamperFlag"] = self.tamper_flag
        return extra


def transfer_config_json(settings: KVSecuritySettings) -> str:
    """The `--kv-transfer-config` value that loads this connector. Load failures are recomputed,
    never served (`kv_load_failure_policy=recompute`)."""
    return json.dumps({
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": settings.to_extra(),
    })
