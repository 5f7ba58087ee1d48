"""The standalone scheduler helpers, under the name the engine tests use, and a bare waiting queue."""

from __future__ import annotations

from slaq.api.contract import RequestSLA
from slaq.api.pool import SchedulerSpec
from slaq.engine import vllm_compat as vc
from slaq.engine.ordering import WaitingOrder
from slaq.engine.queue import SLARequestQueue
from slaq.engine.sla import request_info
from slaq.engine.standalone import BLOCK_SIZE, Driver, build_scheduler, free_blocks, make_request
from slaq.policy import PodPolicy

__all__ = ["BLOCK_SIZE", "Driver", "build_scheduler", "free_blocks", "make_request", "waiting_queue"]


def waiting_queue(spec: SchedulerSpec, policy: PodPolicy, *, max_length_tokens: int, load: float = 0.0) -> SLARequestQueue:
    """The engine's waiting queue without a scheduler: SLA facts attached from each request's extra_args."""
    order = WaitingOrder(policy, max_length_tokens=max_length_tokens)
    order.set_load(load)

    def info_of(request):
        info = vc.attached_info(request)
        if info is None:
            info = request_info(RequestSLA.from_extra_args(vc.extra_args(request)), arrival=request.arrival_time,
                                prompt_tokens=request.num_prompt_tokens, max_tokens=request.max_tokens, aging_bound_s=spec.aging_bound_seconds)
            vc.attach_info(request, info)
        return info

    return SLARequestQueue(order, info_of)
