"""The signals' readings of the pods' metrics, without a simulation."""

from __future__ import annotations

from slaq.bench.cluster_hpa import PodPhase
from slaq.bench.cluster_pod import PodMetrics
from slaq.bench.cluster_signals import PodView, Prometheus, bench_pool, make_signal


def _prometheus(samples: dict[str, list[tuple[float, float | None, int | None, float | None]]]) -> Prometheus:
    """Per pod (at, protected load, waiting, KV use) rows; the risk rises with the load (it is never read)."""
    prometheus = Prometheus()
    for pod, rows in samples.items():
        for at, load, waiting, kv in rows:
            prometheus.record(pod, PodMetrics(at, None if load is None else 3 * load, waiting, kv, 0, load), at)
    return prometheus


def _ready(*names: str) -> list[PodView]:
    return [PodView(n, PodPhase.RUNNING, True) for n in names]


def test_saturation_adds_a_pod_when_spare_kv_runs_low_and_waits_while_one_starts() -> None:
    signal = make_signal("saturation", bench_pool(8))
    prometheus = _prometheus({"a": [(0.0, None, 1, 0.75)], "b": [(0.0, None, 1, 0.72)]})
    assert signal.recommend(10.0, 2, _ready("a", "b"), prometheus) == 3  # spare KV 0.065 < 0.1
    starting = _ready("a", "b") + [PodView("c", PodPhase.RUNNING, False)]
    assert signal.recommend(10.0, 3, starting, prometheus) == 3  # a replica still loading: wait


def test_saturation_uses_the_peak_of_the_last_minute_and_removes_a_pod_only_when_the_rest_keep_their_spare() -> None:
    signal = make_signal("saturation", bench_pool(8))
    # A minute ago pod a was saturated (queue 9); now calm: the peak still counts.
    prometheus = _prometheus({"a": [(0.0, None, 9, 0.2), (30.0, None, 0, 0.1)], "b": [(30.0, None, 0, 0.1)]})
    assert signal.recommend(45.0, 2, _ready("a", "b"), prometheus) == 2  # a saturated by its peak: no scale-down; b has spare
    assert signal.recommend(85.0, 2, _ready("a", "b"), prometheus) == 1  # the peak has left the window: one pod suffices
    both = _prometheus({"a": [(0.0, None, 9, 0.2)], "b": [(0.0, None, 0, 0.85)]})
    assert signal.recommend(10.0, 2, _ready("a", "b"), both) == 3  # every replica saturated
    quiet = _prometheus({"a": [(100.0, None, 0, 0.1)], "b": [(100.0, None, 0, 0.1)], "c": [(100.0, None, 1, 0.2)]})
    assert signal.recommend(110.0, 3, _ready("a", "b", "c"), quiet) == 2  # spread over two: KV 0.2, queue 0.5
    busy = _prometheus({"a": [(100.0, None, 2, 0.5)], "b": [(100.0, None, 2, 0.5)]})
    assert signal.recommend(110.0, 2, _ready("a", "b"), busy) == 2  # one pod would hold KV 1.0: keep both


def test_hpa_signals_read_the_latest_sample_and_skip_pods_that_do_not_run() -> None:
    signal = make_signal("slaq", bench_pool(8))
    prometheus = _prometheus({"a": [(0.0, 0.1, 0, 0.1), (15.0, 1.5, 0, 0.1)], "b": [(15.0, 0.0, 0, 0.1)]})
    # Latest protected loads 1.5 and 0.0: mean 0.75 against 0.5 over 2 pods -> 3 (scale-up 2 pods / 60 s allows it).
    assert signal.sync(22.5, 2, _ready("a", "b"), prometheus) == 3
    draining = make_signal("slaq", bench_pool(8))
    pods = _ready("a") + [PodView("b", PodPhase.DELETING, False)]
    assert draining.sync(22.5, 1, pods, prometheus) == 3  # b is being deleted: only a's 1.5 counts -> ceil(3.0)


def test_static_holds_max_replicas() -> None:
    signal = make_signal("static", bench_pool(5))
    assert signal.initial_replicas == 5 and signal.sync(0.0, 5, [], Prometheus()) == 5
