from typing import Mapping

from slaq.api.common import Tier
from slaq.policy.views import PoolView, RequestView

TIER_VALUE: Mapping[Tier, float] = {Tier.CRITICAL: 1.0, Tier.STANDARD: 0.5, Tier.BATCH: 0.0}


def tier(request: RequestView, now: float, pool: PoolView) -> float:
    return TIER_VALUE[request.tier]
