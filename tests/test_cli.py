"""`slaq crds` and `slaq validate` as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _slaq(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slaq", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_crds_check_reports_no_drift() -> None:
    result = _slaq("crds", "--check")
    assert result.returncode == 0, result.stderr


def test_crds_writes_identical_files(tmp_path: Path) -> None:
    assert _slaq("crds", "--out", str(tmp_path)).returncode == 0
    for file in tmp_path.iterdir():
        assert file.read_text() == (ROOT / "crds" / file.name).read_text()


def test_validate_accepts_the_examples() -> None:
    result = _slaq("validate", *sorted(str(p) for p in (ROOT / "crds" / "examples").glob("*.yaml")))
    assert result.returncode == 0, result.stderr
    assert "0 error(s)" in result.stdout


def test_validate_names_the_bad_field_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: slaq.dev/v1alpha1\nkind: TenantSLA\nmetadata: {name: t}\n"
        "spec: {tier: critical, objectives: {ttftMs: 50}, quotas: {requestsPerMinute: -1},"
        " apiKeySecretRef: {name: k, namespace: ns}}\n"
    )
    result = _slaq("validate", str(bad))
    assert result.returncode == 1
    assert "spec.quotas.requestsPerMinute" in result.stderr


def test_validate_reports_yaml_syntax_errors(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("kind: [unclosed\n")
    result = _slaq("validate", str(bad))
    assert result.returncode == 1 and "error" in result.stderr


def test_validate_reports_missing_files(tmp_path: Path) -> None:
    result = _slaq("validate", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1 and "no such file" in result.stderr


def test_passthrough_args_drop_only_the_leading_separator() -> None:
    from slaq.cli import passthrough_args

    assert passthrough_args(["--", "--enforce-eager", "--", "x"]) == ["--enforce-eager", "--", "x"]
    assert passthrough_args(["--enforce-eager"]) == ["--enforce-eager"]
    assert passthrough_args([]) == []
