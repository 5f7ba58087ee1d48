"""Render helm/slaq with the real `helm` binary (v4) and hand back the objects as dicts."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "slaq"
RELEASE = "slaq"
NAMESPACE = "slaq-system"
PROMETHEUS_OPERATOR_API = "monitoring.coreos.com/v1/PodMonitor"
# The chart renders only with an operator image named (no slaq image is published): every render
# here names this one unless a test's values say otherwise.
OPERATOR_REPOSITORY = "registry.test/slaq-operator"
REQUIRED_VALUES: dict[str, Any] = {"image": {"repository": OPERATOR_REPOSITORY}}
# The same for helm commands that take no values file (lint, a bare template).
REQUIRED_SET = ("--set", f"image.repository={OPERATOR_REPOSITORY}")

# Every optional part of the chart switched on (used by the model and lint tests).
EVERYTHING_ON = {
    "networkPolicy": {"enabled": True, "monitoringNamespaces": ["monitoring", "grafana"]},
    "monitoring": {"podMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
    "alerts": {"enabled": True},
    "autoscaling": {
        "prometheusAdapter": {"enabled": True},
        "keda": {"enabled": True, "pools": [{"name": "llama", "namespace": "team-a", "minReplicas": 1, "maxReplicas": 4, "targetProtectedLoad": 0.8}]},
    },
    "rbac": {"secretNamespaces": ["team-a", "team-b"]},
    "operator": {"extraEnv": [{"name": "KOPF_X", "value": "1"}],
                 "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]},
    "imagePullSecrets": ["registry"],
}

# helm says so on stderr every time it follows files/crds to crds/; it is expected, not a problem.
_SYMLINK_NOTICE = "found symbolic link in path"


class HelmError(Exception):
    """helm exited non-zero; the message carries its stderr."""


def helm_binary() -> str:
    binary = shutil.which("helm")
    if binary is None:
        raise HelmError("the `helm` v4 binary is not on PATH: run scripts/setup.sh (scripts/install_k8s_tools.py installs it)")
    return binary


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} failed ({result.returncode}):\n{_stderr(result)}")
    return result


def _stderr(result: subprocess.CompletedProcess[str]) -> str:
    return "\n".join(line for line in result.stderr.splitlines() if _SYMLINK_NOTICE not in line)


def with_required(values: dict[str, Any] | None) -> dict[str, Any]:
    """`values` over REQUIRED_VALUES (a test's own image values win)."""
    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        merged = dict(base)
        for key, value in over.items():
            merged[key] = merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
        return merged

    return merge(REQUIRED_VALUES, values or {})


def template_args(values: dict[str, Any] | None, api_versions: Iterable[str], chart: Path | str, values_file: Path) -> list[str]:
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE]
    values_file.write_text(json.dumps(with_required(values)), encoding="utf-8")  # JSON is YAML
    args += ["--values", str(values_file)]
    for api_version in api_versions:
        args += ["--api-versions", api_version]
    return args


def render_text(values: dict[str, Any] | None = None, api_versions: Iterable[str] = (), chart: Path | str = CHART) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return run_helm(*template_args(values, api_versions, chart, Path(tmp) / "values.json")).stdout


def render(values: dict[str, Any] | None = None, api_versions: Iterable[str] = (), chart: Path | str = CHART) -> list[dict[str, Any]]:
    """Every object `helm template` renders, in order."""
    return [doc for doc in yaml.safe_load_all(render_text(values, api_versions, chart)) if doc]


def render_failure(values: dict[str, Any]) -> str:
    """helm's error output for values the chart must refuse; fails the test if helm accepts them."""
    with tempfile.TemporaryDirectory() as tmp:
        result = run_helm(*template_args(values, (), CHART, Path(tmp) / "values.json"), check=False)
    if result.returncode == 0:
        raise AssertionError(f"helm accepted values it should refuse: {values}")
    return _stderr(result)


def notes(values: dict[str, Any] | None = None) -> str:
    """NOTES.txt as `helm install` prints it (client-side dry run: no cluster involved)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = template_args(values, (), CHART, Path(tmp) / "values.json")
        args[0] = "install"
        output = run_helm(*args, "--dry-run=client").stdout
    return output.split("NOTES:\n", 1)[1]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def kinds(objects: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objects}
