"""The rendered PrometheusRule, read and evaluated by Prometheus' own promtool (Debian's `prometheus`
package, installed by scripts/setup.sh): `promtool check rules`, and `promtool test rules` unit tests
generated from the rendered chart in which every alert fires on series that burn at its rate over its
windows and stays silent on series that do not (tests/helm/alert_scenarios.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.alert_scenarios import BURN_ALERT, POOL_ALERT_TESTS, unit_tests, without_annotations
from tests.helm.chart import PROMETHEUS_OPERATOR_API, kinds, of_kind, render, render_failure

ALERTS_ON = {"alerts": {"enabled": True}}


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        raise AssertionError("promtool is not on PATH: run scripts/setup.sh (Debian's `prometheus` package carries it)")
    return binary


def rule_groups(values: dict[str, Any]) -> list[dict[str, Any]]:
    (rule,) = of_kind(render(values), "PrometheusRule")
    return rule["spec"]["groups"]


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_promtool_checks_the_rendered_rules(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups(ALERTS_ON)}), encoding="utf-8")
    result = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "rules found" in result.stdout


def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    """The check above can fail: the same rules with one expression cut short are refused."""
    groups = rule_groups(ALERTS_ON)
    groups[0]["rules"][0]["expr"] = groups[0]["rules"][0]["expr"].rsplit("/", 1)[0] + "/"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    assert run_promtool("check", "rules", "rules.yaml", cwd=tmp_path).returncode != 0


def _run_unit_tests(tmp_path: Path, groups: list[dict[str, Any]]) -> tuple[subprocess.CompletedProcess[str], list[dict], dict[str, set[str]]]:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": without_annotations(groups)}), encoding="utf-8")
    files, outcome = unit_tests(groups, "rules.yaml")
    for name, content in files.items():
        (tmp_path / name).write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
    tests = [t for content in files.values() for t in content["tests"]]
    return run_promtool("test", "rules", *files, cwd=tmp_path), tests, outcome


@pytest.mark.parametrize("values", [ALERTS_ON, {"alerts": {"enabled": True, "engineDown": {"for": "2m"}, "shedding": {"ratio": 0.2, "for": "5m"},
                                                           "quotaSaturation": {"ratio": 0.3, "for": "10m"}}}],
                         ids=["defaults", "other-thresholds"])
def test_every_alert_fires_on_its_burn_and_stays_silent_below_it(tmp_path: Path, values: dict[str, Any]) -> None:
    groups = rule_groups(values)
    result, tests, outcome = _run_unit_tests(tmp_path, groups)
    assert result.returncode == 0, result.stdout + result.stderr
    # Every alert the chart renders has a test that expects it to fire and one that expects silence.
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    assert alerts == {BURN_ALERT, *POOL_ALERT_TESTS}
    for test in tests:
        checks = test["alert_rule_test"]
        assert any(c["exp_alerts"] for c in checks) or BURN_ALERT in test["name"], test["name"]
        assert any(not c["exp_alerts"] for c in checks) or BURN_ALERT in test["name"], test["name"]
    # Each burn rule fires at 1.25x its rate over both windows, and not at 0.8x, nor when the burn
    # stopped just before its short window (the long window alone still over the threshold).
    windows = {f"{r['labels']['long_window']}/{r['labels']['short_window']}" for g in groups for r in g["rules"] if r.get("alert") == BURN_ALERT}
    assert windows == {"1h/5m", "6h/30m", "1d/2h", "3d/6h"}
    for key in windows:
        assert key in outcome[f"{key} fires"], key
        assert key not in outcome[f"{key} just_below"], key
        assert key not in outcome[f"{key} stopped"], key
    # The tenant that never misses is never in an expected alert.
    assert not any(a["exp_labels"].get("tenant") == "calm" for t in tests for c in t["alert_rule_test"] for a in c["exp_alerts"])


def test_a_wrong_expectation_fails_the_unit_tests(tmp_path: Path) -> None:
    """promtool really compares: expecting the burning tenant silent in the 1h/5m case fails."""
    groups = rule_groups(ALERTS_ON)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": without_annotations(groups)}), encoding="utf-8")
    files, _ = unit_tests(groups, "rules.yaml")
    minute = files["tests-1m.yaml"]
    fires = next(t for t in minute["tests"] if t["name"] == f"{BURN_ALERT} 1h/5m: fires")
    fires["alert_rule_test"][0]["exp_alerts"] = []
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({**minute, "tests": [fires]}, sort_keys=False), encoding="utf-8")
    result = run_promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr


# On by default with the PodMonitor ------------------------------------------------------------------

def test_alerts_follow_the_podmonitor_by_default() -> None:
    with_operator = render(api_versions=[PROMETHEUS_OPERATOR_API])
    assert {"PodMonitor", "PrometheusRule"} <= kinds(with_operator)
    assert "PrometheusRule" not in kinds(render())  # no Prometheus Operator: neither is rendered
    no_monitor = render({"monitoring": {"podMonitor": {"enabled": False}}}, api_versions=[PROMETHEUS_OPERATOR_API])
    assert not {"PodMonitor", "PrometheusRule"} & kinds(no_monitor)


def test_alerts_can_be_forced_on_or_off() -> None:
    assert "PrometheusRule" in kinds(render(ALERTS_ON))  # e.g. for a Prometheus that scrapes by annotation
    assert "PrometheusRule" not in kinds(render({"alerts": {"enabled": False}}, api_versions=[PROMETHEUS_OPERATOR_API]))


def test_alerts_enabled_takes_only_true_false_or_auto() -> None:
    assert "/alerts/enabled" in render_failure({"alerts": {"enabled": "yes"}})
