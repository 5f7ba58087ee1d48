from slaq.policy.views import PoolView, RequestView


def length(request: RequestView, now: float, pool: PoolView) -> float:
    """Shorter requests (prompt plus predicted output) score higher."""
    total = request.prompt_tokens + request.predicted_output
    return 1.0 - min(1.0, total / max(1, pool.max_length_tokens))
