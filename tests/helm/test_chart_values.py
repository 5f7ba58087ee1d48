"""values.yaml documents every value in a sentence; values.schema.json matches it and refuses bad values."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

from tests.helm.chart import CHART, render_failure

VALUES_TEXT = (CHART / "values.yaml").read_text(encoding="utf-8")
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))

_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][\w.-]*):")


def _documented_keys(text: str) -> dict[str, list[str]]:
    """Dotted path of every mapping key in values.yaml -> the comment lines right above it."""
    lines = text.splitlines()
    stack: list[tuple[int, str]] = []
    comments: dict[str, list[str]] = {}
    for number, line in enumerate(lines):
        match = _KEY_LINE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        above = []
        for previous in reversed(lines[:number]):
            stripped = previous.strip()
            if not stripped.startswith("#") or len(previous) - len(previous.lstrip()) != indent:
                break
            above.insert(0, stripped.lstrip("# "))
        comments[".".join(key for _, key in stack)] = above
    return comments


def _schema_values(node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every value the schema defines: leaves, and objects documented as a whole (resources).

    An object whose key has no comment in values.yaml is a section: each of its keys is a value.
    """
    for name, child in node.get("properties", {}).items():
        path = f"{prefix}{name}"
        if "properties" in child and not DOCUMENTED.get(path):
            yield from _schema_values(child, f"{path}.")
        else:
            yield path, child


def _schema_sections(node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield prefix.rstrip(".") or "(root)", node
    for name, child in node.get("properties", {}).items():
        if "properties" in child:
            yield from _schema_sections(child, f"{prefix}{name}.")


DOCUMENTED = _documented_keys(VALUES_TEXT)
SCHEMA_VALUES = dict(_schema_values(SCHEMA))


def test_schema_and_values_yaml_define_the_same_values() -> None:
    in_values = {path for path in SCHEMA_VALUES if path != "global"}
    missing_from_values = {p for p in in_values if p not in DOCUMENTED}
    assert not missing_from_values, f"in the schema but not in values.yaml: {sorted(missing_from_values)}"
    sections = {path for path, _ in _schema_sections(SCHEMA)}
    top_level_of_values = {p for p in DOCUMENTED if not any(p.startswith(v + ".") for v in SCHEMA_VALUES)}
    unknown = top_level_of_values - set(SCHEMA_VALUES) - sections
    assert not unknown, f"in values.yaml but not in the schema: {sorted(unknown)}"


@pytest.mark.parametrize("path", sorted(p for p in SCHEMA_VALUES if p != "global"))
def test_every_value_is_documented_in_a_full_sentence(path: str) -> None:
    sentence = " ".join(DOCUMENTED[path])
    assert sentence, f"{path} has no comment above it in values.yaml"
    assert sentence[0].isupper() and sentence.endswith("."), f"{path}: not a full sentence: {sentence!r}"
    assert len(sentence.split()) >= 5, f"{path}: too short to explain anything: {sentence!r}"


@pytest.mark.parametrize("path", sorted(SCHEMA_VALUES))
def test_every_schema_value_has_a_type_and_a_description(path: str) -> None:
    assert "type" in SCHEMA_VALUES[path] and SCHEMA_VALUES[path].get("description"), path


@pytest.mark.parametrize("section", [name for name, _ in _schema_sections(SCHEMA)])
def test_every_section_refuses_unknown_keys(section: str) -> None:
    node = dict(_schema_sections(SCHEMA))[section]
    assert node.get("additionalProperties") is False, f"{section} accepts unknown keys"


def test_defaults_satisfy_the_schema() -> None:
    jsonschema.Draft7Validator(SCHEMA).validate(VALUES)


KEDA_POOL = {"name": "llama", "namespace": "team-a", "minReplicas": 1, "maxReplicas": 4, "targetProtectedLoad": 0.8}


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"crd": {"enabled": False}}, "'crd' not allowed"),
        ({"crds": {"enable": False}}, "'enable' not allowed"),
        ({"crds": {"enabled": "no"}}, "/crds/enabled"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"operator": {"healthPort": "8080"}}, "/operator/healthPort"),
        ({"operator": {"healthPort": 80}}, "/operator/healthPort"),
        ({"operator": {"verbose": "yes"}}, "/operator/verbose"),
        ({"operator": {"observeIntervalSeconds": 0}}, "/operator/observeIntervalSeconds"),
        ({"operator": {"logLevel": "debug"}}, "'logLevel' not allowed"),
        ({"rbac": {"secretNamespaces": "team-a"}}, "/rbac/secretNamespaces"),
        ({"rbac": {"secretNamespaces": ["Team_A"]}}, "/rbac/secretNamespaces/0"),
        ({"operator": {"watchNamespaces": ["team-a"]}}, "'watchNamespaces' not allowed"),
        ({"operator": {"resources": {"request": {"cpu": "1"}}}}, "'request' not allowed"),
        ({"operator": {"replicas": 2}}, "'replicas' not allowed"),
        ({"networkPolicy": {"enabled": True, "monitoringNamespaces": "monitoring"}}, "/networkPolicy/monitoringNamespaces"),
        ({"networkPolicy": {"from": [{"podSelector": {}}]}}, "'from' not allowed"),  # peers are the pool's (spec.network)
        ({"monitoring": {"podMonitor": {"interval": "often"}}}, "/monitoring/podMonitor/interval"),
        ({"pools": {"podLabels": None}}, "missing property 'podLabels'"),
        ({"autoscaling": {"keda": {"enabled": True, "pools": [{**KEDA_POOL, "targetProtectedLoad": 0}]}}}, "/autoscaling/keda/pools/0/targetProtectedLoad"),
        ({"autoscaling": {"keda": {"enabled": True, "pools": [{k: v for k, v in KEDA_POOL.items() if k != "namespace"}]}}}, "missing property 'namespace'"),
        ({"autoscaling": {"keda": {"pools": [{**KEDA_POOL, "min": 1}]}}}, "'min' not allowed"),
        ({"autoscaling": {"keda": {"scaleDownStabilizationSeconds": 7200}}}, "/autoscaling/keda/scaleDownStabilizationSeconds"),
    ],
)
def test_schema_refuses_typos_and_wrong_types(values: dict[str, Any], complaint: str) -> None:
    error = render_failure(values)
    assert "values don't meet the specifications of the schema" in error
    assert complaint in error, error


def test_readme_lists_every_value() -> None:
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    missing = [path for path in SCHEMA_VALUES if path != "global" and f"| `{path}` |" not in readme]
    assert not missing, f"helm/slaq/README.md has no row for {missing}"
