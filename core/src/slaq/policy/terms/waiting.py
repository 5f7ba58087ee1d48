from slaq.policy.views import PoolView, RequestView


def waiting(request: RequestView, now: float, pool: PoolView) -> float:
    """Aging: grows linearly with waiting time and saturates at the aging bound."""
    return min(1.0, max(0.0, now - request.arrival) / pool.aging_bound_s)
