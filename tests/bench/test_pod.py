"""`slaq bench sim --pod`: the real sidecar core in front of the simulated engine."""

from __future__ import annotations

import pytest

from slaq.api.common import Tier
from slaq.api.contract import RequestSLA
from slaq.api.table import ReplicaShare
from slaq.bench.benchmark import WorkloadSpec, run_benchmark
from slaq.bench.clock import SIM_EPOCH
from slaq.bench.metrics import WALL_CLOCK_KEYS, policy_figures
from slaq.bench.pod import PodConfig
from slaq.bench.policies import policy
from slaq.bench.runner import run_policy
from slaq.bench.workload import DEFAULT_OBJECTIVES, BenchRequest

from .conftest import SAMPLE_TRACE


def _request(rid: str, at: float, prompt: int, output: int, tenant: str = "standard-0", tier: Tier = Tier.STANDARD) -> BenchRequest:
    return BenchRequest(rid, at, prompt, output, tenant, tier)


def _strip_wall_clock(report: dict) -> dict:
    for figures in report["policies"].values():
        for key in WALL_CLOCK_KEYS:
            figures.pop(key, None)
    return report


def test_pod_mode_is_deterministic_and_puts_only_slaq_behind_the_sidecar(small_profile) -> None:
    workload = WorkloadSpec(trace=SAMPLE_TRACE, requests=150, seed=1)
    policies = [policy("fcfs"), policy("slaq")]
    one = _strip_wall_clock(run_benchmark(workload, small_profile, policies, [2.0], capacity_rps=6.0, pod=PodConfig()))
    two = _strip_wall_clock(run_benchmark(workload, small_profile, policies, [2.0], capacity_rps=6.0, pod=PodConfig()))
    assert one == two
    assert one["mode"] == "pod" and one["pod"]["engine_queue_target"] == 16
    fcfs, slaq = one["policies"]["fcfs"], one["policies"]["slaq"]
    assert fcfs["behind_sidecar"] is False and slaq["behind_sidecar"] is True
    # At twice the capacity the sidecar holds requests back: the queue path ran, and still alike.
    assert max(slaq["tiers"][t.value]["sidecar_wait_p99_s"] or 0.0 for t in Tier) > 0.0
    assert fcfs["tiers"]["batch"]["sidecar_wait_p99_s"] is None
    engine_only = _strip_wall_clock(run_benchmark(workload, small_profile, policies, [2.0], capacity_rps=6.0))
    assert engine_only["mode"] == "engine" and engine_only["policies"]["fcfs"] == fcfs  # stock pods have no sidecar
    assert engine_only["policies"]["slaq"] != slaq


def test_a_request_held_in_the_sidecar_counts_its_wait_in_ttft(small_profile) -> None:
    # Engine-side queue target 1: the second and third request wait in the sidecar until the one
    # before them has its first token.
    requests = [_request(f"r{i}", 0.0, 1500, 4) for i in range(3)]
    result = run_policy(policy("slaq"), requests, small_profile, DEFAULT_OBJECTIVES, pod=PodConfig(engine_queue_target=1))
    records = {r.request_id: r for r in result.records}
    assert all(r.finished for r in records.values())
    first, held = records["r0"], records["r2"]
    assert first.sidecar_wait_s == 0.0
    assert held.released_s >= records["r1"].first_token_s > 0.0  # released only after r1's first token
    assert held.sidecar_wait_s == pytest.approx(held.released_s) and held.sidecar_wait_s > 0.0
    # TTFT runs from the arrival at the sidecar, so the wait there is part of it.
    assert held.ttft_s == pytest.approx(held.first_token_s - held.arrival_s)
    assert held.ttft_s > held.sidecar_wait_s + (first.ttft_s or 0.0) * 0.5
    figures = policy_figures(result, DEFAULT_OBJECTIVES)["tiers"]["standard"]
    assert figures["ttft_p99_s"] == pytest.approx(held.ttft_s, abs=1e-6)


def test_the_engine_gets_the_sidecars_enrichment_stamped_in_simulated_time(small_profile, monkeypatch) -> None:
    from slaq.bench import runner

    seen: dict[str, RequestSLA] = {}
    original = runner._configured

    def probe(scheduler_cls, pod):
        configured = original(scheduler_cls, pod)

        class Probe(configured):  # type: ignore[misc, valid-type]
            def add_request(self, request):
                seen[request.request_id] = RequestSLA.from_extra_args(request.sampling_params.extra_args)
                super().add_request(request)
        return Probe

    monkeypatch.setattr(runner, "_configured", probe)
    requests = [_request("a", 0.0, 800, 3), _request("b", 2.5, 300, 3, "critical-1", Tier.CRITICAL)]
    run_policy(policy("slaq"), requests, small_profile, DEFAULT_OBJECTIVES, pod=PodConfig())
    # The sidecar core read the simulator's clock (the arrival stamps), never the wall clock, and
    # sent its own output-length prediction (the prior: nothing has finished yet).
    assert seen["a"].arrival == SIM_EPOCH and seen["b"].arrival == SIM_EPOCH + 2.5
    assert (seen["b"].tenant, seen["b"].tier, seen["b"].ttft_ms) == ("critical-1", Tier.CRITICAL, 500.0)
    assert seen["a"].predicted_output == 256


def test_quota_refusals_are_reported_not_dropped(small_profile) -> None:
    requests = [_request(f"q{i}", 0.1 * i, 200, 3) for i in range(5)] + [_request("other", 0.0, 200, 3, "standard-1")]
    quota = {"standard-0": ReplicaShare(requests_per_minute=2)}
    result = run_policy(policy("slaq"), requests, small_profile, DEFAULT_OBJECTIVES, pod=PodConfig(quotas=quota, client_retries=0))
    records = {r.request_id: r for r in result.records}
    assert [records[f"q{i}"].refused_status for i in range(5)] == [None, None, 429, 429, 429]
    assert {records[f"q{i}"].refused_reason for i in (2, 3, 4)} == {"request_rate"}
    assert records["other"].finished and records["other"].refused_status is None
    figures = policy_figures(result, DEFAULT_OBJECTIVES)
    assert figures["refused"] == 3 and figures["refusals"] == {"429 request_rate": 3}
    assert figures["unfinished"] == 0 and figures["tokens"]["undelivered_output"] == 9
    standard = figures["tiers"]["standard"]
    assert standard["requests"] == 6 and standard["attainment"] == pytest.approx(3 / 6)
    assert standard["completed_fraction"] == pytest.approx(3 / 6)
    assert standard["tenants"]["standard-0"] == pytest.approx(2 / 5)


def test_clients_retry_a_429_after_its_retry_after(small_profile) -> None:
    requests = [_request("q0", 0.0, 200, 3), _request("q1", 0.1, 200, 3)]
    quota = {"standard-0": ReplicaShare(requests_per_minute=1)}
    result = run_policy(policy("slaq"), requests, small_profile, DEFAULT_OBJECTIVES, pod=PodConfig(quotas=quota, client_retries=2))
    retried = {r.request_id: r for r in result.records}["q1"]
    assert retried.finished and retried.client_retries == 1 and retried.refused_status is None
    # The bucket refills one request a minute: the retry comes ~60 s later, and its TTFT says so.
    assert retried.ttft_s > 59.0 and retried.sidecar_wait_s > 59.0
    figures = policy_figures(result, DEFAULT_OBJECTIVES)
    assert figures["client_retries"] == 1 and figures["refused"] == 0 and figures["tiers"]["standard"]["attainment"] == 0.5


def test_quota_for_an_unknown_tenant_is_named(small_profile) -> None:
    from slaq.bench.errors import WorkloadError

    with pytest.raises(WorkloadError, match="nobody"):
        run_policy(policy("slaq"), [_request("a", 0.0, 10, 2)], small_profile, DEFAULT_OBJECTIVES,
                   pod=PodConfig(quotas={"nobody": ReplicaShare(requests_per_minute=1)}))


def test_pod_flags_are_checked(capsys) -> None:
    from slaq.bench.cli import parse_quotas
    from slaq.bench.errors import WorkloadError
    from slaq.cli import main

    assert parse_quotas(["batch-0:rpm=30,tpm=5000,concurrency=2"]) == {
        "batch-0": ReplicaShare(requests_per_minute=30, tokens_per_minute=5000, max_concurrency=2)}
    with pytest.raises(WorkloadError, match="unknown field 'rps'"):
        parse_quotas(["batch-0:rps=3"])
    with pytest.raises(WorkloadError, match="requests_per_minute"):
        parse_quotas(["batch-0:rpm=-1"])
    assert main(["bench", "sim", "--quota", "batch-0:rpm=3", "--policies", "slaq", "--quiet"]) == 2
    assert "--quota needs --pod" in capsys.readouterr().err
