"""`slaq bench cluster`, suite-sized: a few pods, a short load, the controller's decisions asserted."""

from __future__ import annotations

import random

import pytest

from slaq.api.common import Tier
from slaq.bench.cluster_router import make_router
from slaq.bench.cluster_signals import SIGNALS, bench_pool, make_signal, parse_signals
from slaq.bench.cluster_sim import ClusterOptions, ClusterSimulator
from slaq.bench.cluster_workloads import cluster_workload
from slaq.bench.errors import WorkloadError
from slaq.bench.metrics import attained
from slaq.bench.pod import PodConfig
from slaq.bench.policies import policy
from slaq.bench.pool_profile import load_profile
from slaq.bench.workload import DEFAULT_OBJECTIVES, BenchRequest


@pytest.fixture(scope="module")
def profile():
    """The 32B TP=2 profile with a smaller engine: fewer objects per step, same cost model."""
    base = load_profile("h100x2-qwen3-32b")
    return base.model_copy(update={"engine": base.engine.model_copy(update={"max_num_seqs": 16, "max_num_batched_tokens": 4096})})


def _options(profile, **overrides) -> ClusterOptions:
    fields = dict(spec=policy("slaq"), profile=profile, pending_s=0.0, loading_s=10.0, max_drain_s=600.0)
    fields.update(overrides)
    return ClusterOptions(**fields)


def _poisson(rate: float, seconds: float, tier: Tier, *, prompt: int, output: int, start: float = 0.0, seed: int = 1,
             prefix: str = "r") -> list[BenchRequest]:
    rng, t, out = random.Random(seed), start, []
    while (t := t + rng.expovariate(rate)) < start + seconds:
        out.append(BenchRequest(f"{prefix}{len(out):05d}", round(t, 6), prompt, output, f"{tier.value}-0", tier))
    return out


class Scripted:
    """A controller that sets the replica count a script says (to test the pool, not the HPA)."""

    name = "scripted"

    def __init__(self, initial: int, script: list[tuple[float, int]]) -> None:
        self.initial_replicas = initial
        self.script = script

    def sync(self, now, current, pods, prometheus) -> int:
        wanted = self.initial_replicas
        for at, replicas in self.script:
            if now >= at:
                wanted = replicas
        return wanted


class _StartAt:
    """A signal started at `initial` ready pods instead of minReplicas."""

    def __init__(self, signal, initial: int) -> None:
        self.signal, self.initial_replicas, self.name = signal, initial, signal.name

    def sync(self, now, current, pods, prometheus) -> int:
        return self.signal.sync(now, current, pods, prometheus)


def _run(requests, signal, options, router: str = "service"):
    return ClusterSimulator(requests, DEFAULT_OBJECTIVES, signal, make_router(router), options).run()


def _peak(result, initial: int) -> int:
    return max([initial] + [e["to"] for e in result.scale_events])


def test_slaq_scales_out_while_a_protected_tier_is_at_risk_and_stops_at_max_replicas(profile) -> None:
    # Standard requests at about twice one pod's capacity for two minutes: the protected load asks
    # for more pods than the pool's maximum of 2, and the pool stops there.
    requests = _poisson(6.0, 120.0, Tier.STANDARD, prompt=2000, output=60)
    result = _run(requests, make_signal("slaq", bench_pool(2)), _options(profile))
    ups = [e for e in result.scale_events if e["to"] > e["from"]]
    assert ups and ups[0]["at_s"] <= 60.0  # within the first syncs of the overload
    assert _peak(result, 1) == 2  # maxReplicas
    assert all(e["to"] <= 2 for e in result.scale_events)
    assert sum(1 for p in result.pods) == 2  # never more pods than the maximum
    assert not result.lost


def test_slaq_does_not_scale_for_a_batch_only_backlog_where_queue_depth_does(profile) -> None:
    # Batch work only (no TTFT objective near): a backlog that waits well inside its 60 s.
    requests = _poisson(8.0, 60.0, Tier.BATCH, prompt=2000, output=60, seed=2)
    slaq = _run(requests, make_signal("slaq", bench_pool(3)), _options(profile))
    assert slaq.scale_events == []
    waits = [r.ttft_s for r in slaq.records if r.ttft_s is not None]
    assert max(waits) > 5.0  # there was a backlog
    # Negative control: the queue-depth HPA, same pool and workload, scales out for it.
    queue = _run(requests, make_signal("queue-depth", bench_pool(3)), _options(profile))
    assert any(e["to"] > e["from"] for e in queue.scale_events)


def test_a_draining_pod_finishes_what_it_holds(profile) -> None:
    # Two pods busy with long requests; at 30 s the pool goes to one: the newer pod drains.
    requests = _poisson(3.0, 40.0, Tier.STANDARD, prompt=1000, output=400, seed=3)
    sim = ClusterSimulator(requests, DEFAULT_OBJECTIVES, Scripted(2, [(30.0, 1)]), make_router("service"), _options(profile))
    result = sim.run()
    down = next(e for e in result.scale_events if e["to"] < e["from"])
    drained = next(p for p in result.pods if p["name"] == "pod-2")
    assert drained["state"] == "gone"
    assert drained["ended_s"] > down["at_s"] + 1.0  # it ran on after the scale-down ...
    held = [r for r in result.records if sim.routed_to[r.request_id] == "pod-2" and r.arrival_s < down["at_s"]
            and (r.last_token_s or 0.0) > down["at_s"]]
    assert held and all(r.finished for r in held)  # ... finishing what it held at the time
    assert not result.lost
    assert not any(sim.routed_to[r.request_id] == "pod-2" for r in result.records if r.arrival_s > down["at_s"])  # no new work
    assert all(r.finished for r in result.records)


def test_a_drain_past_its_timeout_loses_what_is_left_and_says_so(profile) -> None:
    requests = _poisson(3.0, 40.0, Tier.STANDARD, prompt=1000, output=400, seed=3)
    result = _run(requests, Scripted(2, [(30.0, 1)]), _options(profile, drain_timeout_s=1.0))
    assert result.lost and set(result.lost.values()) == {"drain timeout"}


def test_a_failed_pod_loses_what_it_held_and_is_replaced(profile) -> None:
    requests = _poisson(3.0, 60.0, Tier.STANDARD, prompt=1000, output=200, seed=4)
    result = _run(requests, make_signal("static", bench_pool(2)), _options(profile, fail_at_s=20.0))
    assert result.failure is not None and result.failure["lost"] == len(result.lost) > 0
    assert set(result.lost.values()) == {"pod failed"}
    assert any(p["state"] == "failed" for p in result.pods) and len(result.pods) == 3  # replaced
    served = [r for r in result.records if r.request_id not in result.lost]
    assert all(r.finished for r in served)


def test_gateway_router_reads_scraped_metrics_and_spreads_load(profile) -> None:
    requests = _poisson(4.0, 30.0, Tier.STANDARD, prompt=1000, output=100, seed=5)
    sim = ClusterSimulator(requests, DEFAULT_OBJECTIVES, make_signal("static", bench_pool(3)), make_router("gateway"), _options(profile))
    result = sim.run()
    per_pod = {}
    for rid, pod in sim.routed_to.items():
        per_pod[pod] = per_pod.get(pod, 0) + 1
    assert len(per_pod) == 3 and min(per_pod.values()) > 0.15 * len(requests)
    assert sum(attained(r, DEFAULT_OBJECTIVES[r.tier]) for r in result.records) > 0


def test_the_published_ramp_has_its_stages_and_shape() -> None:
    workload = cluster_workload("wva-ramp")
    assert [s[2] for s in workload.stages] == [2.0, 4.0, 6.0, 8.0, 10.0, 4.0, 1.0]
    assert workload.stages[-1][1] == 2430.0
    assert abs(len(workload.requests) - 12480) < 300  # Poisson around the published 12,480
    assert {(r.prompt_tokens, r.output_tokens) for r in workload.requests} == {(4000, 1000)}
    tiers = cluster_workload("wva-ramp-tiers", time_scale=0.1)
    assert {r.tier for r in tiers.requests} == set(Tier)


def test_cli_names_a_bad_signal_and_runs_a_tiny_ramp(tmp_path, capsys) -> None:
    import json

    from slaq.cli import main

    assert main(["bench", "cluster", "--signals", "slaq,cpu", "--quiet"]) == 2
    assert "unknown signal(s) cpu" in capsys.readouterr().err
    assert main(["bench", "cluster", "--signals", "slaq", "--target-protected-load", "3", "--quiet"]) == 2
    assert "--target-protected-load must be in (0, 2]" in capsys.readouterr().err
    assert main(["bench", "cluster", "--signals", "slaq", "--scale-down-window", "-1", "--quiet"]) == 2
    assert "--scale-down-window must be in [0, 3600]" in capsys.readouterr().err
    out = tmp_path / "report.json"
    assert main(["bench", "cluster", "--workload", "wva-ramp-tiers", "--time-scale", "0.02", "--signals", "static",
                 "--max-replicas", "2", "--quiet", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    static = report["signals"]["static"]
    assert set(static["tiers"]) == {"critical", "standard", "batch"}
    assert static["replicas"] == {"mean": 2.0, "peak": 2} and static["gpu_hours"] > 0
    assert report["target_protected_load"] == 0.5 and report["scale_down_window_s"] == 300  # the CRD's defaults
    assert 0.0 <= static["attainment"] <= 1.0 and static["timeline"]
    # The report carries its envelope and schema, and docs/results.md renders it.
    from slaq.bench.results import check_report, render_section

    check_report("report.json", report)
    assert report["schema"] == "slaq.bench.cluster/v1" and report["run"]["date"]
    section = "\n".join(render_section("cluster-tiny", report))
    assert "| `static` | " in section and "critical / standard / batch attained" in section
    assert "`scaleDownStabilizationSeconds` 300" in section
    from slaq.bench.plots import main as plot

    png = tmp_path / "timeline.png"
    assert plot(["cluster-timeline", str(out), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_refusal_the_client_retries_goes_back_through_the_router(profile) -> None:
    # A sidecar queue of 2 refuses a burst at the door (queue_full, Retry-After); the client's
    # retry reaches the pool's router again, which may pick the other pod.
    requests = [BenchRequest(f"b{i:03d}", 0.01 * i, 2000, 50, "standard-0", Tier.STANDARD) for i in range(40)]
    sim = ClusterSimulator(requests, DEFAULT_OBJECTIVES, make_signal("static", bench_pool(2)), make_router("least-request"),
                           _options(profile, pod=PodConfig(max_queue_depth=2, engine_queue_target=1)))
    result = sim.run()
    retried = [r for r in result.records if r.client_retries > 0]
    assert retried
    assert all(len(sim.routes[r.request_id]) == 1 + r.client_retries for r in retried)
    assert any(len(set(sim.routes[r.request_id])) > 1 for r in retried)  # a retry reached the other pod
    assert all(r.finished or r.refused_status is not None for r in result.records)


def test_slaq_scales_down_to_the_pods_the_protected_load_needs_and_no_further(profile) -> None:
    # A steady standard load on a pool started at its maximum: the HPA removes the pods the load
    # does not need and stops where the rest still hold it, the protected tier within objective.
    requests = _poisson(3.0, 300.0, Tier.STANDARD, prompt=1000, output=200, seed=6)
    pool = bench_pool(4, min_replicas=1, scale_down_stabilization_s=30)
    result = _run(requests, _StartAt(make_signal("slaq", pool), 4), _options(profile))
    assert any(e["to"] < e["from"] for e in result.scale_events)
    assert min(e["to"] for e in result.scale_events) == 2  # not to minReplicas: 0.3-0.4 per pod of 2 asks for 2 at 0.5
    late = [r for r in result.records if r.arrival_s > 200.0]
    assert late and all(attained(r, DEFAULT_OBJECTIVES[r.tier]) for r in late)


class _Pod:
    """A pod as the router sees it: a name and what its /metrics said at the last scrape."""

    def __init__(self, name: str, pending: int, kv: float) -> None:
        self.name, self.pending, self.kv = name, pending, kv
        self.metrics = None

    def scrape(self):
        from slaq.bench.cluster_pod import PodMetrics

        self.metrics = PodMetrics(0.0, 0.0, 30, self.kv, 10, 0.5, self.pending)  # scraped at 0 s
        return self.metrics


def test_the_slaq_gateway_steers_from_a_pod_with_a_protected_prompt_pending() -> None:
    # docs/gateway.md's picker: the queue scorer on slaq_protected_prompts_pending, no KV scorer.
    busy, full, empty = _Pod("busy", 1, 0.1), _Pod("full", 0, 0.95), _Pod("empty", 0, 0.0)
    router = make_router("gateway-slaq")
    picks = [router.pick([busy, full, empty], now=0.0).name for _ in range(6)]
    assert "busy" not in picks and picks.count("full") == picks.count("empty") == 3  # ties in turn, whatever their KV
    busy.pending = 0  # its prompt started: the picker sees it at its next metrics refresh, not before
    assert "busy" not in {router.pick([busy, full, empty], now=0.01).name for _ in range(3)}
    assert "busy" in {router.pick([busy, full, empty], now=1.0).name for _ in range(3)}
    # The stock picker's KV scorer would have sent all six to the empty pod.
    stock = make_router("gateway")
    assert {stock.pick([busy, full, empty], now=0.0).name for _ in range(6)} == {"empty"}


def test_behind_the_slaq_gateway_a_critical_prompt_does_not_queue_behind_another(profile) -> None:
    # Two warm pods. A critical request, a batch one, then a second critical request while the first
    # one's 4,000-token prefill (~0.3 s here) still runs: a Service's round-robin sends the second to
    # the first one's pod, where it waits for that prefill; the picker on slaq_protected_prompts_pending
    # sends it to the other pod.
    requests = [BenchRequest("c1", 1.0, 4000, 50, "critical-0", Tier.CRITICAL), BenchRequest("b1", 1.01, 500, 50, "batch-0", Tier.BATCH),
                BenchRequest("c2", 1.15, 4000, 50, "critical-0", Tier.CRITICAL)]
    ttft = {}
    for router in ("service", "gateway-slaq"):
        sim = ClusterSimulator(requests, DEFAULT_OBJECTIVES, make_signal("static", bench_pool(2)), make_router(router), _options(profile))
        result = sim.run()
        routes = {rid: sim.routed_to[rid] for rid in ("c1", "c2")}
        ttft[router] = {r.request_id: r.ttft_s for r in result.records if r.tier is Tier.CRITICAL}
        assert (routes["c1"] == routes["c2"]) is (router == "service")
    assert ttft["gateway-slaq"]["c2"] < ttft["service"]["c2"] - 0.1  # it no longer waits for c1's prefill
    assert ttft["gateway-slaq"]["c1"] == pytest.approx(ttft["service"]["c1"])


def test_the_slaq_gateway_is_refused_in_front_of_stock_pods(capsys) -> None:
    from slaq.cli import main

    assert main(["bench", "cluster", "--stock", "--router", "gateway-slaq", "--signals", "static", "--quiet"]) == 2
    assert "stock vLLM pods do not export" in capsys.readouterr().err


def test_the_clairvoyant_bound_orders_pods_a_lead_ahead_and_scales_down_when_a_stage_ends() -> None:
    stages = ((0.0, 100.0, 2.0), (100.0, 200.0, 6.0), (200.0, 300.0, 1.0))
    bound = make_signal("clairvoyant", bench_pool(8), stages=stages, lead_s=30.0, pod_rps=1.25)
    assert bound.initial_replicas == 2  # 2 requests/s at 1.25 a pod
    assert [bound.sync(t, 0, [], None) for t in (69.0, 71.0, 150.0, 199.0, 200.0, 400.0)] == [2, 5, 5, 5, 1, 1]
    assert make_signal("clairvoyant", bench_pool(8), stages=stages, lead_s=0.0, pod_rps=0.5).sync(150.0, 0, [], None) == 8  # max
    assert make_signal("clairvoyant", bench_pool(8, min_replicas=3), stages=stages, lead_s=0.0).sync(250.0, 0, [], None) == 3
    with pytest.raises(WorkloadError, match="--clairvoyant-pod-rps must be positive"):
        make_signal("clairvoyant", bench_pool(8), stages=stages, pod_rps=0.0)
    assert "clairvoyant" in parse_signals("slaq,clairvoyant") and "clairvoyant" not in SIGNALS  # named, never by default


def test_the_cli_reports_the_clairvoyant_bound_with_its_pod_rate_and_lead(tmp_path, capsys) -> None:
    import json

    from slaq.bench.results import render_section
    from slaq.cli import main

    assert main(["bench", "cluster", "--signals", "clairvoyant", "--clairvoyant-pod-rps", "0", "--quiet"]) == 2
    assert "--clairvoyant-pod-rps must be positive" in capsys.readouterr().err
    out = tmp_path / "report.json"
    assert main(["bench", "cluster", "--time-scale", "0.02", "--signals", "clairvoyant", "--pending", "1", "--loading", "2",
                 "--clairvoyant-pod-rps", "5", "--quiet", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["clairvoyant"] == {"pod_rps": 5.0, "lead_s": 18.0}  # the cold start and a sync period
    assert report["signals"]["clairvoyant"]["replicas"]["peak"] == 2  # 10 requests/s at 5 a pod
    assert "`clairvoyant` is a bound, not a scaler" in "\n".join(render_section("cluster-bound", report))
