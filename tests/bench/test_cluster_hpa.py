"""The simulated HPA controller against the algorithm the Kubernetes documentation specifies."""

from __future__ import annotations

import pytest

from slaq.api.pool import InferencePool
from slaq.bench.cluster_hpa import (
    HorizontalController,
    HpaConfig,
    MetricSource,
    PodPhase,
    PodSample,
    PolicyType,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    external_per_pod_replicas,
    parse_quantity,
    pods_metric_replicas,
)
from slaq.bench.errors import WorkloadError
from slaq.operator.children import render_hpa


def _pods(*values: float | None, phase: PodPhase = PodPhase.RUNNING) -> list[PodSample]:
    return [PodSample(f"p{i}", phase, v) for i, v in enumerate(values)]


def _config(**overrides) -> HpaConfig:
    fields = dict(min_replicas=1, max_replicas=10, metric="m", target_average=1.0,
                  scale_up=ScalingRules(0, (ScalingPolicy(PolicyType.PODS, 100, 15),)),
                  scale_down=ScalingRules(0, (ScalingPolicy(PolicyType.PODS, 100, 15),)))
    fields.update(overrides)
    return HpaConfig(**fields)


def test_desired_is_ceil_of_current_times_ratio_of_the_average() -> None:
    # Average 1.5 over 4 pods against a target of 1.0: ceil(4 * 1.5) = 6.
    assert pods_metric_replicas(_pods(1.0, 2.0, 1.0, 2.0), 4, 1.0) == 6
    # Average 0.25 against 1.0 on 4 pods: ceil(1.0) = 1.
    assert pods_metric_replicas(_pods(0.25, 0.25, 0.25, 0.25), 4, 1.0) == 1


def test_a_ratio_within_the_tolerance_does_not_scale_and_just_outside_it_does() -> None:
    assert pods_metric_replicas(_pods(1.09, 1.09), 2, 1.0) == 2
    assert pods_metric_replicas(_pods(0.91, 0.91), 2, 1.0) == 2
    assert pods_metric_replicas(_pods(1.2, 1.2), 2, 1.0) == 3
    assert pods_metric_replicas(_pods(0.8, 0.8, 0.8, 0.8, 0.8), 5, 1.0) == 4


def test_missing_metrics_count_as_zero_on_scale_up_and_target_on_scale_down() -> None:
    # Two reporting pods at 2.0 (ratio 2) and two missing: counted as 0, ratio 1.0 -> within tolerance, no scale.
    assert pods_metric_replicas(_pods(2.0, 2.0, None, None), 4, 1.0) == 4
    # At 3.0 the recomputed ratio is 1.5 over 4 pods: 6.
    assert pods_metric_replicas(_pods(3.0, 3.0, None, None), 4, 1.0) == 6
    # Scale-down: two at 0.0 and two missing counted at the target: ratio 0.5 over 4 -> 2.
    assert pods_metric_replicas(_pods(0.0, 0.0, None, None), 4, 1.0) == 2
    # Without the missing pods the same two would have asked for 1 (negative control).
    assert pods_metric_replicas(_pods(0.0, 0.0), 2, 1.0) == 0


def test_pending_pods_dampen_a_scale_up_and_are_ignored_otherwise() -> None:
    pods = _pods(3.0, 3.0) + [PodSample("new", PodPhase.PENDING, None)]
    # Ratio 3.0 over the two running pods; the pending one counts 0: average 2.0 over 3 -> 6.
    assert pods_metric_replicas(pods, 3, 1.0) == 6
    # A scale-down ignores pending pods: average 0.5 over the two running -> 1.
    pods = _pods(0.5, 0.5) + [PodSample("new", PodPhase.PENDING, None)]
    assert pods_metric_replicas(pods, 3, 1.0) == 1
    # Deleting (draining) and failed pods are not counted at all.
    pods = _pods(2.0) + [PodSample("old", PodPhase.DELETING, 0.0), PodSample("dead", PodPhase.FAILED, 0.0)]
    assert pods_metric_replicas(pods, 3, 1.0) == 2


def test_no_metric_at_all_leaves_the_scale_alone() -> None:
    controller = HorizontalController(_config())
    assert pods_metric_replicas(_pods(None, None), 2, 1.0) is None
    assert controller.reconcile(0.0, 2, _pods(None, None)) == 2
    assert controller.events == []


def test_external_average_value_is_ceil_of_sum_over_target() -> None:
    assert external_per_pod_replicas(4.5, 3, 0.8) == 6  # ceil(4.5 / 0.8)
    assert external_per_pod_replicas(2.5, 3, 0.8) == 3  # 2.5 / 2.4 within tolerance
    assert external_per_pod_replicas(None, 3, 0.8) is None


def test_scale_down_waits_for_the_highest_recommendation_of_the_window() -> None:
    controller = HorizontalController(_config(scale_down=ScalingRules(300, (ScalingPolicy(PolicyType.PERCENT, 100, 15),))))
    assert controller.reconcile(0.0, 4, _pods(1.0, 1.0, 1.0, 1.0)) == 4
    # From 15 s the metric asks for 1 replica, but 4 was recommended within the last 300 s.
    now, replicas = 15.0, 4
    while now < 300.0:
        assert controller.reconcile(now, replicas, _pods(0.1, 0.1, 0.1, 0.1)) == 4
        now += 15.0
    assert controller.reconcile(315.0, 4, _pods(0.1, 0.1, 0.1, 0.1)) == 1


def test_the_scale_down_window_is_primed_with_the_current_count() -> None:
    controller = HorizontalController(_config(scale_down=ScalingRules(300, (ScalingPolicy(PolicyType.PERCENT, 100, 15),))))
    assert controller.reconcile(0.0, 4, _pods(0.1, 0.1, 0.1, 0.1)) == 4  # the first sync remembers 4
    assert controller.reconcile(301.0, 4, _pods(0.1, 0.1, 0.1, 0.1)) == 1


def test_scale_up_window_takes_the_lowest_recommendation() -> None:
    controller = HorizontalController(_config(scale_up=ScalingRules(60, (ScalingPolicy(PolicyType.PODS, 100, 15),))))
    assert controller.reconcile(0.0, 2, _pods(1.0, 1.0)) == 2
    assert controller.reconcile(15.0, 2, _pods(3.0, 3.0)) == 2  # 2 was recommended 15 s ago
    assert controller.reconcile(61.0, 2, _pods(3.0, 3.0)) == 6


def test_pods_policy_limits_per_period_counting_recent_events() -> None:
    controller = HorizontalController(_config(scale_up=ScalingRules(0, (ScalingPolicy(PolicyType.PODS, 2, 60),))))
    assert controller.reconcile(0.0, 1, _pods(8.0)) == 3  # +2 per 60 s
    assert controller.reconcile(15.0, 3, _pods(8.0, 8.0, 8.0)) == 3  # the period's 2 are spent
    assert controller.reconcile(61.0, 3, _pods(8.0, 8.0, 8.0)) == 5


def test_percent_policy_rounds_up_and_select_min_takes_the_smaller_change() -> None:
    up = ScalingRules(0, (ScalingPolicy(PolicyType.PERCENT, 50, 60), ScalingPolicy(PolicyType.PODS, 4, 60)))
    assert HorizontalController(_config(scale_up=up)).reconcile(0.0, 3, _pods(9.0, 9.0, 9.0)) == 7  # Max: 3 + 4
    up_min = ScalingRules(0, up.policies, SelectPolicy.MIN)
    assert HorizontalController(_config(scale_up=up_min)).reconcile(0.0, 3, _pods(9.0, 9.0, 9.0)) == 5  # ceil(3 * 1.5)
    disabled = ScalingRules(0, up.policies, SelectPolicy.DISABLED)
    assert HorizontalController(_config(scale_up=disabled)).reconcile(0.0, 3, _pods(9.0, 9.0, 9.0)) == 3


def test_scale_down_percent_truncates() -> None:
    down = ScalingRules(0, (ScalingPolicy(PolicyType.PERCENT, 50, 60),))
    controller = HorizontalController(_config(scale_down=down))
    assert controller.reconcile(0.0, 5, _pods(0.0, 0.0, 0.0, 0.0, 0.0)) == 2  # int(5 * 0.5)
    assert controller.reconcile(15.0, 2, _pods(0.0, 0.0)) == 2  # the period started at 5: 2 is its limit


def test_min_and_max_replicas_bound_the_result() -> None:
    controller = HorizontalController(_config(min_replicas=2, max_replicas=4))
    assert controller.reconcile(0.0, 3, _pods(9.0, 9.0, 9.0)) == 4
    assert controller.reconcile(15.0, 4, _pods(0.0, 0.0, 0.0, 0.0)) == 2
    assert controller.reconcile(30.0, 6, _pods(0.0)) == 4  # above max: back to max whatever the metric


def test_reads_the_hpa_the_operator_renders() -> None:
    pool = InferencePool.model_validate({
        "apiVersion": "slaq.dev/v1alpha1", "kind": "InferencePool", "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"model": {"name": "m"}, "engine": {"image": "vllm/vllm-openai:v0.11.0"},
                 "replicas": {"min": 1, "max": 8}, "autoscaling": {"enabled": True}},
    })
    config = HpaConfig.from_manifest(render_hpa(pool))
    assert config.metric == "slaq_protected_load" and config.source is MetricSource.PODS
    assert config.target_average == pytest.approx(0.5)
    assert (config.min_replicas, config.max_replicas) == (1, 8)
    assert config.scale_down.stabilization_window_s == 300
    assert config.scale_up.policies == (ScalingPolicy(PolicyType.PODS, 2, 60),)


def test_bad_manifests_and_quantities_are_named() -> None:
    assert parse_quantity("800m") == pytest.approx(0.8) and parse_quantity("5") == 5.0
    with pytest.raises(WorkloadError, match="quantity"):
        parse_quantity("8x")
    with pytest.raises(WorkloadError, match="AverageValue"):
        HpaConfig.from_manifest({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "spec": {
            "maxReplicas": 3, "metrics": [{"type": "Pods", "pods": {"metric": {"name": "m"}, "target": {"type": "Utilization"}}}]}})
