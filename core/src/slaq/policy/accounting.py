"""Tenant service accounting within a tier: virtual token counters (VTC, Sheng et al. 2024).

Each tenant's counter grows by the tokens served to it (the engine charges what it schedules, the
sidecar what a finished request used). A tenant whose counter is small relative to the others of
its tier has received less service and scores higher on the fairness term. A tenant that
(re)appears after being idle starts at the tier's current minimum, so idleness banks no credit.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol, runtime_checkable

from slaq.policy.registry import Registry


@runtime_checkable
class Accounting(Protocol):
    """Service counted per tenant within a tier, and each tenant's share of it (the fairness term's input)."""

    def charge(self, tier: str, tenant: str, tokens: float) -> None: ...
    def service_share(self, tier: str, tenant: str) -> float: ...
    def forget(self, tier: str, tenant: str) -> None: ...
    def version(self, tier: str) -> int:
        """A number that changes whenever a share of the tier may have changed (a queue refreshes its
        keys only then)."""
        ...


class VirtualTokenCounters:
    def __init__(self) -> None:
        self._counters: dict[str, dict[str, float]] = defaultdict(dict)  # tier -> tenant -> tokens
        self._totals: dict[str, float] = defaultdict(float)
        self._versions: dict[str, int] = defaultdict(int)  # tier -> charges and forgets so far

    def version(self, tier: str) -> int:
        return self._versions.get(tier, 0)

    def charge(self, tier: str, tenant: str, tokens: float) -> None:
        self._versions[tier] += 1
        counters = self._counters[tier]
        if tenant not in counters:
            counters[tenant] = min(counters.values(), default=0.0)
            self._totals[tier] += counters[tenant]
        counters[tenant] += tokens
        self._totals[tier] += tokens

    def service_share(self, tier: str, tenant: str) -> float:
        """This tenant's share of its tier's counted service, in [0, 1]; 0 for an unseen tenant."""
        total = self._totals.get(tier, 0.0)
        if total <= 0.0:
            return 0.0
        return min(1.0, self._counters[tier].get(tenant, 0.0) / total)

    def forget(self, tier: str, tenant: str) -> None:
        counters = self._counters.get(tier)
        if counters and tenant in counters:
            self._versions[tier] += 1
            self._totals[tier] -= counters.pop(tenant)


ACCOUNTS: Registry[type[Accounting]] = Registry("accounting", Accounting)
ACCOUNTS.register("vtc", VirtualTokenCounters)
