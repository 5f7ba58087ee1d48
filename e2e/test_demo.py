"""`slaq up --demo --quick --json F` as CI runs it: the real stock vLLM engine, the real slaq engine
and sidecar, scenario 4.5 and a (short) loaded run, checked through the JSON it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO_TIMEOUT_S = 1200.0  # two engine starts under a loaded CI machine, then about a minute of runs


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("demo") / "demo.json"
    result = subprocess.run([sys.executable, "-u", "-m", "slaq", "up", "--demo", "--quick", "--json", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=DEMO_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(out.read_text()), result.stdout


@pytest.mark.engine
def test_scenario_45_under_slaq_serves_a_first_and_c_before_b_and_b_finishes(demo: tuple[dict, str]) -> None:
    report, _ = demo
    slaq = report["scenario_45"]["slaq"]
    # The scheduler's order, from the engine's own request log: the first tokens' arrival at the
    # client (`together`) also carries the output path's stalls on this machine (scenario45.ScenarioRun).
    groups = slaq["engine_together"]
    assert groups is not None, f"the engine's log has no line for A, B or C; the client saw {slaq['together']}"
    order = [letter for group in groups for letter in group]
    assert "A" in groups[0], f"A did not start first under slaq: {groups}"  # C may start in the same step as A
    assert order.index("C") < order.index("B") and not any("C" in g and "B" in g for g in groups), \
        f"C did not start before B under slaq (backfill): {groups} (the client saw {slaq['together']}), TTFT {slaq['ttft_ms']}"
    assert slaq["finished"]["B"], "B never finished under slaq (starved)"
    for system in ("fcfs", "priority"):  # the baselines ran and were recorded, whatever their order
        assert sorted(report["scenario_45"][system]["order"]) == ["A", "B", "C"]


@pytest.mark.engine
def test_the_loaded_run_gives_the_vip_tenant_more_attainment_under_slaq(demo: tuple[dict, str]) -> None:
    report, stdout = demo
    stock, slaq = report["load"]["stock"]["A"], report["load"]["slaq"]["A"]
    assert stock["sent"] == slaq["sent"] > 0
    assert slaq["attainment"] > stock["attainment"], f"VIP attainment: stock {stock}, slaq {slaq}"
    assert slaq["sidecar_ttft_p99_ms"] is not None and stock["sidecar_ttft_p99_ms"] is None
    assert Path(report["png"]).read_bytes()[:4] == b"\x89PNG" and f"picture: {report['png']}" in stdout
    assert "scenario 4.5" in stdout and "A (VIP)" in stdout
