"""The settings of slaq's KV connector and the `--kv-transfer-config` that loads it.

Kept apart from connector.py and light to import: `slaq engine` plans its launch with these before
it sets `PROMETHEUS_MULTIPROC_DIR`, and prometheus_client (which connector.py brings in, with
vLLM) picks its value store when first imported; imported earlier, vLLM's own `vllm:*` series
would stay in the API server's memory and never reach `/metrics`.

Settings (`kv_connector_extra_config`, camelCase as slaq's launcher writes them):
`erase` (bool, default true), `hostCacheBytes` (int, default 0: no swap), `hostSealGbS` (the
host's seal and open throughput in GB/s, each way, that the swap rule charges a victim; default:
measured with the worker's own `Vault` when the engine starts, see swap.py), `swapChoice` (`cost`,
default: swap a victim only when that costs less than recomputing it; `always`: every victim that
fits), and the test hooks `inspectPath`, `tamperFlag` and `stepDelayS` (see worker.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

CONNECTOR_NAME = "SlaqKVConnector"
CONNECTOR_MODULE = "slaq.engine.kv_security.connector"


SWAP_CHOICES = ("cost", "always")


@dataclass(frozen=True)
class KVSecuritySettings:
    erase: bool = True
    host_cache_bytes: int = 0
    seal_gb_s: float | None = None  # None: measured at start
    swap_choice: str = "cost"
    inspect_path: str | None = None
    tamper_flag: str | None = None
    step_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.swap_choice not in SWAP_CHOICES:
            raise ValueError(f"{CONNECTOR_NAME}: swapChoice must be one of {', '.join(SWAP_CHOICES)}, not {self.swap_choice!r}")
        if self.seal_gb_s is not None and not self.seal_gb_s > 0:
            raise ValueError(f"{CONNECTOR_NAME}: hostSealGbS must be above 0 (GB/s), not {self.seal_gb_s!r}")
        if not self.step_delay_s >= 0:
            raise ValueError(f"{CONNECTOR_NAME}: stepDelayS must be 0 or more (seconds), not {self.step_delay_s!r}")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> "KVSecuritySettings":
        known = {"erase", "hostCacheBytes", "hostSealGbS", "swapChoice", "inspectPath", "tamperFlag", "stepDelayS"}
        unknown = set(extra) - known
        if unknown:
            raise ValueError(f"{CONNECTOR_NAME}: unknown setting(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        return cls(
            erase=bool(extra.get("erase", True)),
            host_cache_bytes=int(extra.get("hostCacheBytes", 0)),
            seal_gb_s=None if extra.get("hostSealGbS") is None else float(extra["hostSealGbS"]),
            swap_choice=str(extra.get("swapChoice", "cost")),
            inspect_path=extra.get("inspectPath"),
            tamper_flag=extra.get("tamperFlag"),
            step_delay_s=float(extra.get("stepDelayS", 0.0)),
        )

    def to_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"erase": self.erase, "hostCacheBytes": self.host_cache_bytes, "swapChoice": self.swap_choice}
        if self.seal_gb_s is not None:
            extra["hostSealGbS"] = self.seal_gb_s
        if self.inspect_path:
            extra["inspectPath"] = self.inspect_path
        if self.tamper_flag:
            extra["tamperFlag"] = self.tamper_flag
        if self.step_delay_s:
            extra["stepDelayS"] = self.step_delay_s
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
