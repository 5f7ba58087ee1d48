"""What a simulated pool scales on: each signal is an HPA (`cluster_hpa`) fed one metric as
Prometheus and its adapter would serve it, or a fixed size.

- `slaq`: the HPA the operator renders (`render_hpa`: Pods metric `slaq_protected_load`,
  AverageValue 0.5, its `behavior`), read through the chart's adapter rule (`max by (pod)` of the
  latest sample). The pods compute the gauge as the sidecar does (`SidecarCore.protected_load`).
- `queue-depth`: the same HPA on the requests each pod has waiting, AverageValue 5 (the
  saturation threshold below; the common HPA on `vllm:num_requests_waiting`). On a slaq pod the
  sidecar holds what the engine has not taken, so a pod's figure is the engine's
  `vllm:num_requests_waiting` plus the sidecar's queue (`slaq_queue_depth`): the engine's alone
  would stay near the sidecar's engine-queue target whatever the backlog.
- `kv`: the same HPA on `vllm:kv_cache_usage_perc`, AverageValue 0.8.
- `saturation`: llm-d workload-variant-autoscaler's saturation analyser as its documentation
  describes it (docs/saturation-analyzer.md, capacity-scaling-config defaults): per replica the
  peak over 1 min of KV use and of waiting requests; a replica with KV >= 0.8 or queue >= 5 is
  saturated; over the others, mean spare KV (0.8 - KV) < 0.1 or mean spare queue (5 - queue) < 3
  asks for one more replica, unless a replica is still starting; one fewer when the load of all
  replicas spread over one fewer still leaves both spares at or above their triggers. The
  recommendation goes through the same HPA behaviour (WVA publishes it for an HPA to follow).
- `static`: `maxReplicas` pods from the start, no controller.
- `clairvoyant` (a bound, never in the default list): no metric and no controller; it knows the
  workload's stages and keeps ceil(rate / pod rate) pods for the highest rate due within a cold
  start and a sync period, so the pods for a stage are ready when it starts, and it scales down the
  moment a stage ends. What a scaler that sees the ramp coming could reach at best with pods of
  that size (`--clairvoyant-pod-rps`; by default 1.25 requests/s, the static pool's load per pod at
  the ramp's peak, 10 requests/s on 8 pods, where every objective is met). With
  `--clairvoyant-lead 0` its pods are ordered the moment a stage starts and still take their cold
  start: the bound of a reactive scaler with no lag of its own.

Every autoscaled signal starts at `minReplicas` ready pods and uses the operator's behaviour
(scale-up 2 pods / 60 s, scale-down 1 pod / 60 s after the pool's `scaleDownStabilizationSeconds`
window, by default the CRD's 300 s; `--scale-down-window`), so only the metric differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from slaq.api.pool import AutoscalingSpec, InferencePool
from slaq.bench.cluster_hpa import HorizontalController, HpaConfig, PodPhase, PodSample
from slaq.bench.errors import WorkloadError

if TYPE_CHECKING:  # the pod simulation imports vLLM: `slaq --help` must not
    from slaq.bench.cluster_pod import PodMetrics

SIGNALS = ("slaq", "queue-depth", "kv", "saturation", "static")
BOUNDS = ("clairvoyant",)  # named explicitly: not a scaler anyone can deploy
DEFAULT_CLAIRVOYANT_POD_RPS = 1.25
PROMETHEUS_SCRAPE_S = 15.0  # a PodMonitor's interval, as the chart's examples set it
DEFAULT_TARGET_PROTECTED_LOAD: float = AutoscalingSpec.model_fields["target_protected_load"].default  # the CRD's
DEFAULT_SCALE_DOWN_WINDOW_S: int = AutoscalingSpec.model_fields["scale_down_stabilization_seconds"].default  # the CRD's


def bench_pool(max_replicas: int, *, min_replicas: int = 1, target_protected_load: float = DEFAULT_TARGET_PROTECTED_LOAD,
               scale_down_stabilization_s: int = DEFAULT_SCALE_DOWN_WINDOW_S, drain_timeout: str = "120s") -> InferencePool:
    """The InferencePool the cluster benchmark's HPA is rendered from: Qwen3-32B, TP=2."""
    return InferencePool.model_validate({
        "apiVersion": "slaq.dev/v1alpha1", "kind": "InferencePool", "metadata": {"name": "bench", "namespace": "bench"},
        "spec": {
            "model": {"name": "Qwen/Qwen3-32B", "tensorParallelSize": 2, "maxModelLen": 8192},
            "engine": {"image": "ghcr.io/slaq-dev/slaq:0.1.0", "device": "gpu"},
            "resources": {"gpus": 2},
            "replicas": {"min": min_replicas, "max": max_replicas, "desired": min_replicas},
            "autoscaling": {"enabled": True, "targetProtectedLoad": target_protected_load,
                            "scaleDownStabilizationSeconds": scale_down_stabilization_s},
            "drainTimeout": drain_timeout,
        },
    })


def _with_metric(hpa: Mapping[str, Any], name: str, average_value: str) -> dict[str, Any]:
    """The operator's HPA with another Pods metric: same bounds and behaviour."""
    spec = dict(hpa["spec"])
    spec["metrics"] = [{"type": "Pods", "pods": {"metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": average_value}}}]
    return {**hpa, "spec": spec}


class Prometheus:
    """Per-pod samples taken every `PROMETHEUS_SCRAPE_S`, kept for five minutes (the staleness bound)."""

    def __init__(self, retention_s: float = 300.0) -> None:
        self.retention_s = retention_s
        self.series: dict[str, deque[PodMetrics]] = {}

    def record(self, pod: str, sample: PodMetrics | None, now: float) -> None:
        if sample is None:
            return
        samples = self.series.setdefault(pod, deque())
        samples.append(sample)
        while samples and samples[0].at_s < now - self.retention_s:
            samples.popleft()

    def latest(self, pod: str, read: Callable[[PodMetrics], float | None]) -> float | None:
        for sample in reversed(self.series.get(pod, ())):
            value = read(sample)
            if value is not None:
                return value
        return None

    def max_over(self, pod: str, read: Callable[[PodMetrics], float | None], now: float, window_s: float) -> float | None:
        values = [v for s in self.series.get(pod, ()) if s.at_s >= now - window_s and (v := read(s)) is not None]
        return max(values) if values else None


@dataclass(frozen=True, slots=True)
class PodView:
    """What the controller knows of one pod of the scale target (the API server's view)."""

    name: str
    phase: PodPhase
    ready: bool


READERS: dict[str, Callable[[PodMetrics], float | None]] = {
    "slaq_sla_risk": lambda m: m.sla_risk,
    "slaq_protected_load": lambda m: m.protected_load,
    "pod_requests_waiting": lambda m: None if m.waiting is None else float(m.waiting),
    "vllm:kv_cache_usage_perc": lambda m: m.kv_usage,
}


class HpaSignal:
    """An HPA on one Pods metric, read through the adapter's `max by (pod)` of the latest sample."""

    def __init__(self, name: str, config: HpaConfig) -> None:
        if config.metric not in READERS:
            raise WorkloadError(f"no per-pod series {config.metric!r} in the simulated pods (known: {', '.join(READERS)})")
        self.name = name
        self.config = config
        self.controller = HorizontalController(config)
        self._read = READERS[config.metric]

    @property
    def initial_replicas(self) -> int:
        return self.config.min_replicas

    def sync(self, now: float, current: int, pods: Sequence[PodView], prometheus: Prometheus) -> int:
        samples = [PodSample(p.name, p.phase, prometheus.latest(p.name, self._read) if p.phase is PodPhase.RUNNING else None) for p in pods]
        return self.controller.reconcile(now, current, samples)


@dataclass(frozen=True, slots=True)
class SaturationThresholds:
    kv_cache: float = 0.80
    queue_length: float = 5.0
    kv_spare_trigger: float = 0.10
    queue_spare_trigger: float = 3.0
    window_s: float = 60.0  # max_over_time[1m]


class SaturationSignal:
    def __init__(self, config: HpaConfig, thresholds: SaturationThresholds = SaturationThresholds()) -> None:
        self.name = "saturation"
        self.config = config
        self.thresholds = thresholds
        self.controller = HorizontalController(config)

    @property
    def initial_replicas(self) -> int:
        return self.config.min_replicas

    def recommend(self, now: float, current: int, pods: Sequence[PodView], prometheus: Prometheus) -> int:
        t = self.thresholds
        replicas = []
        for pod in pods:
            if pod.phase is not PodPhase.RUNNING or not pod.ready:
                continue
            kv = prometheus.max_over(pod.name, READERS["vllm:kv_cache_usage_perc"], now, t.window_s)
            queue = prometheus.max_over(pod.name, READERS["pod_requests_waiting"], now, t.window_s)
            if kv is not None and queue is not None:
                replicas.append((kv, queue))
        if not replicas:
            return current
        starting = any(p.phase is PodPhase.PENDING or (p.phase is PodPhase.RUNNING and not p.ready) for p in pods)
        calm = [(kv, q) for kv, q in replicas if kv < t.kv_cache and q < t.queue_length]
        if not calm:
            return current if starting else current + 1
        spare_kv = sum(t.kv_cache - kv for kv, _ in calm) / len(calm)
        spare_queue = sum(t.queue_length - q for _, q in calm) / len(calm)
        if spare_kv < t.kv_spare_trigger or spare_queue < t.queue_spare_trigger:
            return current if starting else current + 1
        if len(replicas) > 1 and len(calm) == len(replicas):
            fewer = len(replicas) - 1
            kv_after = sum(kv for kv, _ in replicas) / fewer
            queue_after = sum(q for _, q in replicas) / fewer
            if t.kv_cache - kv_after >= t.kv_spare_trigger and t.queue_length - queue_after >= t.queue_spare_trigger:
                return current - 1
        return current

    def sync(self, now: float, current: int, pods: Sequence[PodView], prometheus: Prometheus) -> int:
        return self.controller.reconcile(now, current, desired=self.recommend(now, current, pods, prometheus))


class StaticSignal:
    name = "static"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    @property
    def initial_replicas(self) -> int:
        return self.replicas

    def sync(self, now: float, current: int, pods: Sequence[PodView], prometheus: Prometheus) -> int:
        return self.replicas


class ClairvoyantSignal:
    """The bound of the module doc: `stages` (start s, end s, rate requests/s) known in advance."""

    name = "clairvoyant"

    def __init__(self, stages: Sequence[tuple[float, float, float]], pod_rps: float, lead_s: float, min_replicas: int, max_replicas: int) -> None:
        self.check(pod_rps, lead_s)
        self.stages, self.pod_rps, self.lead_s = tuple(stages), pod_rps, lead_s
        self.min_replicas, self.max_replicas = min_replicas, max_replicas

    @staticmethod
    def check(pod_rps: float, lead_s: float) -> None:
        """Refuse the bound's parameters before a run starts (the CLI) or a signal is built."""
        if not pod_rps > 0:
            raise WorkloadError(f"--clairvoyant-pod-rps must be positive, got {pod_rps:g}")
        if not lead_s >= 0:
            raise WorkloadError(f"--clairvoyant-lead must be 0 or more seconds, got {lead_s:g}")

    def desired(self, now: float) -> int:
        due = [rate for start, end, rate in self.stages if end > now and start <= now + self.lead_s]
        pods = math.ceil(max(due, default=0.0) / self.pod_rps - 1e-9)
        return max(self.min_replicas, min(self.max_replicas, pods))

    @property
    def initial_replicas(self) -> int:
        return self.desired(0.0)

    def sync(self, now: float, current: int, pods: Sequence[PodView], prometheus: Prometheus) -> int:
        return self.desired(now)


def make_signal(name: str, pool: InferencePool, *, stages: Sequence[tuple[float, float, float]] = (), lead_s: float = 0.0,
                pod_rps: float = DEFAULT_CLAIRVOYANT_POD_RPS) -> HpaSignal | SaturationSignal | StaticSignal | ClairvoyantSignal:
    """`stages`, `lead_s` (how far ahead it orders pods) and `pod_rps`: the clairvoyant bound's only."""
    from slaq.operator.children import render_hpa  # the operator's rendering; imported late: `slaq --help` stays light

    hpa = render_hpa(pool)
    if hpa is None:
        raise WorkloadError("the bench pool renders no HPA (spec.autoscaling.enabled is false)")
    if name == "slaq":
        return HpaSignal(name, HpaConfig.from_manifest(hpa))
    if name == "queue-depth":
        return HpaSignal(name, HpaConfig.from_manifest(_with_metric(hpa, "pod_requests_waiting", "5")))
    if name == "kv":
        return HpaSignal(name, HpaConfig.from_manifest(_with_metric(hpa, "vllm:kv_cache_usage_perc", "800m")))
    if name == "saturation":
        return SaturationSignal(HpaConfig.from_manifest(hpa))
    if name == "static":
        return StaticSignal(pool.spec.replicas.max)
    if name == "clairvoyant":
        return ClairvoyantSignal(stages, pod_rps, lead_s, pool.spec.replicas.min, pool.spec.replicas.max)
    raise WorkloadError(f"unknown signal {name!r} (known: {', '.join(SIGNALS + BOUNDS)})")


def parse_signals(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SIGNALS + BOUNDS]
    if not names or unknown:
        raise WorkloadError(f"unknown signal(s) {', '.join(unknown) or '(none given)'} (known: {', '.join(SIGNALS + BOUNDS)})")
    return names


