"""Names and labels of everything the operator creates for a pool.

One place decides them, so the Deployment's selector, the Service, the PDB, the HPA's
scale target and the pool's `status.selector` can never disagree.
"""

from __future__ import annotations

from slaq.api.common import GROUP

MANAGER = "slaq-operator"  # server-side apply field manager and app.kubernetes.io/managed-by
FINALIZER = f"{GROUP}/finalizer"  # kopf's finalizer on pools (and, in earlier versions, on TenantSLAs)
POOL_LABEL = f"{GROUP}/pool"
TABLE_SUFFIX = "-tenants"
SALT_SECRET_NAME = "slaq-cache-salt-key"
SALT_SECRET_KEY = "key"


def pool_selector_labels(pool_name: str) -> dict[str, str]:
    """The labels that select a pool's pods (immutable once a Deployment exists)."""
    return {"app.kubernetes.io/name": "slaq", POOL_LABEL: pool_name}


def pool_labels(pool_name: str) -> dict[str, str]:
    """Labels on every object the operator creates for a pool."""
    return {
        **pool_selector_labels(pool_name),
        "app.kubernetes.io/instance": pool_name,
        "app.kubernetes.io/component": "inference",
        "app.kubernetes.io/managed-by": MANAGER,
    }


def selector_string(labels: dict[str, str]) -> str:
    """A label selector in the string form `status.selector` and the scale subresource use."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def table_secret_name(pool_name: str, part: int = 0) -> str:
    """The Secret holding part `part` of the pool's tenant table (part 0: the only one, or the first)."""
    return f"{pool_name}{TABLE_SUFFIX}" + (f"-{part}" if part else "")
