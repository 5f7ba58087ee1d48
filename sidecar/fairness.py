"""Recent service per tenant within its tier, for the score's fairness term (VTC-style).

Service is counted in tokens (prompt + output) and decays exponentially with `half_life_s`, so
a tenant that was served a lot a minute ago is not penalised forever.
"""

from __future__ import annotations

import math

from slaq.api.common import Tier


class ServiceLedger:
    def __init__(self, half_life_s: float = 60.0) -> None:
        self._decay = math.log(2.0) / half_life_s
        self._tenant: dict[str, tuple[float, float]] = {}  # name -> (service, stamp)
        self._tier: dict[Tier, tuple[float, float]] = {}

    def _decayed(self, value: tuple[float, float] | None, now: float) -> float:
        if value is None:
            return 0.0
        service, stamp = value
        return service * math.exp(-self._decay * max(0.0, now - stamp))

    def record(self, tenant: str, tier: Tier, tokens: int, now: float) -> None:
        self._tenant[tenant] = (self._decayed(self._tenant.get(tenant), now) + tokens, now)
        self._tier[tier] = (self._decayed(self._tier.get(tier), now) + tokens, now)

    def share(self, tenant: str, tier: Tier, now: float) -> float:
        """This tenant's fraction of its tier's recent service, in [0, 1]; 0 when the tier was idle."""
        total = self._decayed(self._tier.get(tier), now)
        if total <= 0.0:
            return 0.0
        return min(1.0, self._decayed(self._tenant.get(tenant), now) / total)
