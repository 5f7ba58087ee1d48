"""The schedule() overhead benchmark runs and prints a ratio per queue size (figures are not asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "src" / "slaq" / "bench" / "sched_overhead.py"


def test_benchmark_prints_a_row_per_scenario_and_size(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("sched_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # in-process: vLLM is imported once per test session
    out = tmp_path / "overhead.json"
    assert module.main(["--steps", "3", "--sizes", "10,20", "--repeats", "1", "--max-num-seqs", "8", "--out", str(out)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(("full", "same", "churn"))]
    assert [(row[0], row[1]) for row in rows] == [(s, n) for s in ("full", "same", "churn") for n in ("10", "20")]
    assert all(len(row) == 13 and float(row[7]) > 0 and float(row[-1]) > 0 for row in rows)
    same = [row for row in rows if row[0] == "same"]
    assert all(row[8] == row[9] and row[10] == row[11] and "/0.0/" in row[10] for row in same)  # the same decisions
    report = json.loads(out.read_text())  # what docs/results.md is rendered from
    assert report["run"]["command"] == ("python tools/src/slaq/bench/sched_overhead.py --steps 3 --sizes 10,20 --repeats 1 "
                                        f"--max-num-seqs 8 --out {out}")
    assert [(row["scenario"], row["waiting"]) for row in report["rows"]] == [(s, n) for s in ("full", "same", "churn") for n in (10, 20)]
    assert all(row["ratio_p50"] > 0 for row in report["rows"])
