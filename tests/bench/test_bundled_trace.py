"""The conversation trace ships in the package and is what `slaq bench sim` reads unless told otherwise."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path

import pytest

from slaq.bench.traces import BUNDLED_TRACE, BUNDLED_TRACES, read_trace
from slaq.cli import main

from .conftest import SAMPLE_TRACE

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--requests", "12", "--policies", "fcfs", "--capacity-rps", "5", "--quiet"]


def test_the_bundled_trace_is_the_whole_conversation_trace() -> None:
    rows = read_trace(BUNDLED_TRACE)
    assert len(rows) == 19_366
    assert rows[-1].arrival_s == pytest.approx(3_501.72, abs=0.01)  # about 58 minutes of arrivals
    assert read_trace(BUNDLED_TRACE, limit=300) == read_trace(SAMPLE_TRACE)


def test_the_code_trace_is_bundled_whole_and_named_by_trace_code(tmp_path: Path) -> None:
    rows = read_trace(BUNDLED_TRACES["code"])
    assert len(rows) == 8_819 and max(r.prompt_tokens for r in rows) == 7_437
    assert sum(r.output_tokens for r in rows) / len(rows) == pytest.approx(27.88, abs=0.01)  # long prompts, short outputs
    assert _report(tmp_path, "--trace", "code")["trace"] == str(BUNDLED_TRACES["code"])


def test_every_file_of_the_traces_folder_is_package_data_with_its_attribution() -> None:
    patterns = tomllib.loads((ROOT / "tools" / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["slaq.bench"]
    folder = BUNDLED_TRACE.parent
    shipped = sorted(p.relative_to(folder.parent).as_posix() for p in folder.iterdir())
    assert shipped == ["traces/README.md", "traces/azure_llm_code_2023.csv", "traces/azure_llm_conv_2023.csv"]
    for name in shipped:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), f"{name} is not in slaq.bench's package-data"
    attribution = (folder / "README.md").read_text()
    assert "CC-BY 4.0" in attribution and "Patel et al." in attribution and "Splitwise" in attribution


def _report(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "report.json"
    assert main(["bench", "sim", *args, *QUICK, "--out", str(out)]) == 0
    return json.loads(out.read_text())["workload"]


def test_sim_reads_the_bundled_trace_when_no_trace_is_given(tmp_path: Path) -> None:
    workload = _report(tmp_path)
    assert workload["trace"] == str(BUNDLED_TRACE) and workload["arrivals"] == "trace"
    assert "Splitwise" in workload["trace_attribution"]
    first = read_trace(BUNDLED_TRACE, limit=12)
    assert workload["prompt_tokens_mean"] == pytest.approx(sum(r.prompt_tokens for r in first) / 12, abs=1e-3)


def test_synthetic_is_asked_for_and_excludes_a_trace(tmp_path: Path, capsys) -> None:
    workload = _report(tmp_path, "--synthetic")
    assert workload["trace"] is None and workload["trace_attribution"] is None and workload["arrivals"] == "poisson"
    capsys.readouterr()
    assert main(["bench", "sim", "--synthetic", "--window", "600", *QUICK]) == 2
    assert "--synthetic has no trace" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "sim", "--synthetic", "--trace", str(SAMPLE_TRACE), *QUICK])
    assert exit_info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
