"""scripts/setup.sh refuses a Python that pip may not install into (PEP 668), saying what to do.
(Its other path, a Python pip may install into, is what every CI run takes.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fake_python(tmp_path: Path, answer: str) -> Path:
    """An interpreter stand-in that answers setup.sh's PEP 668 question and fails on anything else."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = - ]; then cat >/dev/null; echo {answer}; exit 0; fi\nexit 99\n")
    fake.chmod(0o755)
    return fake


def test_an_externally_managed_python_is_refused_with_the_venv_command(tmp_path: Path) -> None:
    fake = _fake_python(tmp_path, "managed")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "PEP 668" in result.stderr and f"{fake} -m venv .venv" in result.stderr

