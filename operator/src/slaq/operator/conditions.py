"""Status conditions as `kubectl describe` shows them (pure helpers)."""

from __future__ import annotations

import datetime
from typing import Any


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, ok: bool | None, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    """A condition; `ok` None is status Unknown (the operator cannot tell yet)."""
    status = "Unknown" if ok is None else ("True" if ok else "False")
    cond: dict[str, Any] = {"type": type_, "status": status, "reason": reason, "message": message}
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def merge_conditions(old: list[dict[str, Any]] | None, new: list[dict[str, Any]], timestamp: str | None = None) -> list[dict[str, Any]]:
    """New conditions, keeping `lastTransitionTime` of those whose status did not change."""
    previous = {c.get("type"): c for c in old or []}
    stamp = timestamp or now()
    merged = []
    for cond in new:
        before = previous.get(cond["type"])
        same = before is not None and before.get("status") == cond["status"] and before.get("lastTransitionTime")
        merged.append({**cond, "lastTransitionTime": before["lastTransitionTime"] if same else stamp})
    return merged
