"""Attainment from cumulative SLO counters: increases, restarts, the window, and the AtRisk verdict."""

from __future__ import annotations

from pathlib import Path

import yaml

from slaq.api.tenant import TenantSLA
from slaq.operator.attainment import (
    AttainmentLedger,
    OutcomeCounter,
    Outcomes,
    increase,
    judge,
    pod_increases,
)
from slaq.operator.usage import parse_slo_outcomes

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"


def vip() -> TenantSLA:  # attainmentTarget 0.99, ttftMs 50
    return TenantSLA.model_validate(next(d for d in yaml.safe_load_all((EXAMPLES / "tenants.yaml").read_text()) if d["metadata"]["name"] == "vip"))


def test_increase_of_a_known_series_is_the_difference_and_a_restart_counts_whole() -> None:
    assert increase(OutcomeCounter(10, 100.0), OutcomeCounter(15, 100.0), new_since=None, pod_known=True) == 5
    # Went down: the sidecar restarted and counted 3 since.
    assert increase(OutcomeCounter(10, 100.0), OutcomeCounter(3, 500.0), new_since=None, pod_known=True) == 3
    # Grew past the old value, but a new _created says it restarted: all 12 are new.
    assert increase(OutcomeCounter(10, 100.0), OutcomeCounter(12, 500.0), new_since=None, pod_known=True) == 12


def test_a_first_seen_series_counts_only_when_it_began_since_the_previous_tick() -> None:
    assert increase(None, OutcomeCounter(7, 1000.0), new_since=990.0, pod_known=False) == 7  # a new pod
    assert increase(None, OutcomeCounter(7, 900.0), new_since=990.0, pod_known=True) == 0  # history of unknown age
    assert increase(None, OutcomeCounter(7, 1000.0), new_since=None, pod_known=False) == 0  # the pool's first tick
    # Without _created, only a pod already known can have started the series since the last tick.
    assert increase(None, OutcomeCounter(4), new_since=990.0, pod_known=True) == 4
    assert increase(None, OutcomeCounter(4), new_since=990.0, pod_known=False) == 0


def test_pod_increases_sum_outcomes_per_tenant_and_every_miss_kind_is_a_miss() -> None:
    before = {("a", "critical", "met"): OutcomeCounter(10, 1.0), ("a", "critical", "ttft_missed"): OutcomeCounter(1, 1.0)}
    now = {("a", "critical", "met"): OutcomeCounter(20, 1.0), ("a", "critical", "ttft_missed"): OutcomeCounter(2, 1.0),
           ("a", "critical", "tpot_missed"): OutcomeCounter(3, 50.0), ("b", "batch", "met"): OutcomeCounter(0, 50.0)}
    assert pod_increases(before, now, new_since=40.0) == {"a": Outcomes(met=10, missed=4)}


def test_counters_round_trip_through_the_sidecars_own_metrics() -> None:
    from slaq.sidecar.metrics import SidecarMetrics

    metrics = SidecarMetrics(depth=dict, risk=lambda: 0.0, in_flight=lambda: 0)
    metrics.slo.labels("vip", "critical", "met").inc(3)
    metrics.slo.labels("vip", "critical", "e2e_missed").inc()
    # The metrics port appends the engine's families after the sidecar's own.
    parsed = parse_slo_outcomes(metrics.render().decode() + "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 2\n")
    assert {k: v.value for k, v in parsed.items()} == {("vip", "critical", "met"): 3.0, ("vip", "critical", "e2e_missed"): 1.0}
    assert all(v.created is not None and v.created > 1e9 for v in parsed.values())
    assert parse_slo_outcomes("slaq_sla_risk 0.5\n") == {}


def test_ledger_window_spans_pods_and_pools_and_forgets_old_ticks() -> None:
    ledger = AttainmentLedger(window_s=600.0)
    met, miss = ("vip", "critical", "met"), ("vip", "critical", "ttft_missed")
    # First tick of each pool: baselines (counts from before the operator watched are not judged).
    ledger.record("ns/a", [("a-0", {met: OutcomeCounter(500, 1.0)})], now=1000.0)
    ledger.record("ns/b", [("b-0", {met: OutcomeCounter(80, 1.0)})], now=1000.0)
    assert ledger.outcomes("vip", 1000.0) == Outcomes()
    ledger.record("ns/a", [("a-0", {met: OutcomeCounter(590, 1.0), miss: OutcomeCounter(10, 1012.0)})], now=1015.0)
    ledger.record("ns/b", [("b-0", {met: OutcomeCounter(100, 1.0)}), ("b-1", {miss: OutcomeCounter(5, 1010.0)})], now=1015.0)
    assert ledger.outcomes("vip", 1015.0) == Outcomes(met=110, missed=15)
    # A pod that missed a tick keeps its reading: its next increase is not lost nor doubled.
    ledger.record("ns/a", [], now=1030.0)
    ledger.record("ns/a", [("a-0", {met: OutcomeCounter(600, 1.0), miss: OutcomeCounter(10, 1012.0)})], now=1045.0)
    assert ledger.outcomes("vip", 1045.0) == Outcomes(met=120, missed=15)
    # Ten minutes later, the first increases have left the window.
    assert ledger.outcomes("vip", 1015.0 + 600.5) == Outcomes(met=10, missed=0)
    assert ledger.outcomes("nobody", 1045.0) == Outcomes()


def test_a_series_created_before_a_tick_its_pod_missed_counts_at_its_next_reading() -> None:
    """New since the pod's own previous reading, not the pool's last tick: vip's first miss on a-0
    (created at 1020) came before the tick at 1030 that a-0 did not answer; it is not history."""
    ledger = AttainmentLedger(window_s=600.0)
    met, miss = ("vip", "critical", "met"), ("vip", "critical", "ttft_missed")
    ledger.record("ns/a", [("a-0", {met: OutcomeCounter(500, 1.0)})], now=1000.0)
    ledger.record("ns/a", [("a-1", {met: OutcomeCounter(7, 1.0)})], now=1030.0)  # a-0 silent (a-1: first seen, baseline)
    ledger.record("ns/a", [("a-0", {met: OutcomeCounter(510, 1.0), miss: OutcomeCounter(1, 1020.0)}),
                           ("a-1", {met: OutcomeCounter(7, 1.0)})], now=1045.0)
    assert ledger.outcomes("vip", 1045.0) == Outcomes(met=10, missed=1)
    # A series a pod had before its previous reading, seen now for the first time (its tenant was
    # just bound to the pool), is history: baseline.
    other = ("newly-bound", "standard", "met")
    ledger.record("ns/a", [("a-0", {met: OutcomeCounter(510, 1.0), miss: OutcomeCounter(1, 1020.0), other: OutcomeCounter(900, 2.0)})], now=1060.0)
    assert ledger.outcomes("newly-bound", 1060.0) == Outcomes()


def test_a_series_from_a_sidecar_whose_clock_lags_still_counts() -> None:
    """a-0's node runs 1.5 s behind the operator: vip's first miss, created just after the read
    stamped 1000 (at 1000.2 operator time), carries `_created` 998.7. Within CLOCK_MARGIN_S it
    is new, not history."""
    ledger = AttainmentLedger(window_s=600.0)
    met, miss = ("vip", "critical", "met"), ("vip", "critical", "ttft_missed")
    ledger.record("ns/a", [("a-0", {met: OutcomeCounter(500, 1.0)})], now=1000.0)
    ledger.record("ns/a", [("a-0", {met: OutcomeCounter(500, 1.0), miss: OutcomeCounter(1, 998.7)})], now=1015.0)
    assert ledger.outcomes("vip", 1015.0) == Outcomes(missed=1)


def test_a_pod_whose_metrics_could_not_be_read_keeps_its_reading() -> None:
    """Outcomes None (its /metrics failed, its usage answered): what the pod counts meanwhile is
    counted at its next reading. Read as empty instead, every series would be first seen then, and
    its 40 met and 5 missed would have become baseline."""
    ledger = AttainmentLedger(window_s=600.0)
    met, miss = ("vip", "critical", "met"), ("vip", "critical", "ttft_missed")
    ledger.record("ns/a", [("a-0", {met: OutcomeCounter(500, 1.0), miss: OutcomeCounter(5, 2.0)})], now=1000.0)
    ledger.record("ns/a", [("a-0", None)], now=1015.0)
    ledger.record("ns/a", [("a-0", {met: OutcomeCounter(540, 1.0), miss: OutcomeCounter(10, 2.0)})], now=1030.0)
    assert ledger.outcomes("vip", 1030.0) == Outcomes(met=40, missed=5)


def test_ledger_warms_for_one_window_after_start() -> None:
    ledger = AttainmentLedger(window_s=600.0)
    assert ledger.warming(0.0)
    ledger.record("ns/a", [], now=100.0)
    assert ledger.warming(650.0) and not ledger.warming(700.0)


def test_judge_needs_enough_requests_then_compares_with_the_target() -> None:
    tenant = vip()
    few = judge(tenant, Outcomes(met=1, missed=1), window_s=600, min_requests=20, warming=False)
    assert (few.status, few.reason) == ("Unknown", "TooFewRequests") and "2 request(s)" in few.message and "10m" in few.message
    assert judge(tenant, Outcomes(met=1, missed=1), window_s=600, min_requests=20, warming=True).status is None
    below = judge(tenant, Outcomes(met=98, missed=2), window_s=600, min_requests=20, warming=True)
    assert (below.status, below.reason, below.at_risk) == ("True", "AttainmentBelowTarget", True)
    assert "98.00% of 100 request(s)" in below.message and "target 99.00%" in below.message
    met = judge(tenant, Outcomes(met=99, missed=1), window_s=600, min_requests=20, warming=False)
    assert (met.status, met.reason) == ("False", "AttainmentMet")
    batch = tenant.model_copy(update={"spec": tenant.spec.model_copy(update={"objectives": tenant.spec.objectives.model_copy(update={"ttft_ms": None, "tpot_ms": None})})})
    assert judge(batch, Outcomes(), window_s=600, min_requests=20, warming=False).reason == "NoObjectives"
    assert Outcomes(met=2, missed=1).attainment == 0.6667 and Outcomes().attainment is None
