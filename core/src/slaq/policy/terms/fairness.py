from slaq.policy.views import PoolView, RequestView


def fairness(request: RequestView, now: float, pool: PoolView) -> float:
    """Within a tier, tenants that received less service score higher (VTC, slaq.policy.accounting)."""
    return 1.0 - min(1.0, max(0.0, request.tenant_service_share))
