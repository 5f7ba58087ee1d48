"""scripts/gpu_check.sh --dry-run: on CPU it names every GPU step and checks what CPU can check (the
kernels against their references, the Llama-3-8B model directories, the erase test's selection and
engine flags, the pod check's plan: the pod as shipped, swap on). The GPU run itself needs CUDA and is not run here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_names_each_gpu_step_and_its_cpu_checks_pass(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    steps = [line.split(":")[0] for line in out.splitlines() if line.startswith("== ")]
    assert steps == ["== kernels", "== erase-test", "== step-times", "== seal-cost", "== pod"], out
    assert "gpu_pod_check.py" in out and "pod: engine command engine" in out
    assert "seal_cost --device cuda" in out and (tmp_path / "seal_cost-cpu.json").exists()
    assert "slaq.kernels.check --device cuda" in out and "gpu_step_times.py" in out
    assert "erase test: 2 tests selected" in out and "--device gpu" in out and "--block-size 128" in out
    assert (tmp_path / "kernels-cpu.json").exists()
    assert out.rstrip().endswith("gpu_check.sh --dry-run: passed (no GPU used)")


def test_a_gpu_run_without_cuda_stops_at_once_and_says_why(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--out", str(tmp_path / "out")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode != 0 and "no CUDA device (use --dry-run on CPU)" in result.stderr
    assert not (tmp_path / "out").exists()  # stopped before writing anything


def test_unknown_arguments_are_refused_by_name() -> None:
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dryrun"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown argument --dryrun" in result.stderr
