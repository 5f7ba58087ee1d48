"""tools/src/slaq/bench/operator_scale.py at a tiny size: the real operator against the emulator, as the script runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "src" / "slaq" / "bench" / "operator_scale.py"


def test_the_script_prints_its_figures_as_json_and_a_change_stays_within_the_call_bound(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--tenants", "20", "--pools", "3", "--models", "3", "--out", "scale.json"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"converge_s", "statuses_s", "change_s", "calls_per_change", "affected_pools", "calls_bound", "rotate_s"} <= set(result)
    assert result["rotate_s"] > 0 and result["calls_per_rotation"] >= 1  # at least the table part holding the tenant rewritten
    assert result["converge_s"] > 0 and result["change_s"] > 0
    assert result["affected_pools"] == 1  # tenant 0 selects the pools of model m0: one of three
    assert 1 <= result["calls_per_change"] <= 2 * result["affected_pools"] + 2 == result["calls_bound"]
    assert result["calls_by_kind"].get("PATCH secrets") == 1  # its one table, and no other
    assert not [kind for kind in result["calls_by_kind"] if kind.startswith(("LIST", "GET"))]
    report = json.loads((tmp_path / "scale.json").read_text())  # what docs/results.md is rendered from
    assert report["run"]["command"] == "python tools/src/slaq/bench/operator_scale.py --tenants 20 --pools 3 --models 3 --out scale.json"
    assert {k: v for k, v in report.items() if k not in ("run", "schema")} == result
