"""One test per touch point with vLLM internals (slaq.bench.engine_harness): an upgrade shows
exactly what broke."""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from slaq.api.common import Tier
from slaq.api.contract import RequestSLA
from slaq.bench import engine_harness as harness
from slaq.bench.clock import SIM_EPOCH, SimClock
from slaq.bench.policies import policy
from slaq.bench.runner import run_policy
from slaq.bench.workload import DEFAULT_OBJECTIVES, BenchRequest


def _scheduler(profile, policy_name: str = "fcfs"):
    return harness.build_scheduler(AsyncScheduler, harness.engine_setup(profile, policy_name))


def test_engine_setup_matches_the_profile(small_profile) -> None:
    setup = harness.engine_setup(small_profile, "priority")
    scheduler = harness.build_scheduler(AsyncScheduler, setup)
    assert scheduler.max_num_running_reqs == 32
    assert scheduler.max_num_scheduled_tokens == 2048
    assert scheduler.policy.value == "priority"
    assert setup.kv_cache_config.num_blocks == small_profile.num_gpu_blocks
    assert scheduler.max_model_len == 8192


def test_step_shares_and_deliveries_follow_a_request(small_profile) -> None:
    scheduler = _scheduler(small_profile)
    request = harness.make_request("r", 3000, max_tokens=100, arrival_time=SIM_EPOCH, priority=0, extra_args={})
    requests = {"r": request}
    with SimClock().installed():
        scheduler.add_request(request)
        first = scheduler.schedule()
        shares = list(harness.step_shares(first, requests))
        assert [(s.new_tokens, s.context_tokens, s.output_index) for s in shares] == [(2048, 0, None)]
        second = scheduler.schedule()  # async: scheduled before the first step's result
        assert [(s.new_tokens, s.context_tokens, s.output_index) for s in harness.step_shares(second, requests)] == [(952, 2048, 0)]
        out = scheduler.update_from_output(first, harness.model_runner_output(harness.scheduled_ids(first), {}))
        assert list(harness.deliveries(out)) == []
        third = scheduler.schedule()
        assert [(s.new_tokens, s.context_tokens, s.output_index) for s in harness.step_shares(third, requests)] == [(1, 3000, 1)]
        out = scheduler.update_from_output(second, harness.model_runner_output(["r"], {"r": harness.FILLER_TOKEN}))
        assert list(harness.deliveries(out)) == [("r", 1, False)]
        out = scheduler.update_from_output(third, harness.model_runner_output(["r"], {"r": harness.STOP_TOKEN}))
        assert list(harness.deliveries(out)) == [("r", 1, True)]
    assert harness.step_has_tokens(first) and harness.preemptions(request) == 0


def test_preempted_requests_still_deliver_exactly_their_tokens(small_profile) -> None:
    # 60 blocks of 16 tokens: six 300-token prompts that each grow by 300 tokens cannot all fit.
    engine = small_profile.engine.model_copy(update={"num_gpu_blocks": 60})
    tight = small_profile.model_copy(update={"engine": engine})
    requests = [BenchRequest(f"r{i}", 0.001 * i, 300, 300, "batch-0", Tier.BATCH) for i in range(6)]
    result = run_policy(policy("fcfs"), requests, tight, DEFAULT_OBJECTIVES)
    assert sum(r.preemptions for r in result.records) > 0
    assert all(r.finished and r.tokens_out == 300 for r in result.records)


def test_engine_gauges_are_what_the_engine_exports(small_profile) -> None:
    scheduler = _scheduler(small_profile)
    assert harness.engine_gauges(scheduler) == (0, 0, 0.0, None)  # stock vLLM: no waiting by tier
    for i in range(3):
        scheduler.add_request(harness.make_request(f"g{i}", 600, max_tokens=4, arrival_time=SIM_EPOCH, priority=0, extra_args={}))
    assert harness.engine_gauges(scheduler) == (3, 0, 0.0, None)
    scheduler.schedule()
    waiting, running, kv_usage, _ = harness.engine_gauges(scheduler)
    assert waiting + running == 3 and running >= 1 and 0.0 < kv_usage < 1.0


def test_slaqs_engine_reports_its_waiting_requests_by_tier_as_its_queue_depth_gauge_does(small_profile) -> None:
    from slaq.engine.scheduler import SLAScheduler

    scheduler = harness.build_scheduler(SLAScheduler, harness.engine_setup(small_profile, "priority"))
    for i, tier in enumerate((Tier.BATCH, Tier.BATCH, Tier.STANDARD)):
        sla = RequestSLA(tenant=f"{tier.value}-0", tier=tier, ttft_ms=2000.0, arrival=SIM_EPOCH, predicted_output=4)
        scheduler.add_request(harness.make_request(f"t{i}", 600, max_tokens=4, arrival_time=SIM_EPOCH, priority=tier.rank,
                                                   extra_args=sla.to_xargs()))
    assert harness.engine_gauges(scheduler) == (3, 0, 0.0, [0, 1, 2])


def test_a_kv_transfer_config_gives_the_scheduler_slaqs_connector_and_its_plans(small_profile) -> None:
    from slaq.bench.kv_swap import transfer_config

    plain = _scheduler(small_profile)
    assert harness.scheduler_connector(plain) is None
    setup = harness.engine_setup(small_profile, "fcfs", kv_transfer_config=transfer_config(small_profile))
    # the KV cache tensors say how many bytes a block holds: what the connector sizes its host cache by
    block_bytes = small_profile.model.kv_bytes_per_token * small_profile.engine.block_size
    assert sum(t.size for t in setup.kv_cache_config.kv_cache_tensors) == small_profile.num_gpu_blocks * block_bytes
    scheduler = harness.build_scheduler(AsyncScheduler, setup)
    connector = harness.scheduler_connector(scheduler)
    assert type(connector).__name__ == "SlaqKVConnector"
    assert connector.planner.swap.capacity_blocks == 2**30 // block_bytes  # the profile's 1 GiB
    request = harness.make_request("r", 100, max_tokens=10, arrival_time=SIM_EPOCH, priority=0, extra_args={})
    with SimClock().installed():
        scheduler.add_request(request)
        output = scheduler.schedule()
    plan = harness.connector_plan(output)
    assert plan is not None and plan.saves == [] and plan.loads == []
    assert harness.preempted_ids(output) == set()
    assert harness.connector_plan(plain.schedule()) is None
