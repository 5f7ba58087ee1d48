"""`tools/src/slaq/bench/kv_security_cost.py`: the report it writes and how docs/results.md renders it
(a small geometry: the wiring, not the machine's figures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slaq.bench import kv_security_cost as cost
from slaq.bench.results import check_report, render_section


def test_the_report_carries_seal_open_and_erase_figures_and_renders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(cost, "GEOMETRY", {"layers": 2, "block_size": 16, "kv_heads": 2, "head_dim": 64})
    monkeypatch.setattr(cost, "SEAL_BLOCKS", 2)
    monkeypatch.setattr(cost, "ERASE_BLOCKS", 16)
    monkeypatch.setattr(cost, "ERASE_BATCH", 4)
    out = tmp_path / "kv-security-cost.json"
    assert cost.main(["--device", "cpu", "--repeats", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    check_report("kv-security-cost", report)
    assert report["schema"] == cost.SCHEMA and report["run"]["command"].startswith("python tools/src/slaq/bench/kv_security_cost.py")
    seal = report["seal"]
    assert seal["block_bytes"] == 2 * 2 * 16 * 2 * 64 * 2  # layers x K,V x tokens x heads x dim x bf16
    assert seal["seal_gb_s"] > 0 and seal["open_gb_s"] > 0 and seal["out_and_back_us_per_token"] > 0
    assert report["erase"]["batch_blocks"] == 4 and not report["erase"]["triton"]
    page = "\n".join(render_section("kv-security-cost", report))
    assert "seal / open GB/s" in page and "torch reference" in page
    assert "report:" in capsys.readouterr().out


def test_bad_repeats_are_refused(capsys) -> None:
    assert cost.main(["--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err
