"""The Kubernetes HorizontalPodAutoscaler algorithm, in simulated time.

As the Kubernetes documentation specifies it (https://kubernetes.io/docs/concepts/workloads/
autoscaling/horizontal-pod-autoscale/, "Algorithm details", "Configurable scaling behavior") and
as kube-controller-manager implements it (pkg/controller/podautoscaler: replica_calculator.go,
horizontal.go), for one metric:

- every `sync_period_s` (15 s, `--horizontal-pod-autoscaler-sync-period`) the controller reads
  the metric and computes `desiredReplicas = ceil(currentReplicas * currentValue / target)`;
  for a `Pods` metric with an `AverageValue` target the value is averaged over the pods that
  report it, and the count multiplied is those pods (`PodsMetricReplicas`); for an `External`
  metric with an `AverageValue` target (what KEDA renders) it is `ceil(sum / target)` with the
  scale's replica count as the divisor of the ratio (`ExternalPerPodReplicas`);
- a ratio within `tolerance` (0.1) of 1.0 does not scale;
- pods being deleted or failed are ignored; pods not yet Running (Pending) are set aside, and on
  a scale-up counted as reporting 0; pods without a metric are counted, after the first ratio
  is known, as reporting 0 on a scale-up and the target on a scale-down; if that reverses the
  direction, or lands within the tolerance, nothing scales (the controller's "conservative"
  recomputation). Readiness itself only matters for CPU, so a Running pod that is not Ready
  but reports the metric counts, as in the controller;
- the recommendation is stabilised (the history starts with the replica count at the first
  sync, `recordInitialRecommendation`): the highest recommendation of the last
  `scaleDown.stabilizationWindowSeconds` (300 s by default) bounds a scale-down, the lowest of
  the last `scaleUp.stabilizationWindowSeconds` (0 by default) bounds a scale-up;
- then rate-limited by the direction's `policies` (`Pods` or `Percent` per `periodSeconds`,
  counted from the replicas at the start of the period) chosen by `selectPolicy` (`Max`, `Min`
  or `Disabled`), and clamped to `[minReplicas, maxReplicas]`.

`HpaConfig.from_manifest` reads an `autoscaling/v2` HorizontalPodAutoscaler dict (what the
operator's `render_hpa` returns), so the simulated controller runs the configuration that ships.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Sequence

from slaq.bench.errors import WorkloadError

SYNC_PERIOD_S = 15.0  # kube-controller-manager --horizontal-pod-autoscaler-sync-period
TOLERANCE = 0.1  # kube-controller-manager --horizontal-pod-autoscaler-tolerance
DEFAULT_SCALE_DOWN_WINDOW_S = 300


class PolicyType(str, Enum):
    PODS = "Pods"
    PERCENT = "Percent"


class SelectPolicy(str, Enum):
    MAX = "Max"
    MIN = "Min"
    DISABLED = "Disabled"


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    type: PolicyType
    value: int
    period_s: int


@dataclass(frozen=True, slots=True)
class ScalingRules:
    """One direction of `spec.behavior`."""

    stabilization_window_s: int
    policies: tuple[ScalingPolicy, ...]
    select: SelectPolicy = SelectPolicy.MAX


# The API's defaults (HPAScalingRules): up, double or +4 pods per 15 s, no window; down, everything
# per 15 s after a 300 s window.
DEFAULT_SCALE_UP = ScalingRules(0, (ScalingPolicy(PolicyType.PERCENT, 100, 15), ScalingPolicy(PolicyType.PODS, 4, 15)))
DEFAULT_SCALE_DOWN = ScalingRules(DEFAULT_SCALE_DOWN_WINDOW_S, (ScalingPolicy(PolicyType.PERCENT, 100, 15),))


class MetricSource(str, Enum):
    PODS = "Pods"  # a per-pod custom metric (prometheus-adapter), averaged over the pods reporting it
    EXTERNAL = "External"  # one number for the pool (KEDA's Prometheus trigger), divided by the replicas


@dataclass(frozen=True, slots=True)
class HpaConfig:
    min_replicas: int
    max_replicas: int
    metric: str
    target_average: float
    source: MetricSource = MetricSource.PODS
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN
    tolerance: float = TOLERANCE

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise WorkloadError(f"HPA needs 1 <= minReplicas <= maxReplicas, got {self.min_replicas} and {self.max_replicas}")
        if not self.target_average > 0:
            raise WorkloadError(f"HPA target averageValue must be positive, got {self.target_average}")

    @classmethod
    def from_manifest(cls, hpa: Mapping[str, Any]) -> "HpaConfig":
        """An `autoscaling/v2` HorizontalPodAutoscaler with one `Pods` or `External` metric and an `AverageValue` target."""
        if hpa.get("apiVersion") != "autoscaling/v2" or hpa.get("kind") != "HorizontalPodAutoscaler":
            raise WorkloadError(f"not an autoscaling/v2 HorizontalPodAutoscaler: {hpa.get('apiVersion')}/{hpa.get('kind')}")
        spec = hpa["spec"]
        metrics = spec.get("metrics") or []
        if len(metrics) != 1:
            raise WorkloadError(f"the simulated HPA reads exactly one metric, spec.metrics has {len(metrics)}")
        kind = metrics[0]["type"]
        if kind not in ("Pods", "External"):
            raise WorkloadError(f"spec.metrics[0].type {kind!r}: the simulated HPA reads Pods or External metrics")
        body = metrics[0]["pods" if kind == "Pods" else "external"]
        target = body["target"]
        if target.get("type") != "AverageValue":
            raise WorkloadError(f"spec.metrics[0].{kind.lower()}.target.type {target.get('type')!r}: only AverageValue is simulated")
        behavior = spec.get("behavior") or {}
        return cls(
            min_replicas=int(spec.get("minReplicas", 1)),
            max_replicas=int(spec["maxReplicas"]),
            metric=body["metric"]["name"],
            target_average=parse_quantity(target["averageValue"]),
            source=MetricSource(kind),
            scale_up=_rules(behavior.get("scaleUp"), DEFAULT_SCALE_UP),
            scale_down=_rules(behavior.get("scaleDown"), DEFAULT_SCALE_DOWN),
        )


def parse_quantity(text: str | int | float) -> float:
    """A Kubernetes quantity as the HPA reads a target: `800m` -> 0.8, `5` -> 5.0, `1k` -> 1000."""
    if isinstance(text, (int, float)):
        return float(text)
    suffixes = {"m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}
    number = text.rstrip("mkMG")
    suffix = text[len(number):]
    try:
        return float(number) * suffixes[suffix]
    except (ValueError, KeyError):
        raise WorkloadError(f"not a Kubernetes quantity the HPA simulation reads: {text!r}") from None


def _rules(body: Mapping[str, Any] | None, default: ScalingRules) -> ScalingRules:
    if body is None:
        return default
    policies = tuple(ScalingPolicy(PolicyType(p["type"]), int(p["value"]), int(p["periodSeconds"])) for p in body.get("policies") or ())
    return ScalingRules(
        stabilization_window_s=int(body.get("stabilizationWindowSeconds", default.stabilization_window_s)),
        policies=policies or default.policies,
        select=SelectPolicy(body.get("selectPolicy", "Max")),
    )


class PodPhase(str, Enum):
    PENDING = "Pending"  # scheduled but not started (the controller sets it aside)
    RUNNING = "Running"
    FAILED = "Failed"
    DELETING = "Deleting"  # has a deletionTimestamp: draining


@dataclass(frozen=True, slots=True)
class PodSample:
    """What the controller sees of one pod of the scale target: its phase and its metric (None: missing)."""

    name: str
    phase: PodPhase
    value: float | None


def _within(ratio: float, tolerance: float) -> bool:
    return abs(1.0 - ratio) <= tolerance


def pods_metric_replicas(pods: Sequence[PodSample], current_replicas: int, target: float, tolerance: float = TOLERANCE) -> int | None:
    """`replica_calculator.go` calcPlainMetricReplicas: a Pods metric, AverageValue target.
    None: no pod reports the metric (the controller then leaves the scale alone)."""
    metrics: dict[str, float] = {}
    unready: list[str] = []
    missing: list[str] = []
    ready = 0
    for pod in pods:
        if pod.phase in (PodPhase.FAILED, PodPhase.DELETING):
            continue
        if pod.phase is PodPhase.PENDING:
            unready.append(pod.name)
            continue
        if pod.value is None:
            missing.append(pod.name)
            continue
        metrics[pod.name] = pod.value
        ready += 1
    if not metrics:
        return None
    ratio = sum(metrics.values()) / len(metrics) / target
    scale_up_with_unready = bool(unready) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        return current_replicas if _within(ratio, tolerance) else math.ceil(ratio * ready)
    for name in missing:
        metrics[name] = target if ratio < 1.0 else 0.0
    if scale_up_with_unready:
        for name in unready:
            metrics[name] = 0.0
    new_ratio = sum(metrics.values()) / len(metrics) / target
    if _within(new_ratio, tolerance) or (ratio > 1.0 > new_ratio) or (ratio < 1.0 < new_ratio):
        return current_replicas
    replicas = math.ceil(new_ratio * len(metrics))
    if (new_ratio < 1.0 and replicas > current_replicas) or (new_ratio > 1.0 and replicas < current_replicas):
        return current_replicas
    return replicas


def external_per_pod_replicas(total: float | None, current_replicas: int, target: float, tolerance: float = TOLERANCE) -> int | None:
    """`replica_calculator.go` GetExternalPerPodMetricReplicas: an External metric with an
    AverageValue target (KEDA's ScaledObject): ceil(sum / target) unless within the tolerance."""
    if total is None:
        return None
    ratio = total / (target * current_replicas)
    return current_replicas if _within(ratio, tolerance) else math.ceil(total / target)


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    at_s: float
    change: int  # replicas added (> 0) or removed (< 0)


@dataclass
class HorizontalController:
    """One HPA's controller state: its recommendation history and its recent scale events."""

    config: HpaConfig
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    events: list[ScaleEvent] = field(default_factory=list)

    def desired_from_metric(self, now: float, current: int, pods: Sequence[PodSample], external_total: float | None = None) -> int | None:
        config = self.config
        if config.source is MetricSource.EXTERNAL:
            return external_per_pod_replicas(external_total, current, config.target_average, config.tolerance)
        return pods_metric_replicas(pods, current, config.target_average, config.tolerance)

    def reconcile(self, now: float, current: int, pods: Sequence[PodSample] = (), external_total: float | None = None,
                  *, desired: int | None = None) -> int:
        """One sync: the replica count the controller sets the scale to (`current` when it leaves it).
        `desired` replaces the metric's recommendation (an external recommender such as a saturation
        analyser whose output the HPA follows); the behaviour is applied to it all the same."""
        config = self.config
        if current == 0:
            return 0  # scaling is disabled for a target scaled to zero (minReplicas >= 1 here)
        if current > config.max_replicas:
            proposal = config.max_replicas
        elif current < config.min_replicas:
            proposal = config.min_replicas
        else:
            if desired is None:
                desired = self.desired_from_metric(now, current, pods, external_total)
            if desired is None:
                return current  # no metric: the controller reports FailedGetPodsMetric and leaves the scale
            proposal = self._normalize(now, current, desired)
        if proposal != current:
            self.events.append(ScaleEvent(now, proposal - current))
        return proposal

    def _normalize(self, now: float, current: int, desired: int) -> int:
        """horizontal.go normalizeDesiredReplicasWithBehaviors: stabilise, rate-limit, clamp."""
        if not self.recommendations:
            self.recommendations.append((now, current))  # recordInitialRecommendation
        stabilized = self._stabilize(now, current, desired)
        return self._rate_limited(now, current, stabilized)

    def _stabilize(self, now: float, current: int, desired: int) -> int:
        up_cutoff = now - self.config.scale_up.stabilization_window_s
        down_cutoff = now - self.config.scale_down.stabilization_window_s
        up, down = desired, desired
        old_index = None
        for index, (at, value) in enumerate(self.recommendations):
            if at > up_cutoff:
                up = min(up, value)
            if at > down_cutoff:
                down = max(down, value)
            if at < up_cutoff and at < down_cutoff:
                old_index = index
        recommendation = max(current, up)
        recommendation = min(recommendation, down)
        if old_index is not None:
            self.recommendations[old_index] = (now, desired)
        else:
            self.recommendations.append((now, desired))
        return recommendation

    def _change_in_period(self, now: float, period_s: int, sign: int) -> int:
        cutoff = now - period_s
        return sum(abs(e.change) for e in self.events if e.at_s > cutoff and (e.change > 0) == (sign > 0))

    def _period_start(self, now: float, current: int, period_s: int) -> int:
        return current - self._change_in_period(now, period_s, +1) + self._change_in_period(now, period_s, -1)

    def _rate_limited(self, now: float, current: int, desired: int) -> int:
        config = self.config
        if desired > current:
            return min(desired, config.max_replicas, max(self._policy_limit(config.scale_up, now, current, up=True), current))
        if desired < current:
            return max(desired, config.min_replicas, min(self._policy_limit(config.scale_down, now, current, up=False), current))
        return desired

    def _policy_limit(self, rules: ScalingRules, now: float, current: int, *, up: bool) -> int:
        """The farthest the direction's policies let the count go from `current` (each policy from the
        count at the start of its period); `selectPolicy` Max takes the largest change, Min the smallest."""
        if rules.select is SelectPolicy.DISABLED:
            return current
        proposals = []
        for policy in rules.policies:
            start = self._period_start(now, current, policy.period_s)
            if policy.type is PolicyType.PODS:
                proposals.append(start + policy.value if up else start - policy.value)
            else:
                proposals.append(math.ceil(start * (1 + policy.value / 100)) if up else int(start * (1 - policy.value / 100)))
        largest_change = max if up else min
        smallest_change = min if up else max
        return largest_change(proposals) if rules.select is SelectPolicy.MAX else smallest_change(proposals)
