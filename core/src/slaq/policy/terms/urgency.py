from slaq.policy.views import PoolView, RequestView


def urgency(request: RequestView, now: float, pool: PoolView) -> float:
    """1 / (1 + slack / objective): 0.5 on arrival, 1 once the TTFT deadline has passed."""
    if request.ttft_ms is None:
        return 0.0
    objective_s = request.ttft_ms / 1000.0
    slack_s = max(0.0, request.arrival + objective_s - now)
    return 1.0 / (1.0 + slack_s / objective_s)
