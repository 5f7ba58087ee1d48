"""Routers in front of a simulated pool: which ready pod gets the next request.

- `service`: a Kubernetes Service in IPVS round-robin mode: each request to the next endpoint.
- `least-request`: a proxy that counts its own open requests per endpoint (Envoy's
  LEAST_REQUEST with all hosts compared): the endpoint with the fewest, round-robin among ties.
- `gateway`: a picker in the manner of the Gateway API Inference Extension's endpoint picker
  (llm-d's default scheduling profile without the prefix cache): each pod's score is the
  weighted sum of `queue` (1 - waiting / the most waiting on any candidate), `kv`
  (1 - KV-cache use) and, with `risk_weight`, `risk` (1 - min(slaq_sla_risk, 1)); the highest
  score wins, ties round-robin. It reads only the metrics the pods export, each pod's scrape at
  most `scrape_interval_s` old (the picker's metrics refresh, 50 ms by default), never the
  simulator's state.
- `gateway-slaq`: the same picker configured as docs/gateway.md sets it up for a slaq pool: its
  queue metric is `slaq_protected_prompts_pending` (the critical and standard requests a pod holds
  with no first token yet) and its only scorer the queue's, so every request goes to a pod where no
  protected prompt is pending when there is one (ties round-robin); no KV-cache scorer, which sends
  a burst to the pod that last freed its cache (decision 0029).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from typing import Protocol, Sequence

from slaq.bench.errors import WorkloadError

if TYPE_CHECKING:  # the pod simulation imports vLLM: `slaq --help` must not
    from slaq.bench.cluster_pod import ClusterPod

GATEWAY_SCRAPE_S = 0.05  # the Inference Extension EPP's --refresh-metrics-interval default


class Router(Protocol):
    name: str

    def pick(self, pods: Sequence[ClusterPod], now: float) -> ClusterPod: ...

    def finished(self, pod: ClusterPod) -> None: ...


class ServiceRouter:
    name = "service"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, pods: Sequence[ClusterPod], now: float) -> ClusterPod:
        pod = pods[self._next % len(pods)]
        self._next += 1
        return pod

    def finished(self, pod: ClusterPod) -> None:
        pass


class LeastRequestRouter:
    name = "least-request"

    def __init__(self) -> None:
        self.open: dict[str, int] = {}
        self._next = 0

    def pick(self, pods: Sequence[ClusterPod], now: float) -> ClusterPod:
        fewest = min(self.open.get(p.name, 0) for p in pods)
        tied = [p for p in pods if self.open.get(p.name, 0) == fewest]
        pod = tied[self._next % len(tied)]
        self._next += 1
        self.open[pod.name] = self.open.get(pod.name, 0) + 1
        return pod

    def finished(self, pod: ClusterPod) -> None:
        self.open[pod.name] = max(0, self.open.get(pod.name, 0) - 1)


class GatewayRouter:
    def __init__(self, *, queue_weight: float = 1.0, kv_weight: float = 1.0, risk_weight: float = 0.0,
                 scrape_interval_s: float = GATEWAY_SCRAPE_S, queue_metric: str = "waiting", name: str = "gateway") -> None:
        self.queue_weight, self.kv_weight, self.risk_weight = queue_weight, kv_weight, risk_weight
        self.scrape_interval_s = scrape_interval_s
        self.queue_metric = queue_metric  # the PodMetrics field the picker's queue scorer reads
        self.name = name
        self._next = 0

    def _metrics(self, pod: ClusterPod, now: float):
        if pod.metrics is None or now - pod.metrics.at_s >= self.scrape_interval_s:
            pod.scrape()
        return pod.metrics

    def pick(self, pods: Sequence[ClusterPod], now: float) -> ClusterPod:
        seen = [(pod, self._metrics(pod, now)) for pod in pods]
        queued = {pod.name: getattr(m, self.queue_metric) or 0 for pod, m in seen if m is not None}
        most_queued = max(queued.values(), default=0)
        scores = []
        for pod, m in seen:
            if m is None:
                scores.append(0.0)
                continue
            queue = 1.0 - queued[pod.name] / most_queued if most_queued else 1.0
            kv = 1.0 - (m.kv_usage or 0.0)
            risk = 1.0 - min(m.sla_risk or 0.0, 1.0)
            scores.append(self.queue_weight * queue + self.kv_weight * kv + self.risk_weight * risk)
        best = max(scores)
        tied = [pod for (pod, _), score in zip(seen, scores) if score >= best - 1e-12]
        pod = tied[self._next % len(tied)]
        self._next += 1
        return pod

    def finished(self, pod: ClusterPod) -> None:
        pass


ROUTERS = ("service", "least-request", "gateway", "gateway-risk", "gateway-slaq")


def make_router(name: str) -> Router:
    if name == "service":
        return ServiceRouter()
    if name == "least-request":
        return LeastRequestRouter()
    if name == "gateway":
        return GatewayRouter()
    if name == "gateway-risk":
        return GatewayRouter(risk_weight=1.0, name=name)
    if name == "gateway-slaq":
        return GatewayRouter(kv_weight=0.0, queue_metric="protected_pending", name=name)
    raise WorkloadError(f"unknown router {name!r} (known: {', '.join(ROUTERS)})")
