"""The pool's load, one definition for both containers: the fuller of the batch and the KV cache.

    load = max(busy slots / slot limit, KV cache usage), clipped to [0, 1]

The engine counts its running requests against `max_num_seqs`; the sidecar counts the requests it
has released and not yet seen finish against the same limit (the engine's batch capacity, learned
from its gauges, or the pool's `maxNumSeqs`), with the KV usage the engine last reported.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from slaq.policy.registry import Registry


@runtime_checkable
class Load(Protocol):
    """The pool's load in [0, 1] from its busy batch slots, their limit and the KV cache usage (None: unknown)."""

    def __call__(self, busy: int, limit: int, kv_usage: float | None) -> float: ...


def batch_or_kv(busy: int, limit: int, kv_usage: float | None) -> float:
    batch = busy / max(1, limit)
    return min(1.0, max(0.0, batch, kv_usage or 0.0))


LOADS: Registry[Load] = Registry("load", Load)
LOADS.register("batch-or-kv", batch_or_kv)
