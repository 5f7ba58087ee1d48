"""`slaq bench sim` as scripts run it: a small load sweep with report and plots, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slaq.cli import main

from .conftest import SAMPLE_TRACE

ROOT = Path(__file__).resolve().parents[2]


def _slaq(*args: str, timeout: float = 110) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slaq", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(120)
def test_small_sweep_with_report_and_plots(tmp_path: Path, small_profile) -> None:
    out, plots, profile = tmp_path / "report.json", tmp_path / "plots", tmp_path / "small.yaml"
    profile.write_text(yaml.safe_dump(small_profile.model_dump(mode="json")))
    result = _slaq("sim", "--trace", str(SAMPLE_TRACE), "--requests", "80", "--load-sweep", "0.5,1.0,1.5,2.0",
                   "--policies", "fcfs,priority,oracle", "--seed", "3", "--profile", str(profile),
                   "--out", str(out), "--plots", str(plots), "--quiet")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["run"]["command"].startswith("slaq bench sim --trace ") and report["run"]["command"].endswith(" --quiet")
    assert report["run"]["date"].endswith("Z")  # the envelope docs/results.md shows (slaq.bench.envelope)
    assert [entry["load"] for entry in report["sweep"]] == [0.5, 1.0, 1.5, 2.0]
    assert report["workload"]["seed"] == 3 and report["workload"]["requests"] == 80
    # a trace given by path is named by its path: slaq cannot know its source or licence (issue 37, item 6)
    assert report["workload"]["trace_attribution"].startswith(str(SAMPLE_TRACE))
    rates = [entry["rate_rps"] for entry in report["sweep"]]
    assert rates[1] == pytest.approx(report["capacity"]["requests_per_s"], rel=1e-5)
    assert rates[3] == pytest.approx(2 * rates[1], rel=1e-5)
    for entry in report["sweep"]:
        for name in ("fcfs", "priority", "oracle"):
            figures = entry["policies"][name]
            assert figures["throughput_tok_s"] > 0
            for tier in ("critical", "standard", "batch"):
                tier_figures = figures["tiers"][tier]
                for key in ("attainment", "goodput_rps", "ttft_p99_s", "completed_fraction", "max_wait_s", "jain_fairness"):
                    assert key in tier_figures, (name, tier, key)
    assert "attainment (critical / standard / batch) by load" in result.stdout
    assert "load 2 (" in result.stdout
    assert sorted(p.name for p in plots.iterdir()) == [
        "attainment_vs_load.png", "ttft_cdf_load0.5.png", "ttft_cdf_load1.5.png", "ttft_cdf_load1.png", "ttft_cdf_load2.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots.iterdir())


def test_bad_input_is_named(capsys) -> None:
    assert main(["bench", "sim", "--trace", "/no/such.csv", "--policies", "fcfs", "--quiet"]) == 2
    assert "trace file not found: /no/such.csv" in capsys.readouterr().err
    assert main(["bench", "sim", "--policies", "fcfs,edf", "--quiet"]) == 2
    assert "unknown policy 'edf'" in capsys.readouterr().err
    assert main(["bench", "sim", "--bursts", "4:60:30", "--policies", "fcfs", "--quiet"]) == 2
    assert "burst duration must be positive and at most period / factor (15 s), got 30.0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "sim", "--load", "-1"])
    assert exit_info.value.code == 2 and "argument --load: must be > 0" in capsys.readouterr().err


def test_kv_swap_flags_are_checked_before_any_simulation(capsys) -> None:
    assert main(["bench", "sim", "--policies", "slaq", "--kv-seal-gb-s", "fast", "--quiet"]) == 2
    assert "--kv-seal-gb-s must be a number of GB/s or off, got 'fast'" in capsys.readouterr().err
    assert main(["bench", "sim", "--policies", "slaq", "--kv-host-cache-gib", "-1", "--quiet"]) == 2
    assert "--kv-host-cache-gib must be 0 or more, got -1.0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "sim", "--kv-swap", "maybe"])
    assert exit_info.value.code == 2 and "--kv-swap: invalid choice: 'maybe'" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_kv_swap_both_reports_slaq_with_and_without_swap(tmp_path: Path, small_profile) -> None:
    out, profile = tmp_path / "report.json", tmp_path / "small.yaml"
    profile.write_text(yaml.safe_dump(small_profile.model_dump(mode="json")))
    result = _slaq("sim", "--trace", str(SAMPLE_TRACE), "--requests", "40", "--load", "1.0", "--capacity-rps", "5",
                   "--policies", "slaq", "--kv-swap", "both", "--kv-seal-gb-s", "off", "--kv-host-cache-gib", "2",
                   "--profile", str(profile), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["kv_swap"] == "both" and list(report["policies"]) == ["slaq", "slaq-noswap"]
    swap = report["policies"]["slaq"]["kv_swap"]
    assert swap["host_cache_gib"] == 2.0 and swap["host_seal_gb_s"] is None and swap["host_link_gb_s"] == 55.0
    assert report["policies"]["slaq-noswap"]["kv_swap"] is None
    assert "KV swap both" in result.stdout and "sealing not counted" in result.stdout
