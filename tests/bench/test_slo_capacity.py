"""`slaq bench sim --slo-capacity`: the search on its own (a known boundary), and the command end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from slaq.api.common import Tier
from slaq.bench.slo_capacity import search

from .conftest import SAMPLE_TRACE
from .test_cli import _slaq


def _boundary(critical_up_to: float, standard_up_to: float):
    calls: list[float] = []

    def probe(load: float) -> dict[str, float]:
        calls.append(load)
        return {"critical": 1.0 if load <= critical_up_to else 0.9, "standard": 0.99 if load <= standard_up_to else 0.5, "batch": 0.1}

    return probe, calls


@pytest.mark.parametrize("critical_up_to, standard_up_to, expected", [(3.0, 2.13, 2.13), (0.4, 5.0, 0.4), (9.0, 9.0, 6.0)])
def test_the_search_finds_the_highest_load_meeting_every_target(critical_up_to: float, standard_up_to: float, expected: float) -> None:
    probe, calls = _boundary(critical_up_to, standard_up_to)
    found = search(probe, resolution=0.05)
    assert found.capacity <= expected and expected - found.capacity <= 0.05
    assert found.bounded == (expected < 6.0)
    assert [p["load"] for p in found.probes] == [round(c, 4) for c in calls]  # every probe kept, none run twice
    assert all(p["meets"] == (p["load"] <= expected) for p in found.probes)


@pytest.mark.parametrize("resolution", [0.1, 0.05, 0.25])
def test_the_bisection_runs_multiples_of_the_resolution_so_the_capacity_is_a_round_load_that_met(resolution: float) -> None:
    probe, _ = _boundary(2.04, 9.0)  # brackets 1.5 (met) and 2.25 (failed); the midpoints 1.875 and 2.0625 are not round
    found = search(probe, resolution=resolution)
    bisected = [p["load"] for p in found.probes[3:]]
    assert [p["load"] for p in found.probes[:3]] == [1.0, 1.5, 2.25] and bisected
    assert all(abs(load / resolution - round(load / resolution)) < 1e-6 for load in bisected), bisected
    failed = min(p["load"] for p in found.probes if not p["meets"])
    assert found.capacity <= 2.04 < failed and failed - found.capacity <= resolution + 1e-9
    assert found.capacity == {0.1: 2.0, 0.05: 2.0, 0.25: 2.0}[resolution]


def test_a_policy_failing_at_the_floor_has_no_slo_capacity() -> None:
    probe, _ = _boundary(0.0, 0.0)
    found = search(probe, floor=0.2)
    assert found.capacity == 0.0 and found.probes[-1]["load"] == 0.2


def test_targets_name_the_tiers_checked() -> None:
    probe, _ = _boundary(0.5, 5.0)
    assert 4.9 <= search(probe, {Tier.STANDARD: 0.95}).capacity <= 5.0  # critical (0.9 above 0.5) not checked


@pytest.mark.timeout(300)
def test_the_command_prints_and_reports_each_policys_slo_capacity(tmp_path: Path, small_profile) -> None:
    out, profile = tmp_path / "report.json", tmp_path / "small.yaml"
    profile.write_text(yaml.safe_dump(small_profile.model_dump(mode="json")))
    result = _slaq("sim", "--trace", str(SAMPLE_TRACE), "--requests", "60", "--slo-capacity", "--slo-resolution", "0.5",
                   "--policies", "fcfs,priority", "--profile", str(profile), "--out", str(out), "--quiet", timeout=280)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["slo_targets"] == {"critical": 0.99, "standard": 0.95}
    for name in ("fcfs", "priority"):
        entry = report["slo_capacity"][name]
        met = [p["load"] for p in entry["probes"] if p["meets"]]
        assert entry["slo_capacity"] == (max(met) if met else 0.0)
        assert all(p["load"] > entry["slo_capacity"] for p in entry["probes"] if not p["meets"])
    assert "SLO capacity (highest load with critical >= 0.99 and standard >= 0.95)" in result.stdout
    assert "priority" in result.stdout and "x priority" in result.stdout
