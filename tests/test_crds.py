"""The committed CRDs are exactly what the models generate, structural, and agree with the models."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from slaq.api.crdgen import render_crd_files
from slaq.manifests import load_manifests

ROOT = Path(__file__).resolve().parent.parent
CRDS = {name: yaml.safe_load(text) for name, text in render_crd_files().items()}


@pytest.mark.parametrize("name", sorted(CRDS))
def test_committed_crd_matches_a_fresh_generation(name: str) -> None:
    committed = (ROOT / "crds" / name).read_text(encoding="utf-8")
    assert committed == render_crd_files()[name], f"crds/{name} is stale: run `slaq crds`"


def _walk(node: object, path: str = "$"):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}[{index}]")


@pytest.mark.parametrize("name", sorted(CRDS))
def test_schema_is_structural(name: str) -> None:
    schema = CRDS[name]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        assert "title" not in node and "const" not in node, path
        if "properties" in node:
            assert node.get("type") == "object" and "additionalProperties" not in node, path
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(key) is None or isinstance(node[key], bool), path


def _schema(kind: str) -> dict:
    crd = next(c for c in CRDS.values() if c["spec"]["names"]["kind"] == kind)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("manifest", [m for m in load_manifests([ROOT / "crds" / "examples"]) if m.body["kind"] in ("InferencePool", "TenantSLA")], ids=lambda m: m.label)
def test_examples_validate_against_the_crd_schema(manifest) -> None:
    jsonschema.Draft4Validator(_schema(manifest.body["kind"])).validate(manifest.body)


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("TenantSLA", ("spec", "tier"), "gold"),
        ("TenantSLA", ("spec", "quotas", "requestsPerMinute"), -1),
        ("TenantSLA", ("spec", "quotas", "kvCacheShare"), 0),
        ("InferencePool", ("spec", "model", "gpuMemoryUtilization"), 1.5),
        ("InferencePool", ("spec", "drainTimeout"), "soon"),
        ("InferencePool", ("spec", "resources", "memory"), "lots"),
    ],
)
def test_crd_schema_refuses_what_the_models_refuse(kind: str, path: tuple[str, ...], value: object) -> None:
    example = next(m.body for m in load_manifests([ROOT / "crds" / "examples"]) if m.body["kind"] == kind)
    node = example
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(_schema(kind)).validate(example)


def test_pool_has_scale_and_status_subresources() -> None:
    version = CRDS["slaq.dev_inferencepools.yaml"]["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas.desired"
    assert version["subresources"]["scale"]["labelSelectorPath"] == ".status.selector"
    assert "status" in version["subresources"]
    rules = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["replicas"]["x-kubernetes-validations"]
    assert any(r["rule"] == "self.min <= self.max" for r in rules)


def test_tenant_is_cluster_scoped_with_printer_columns() -> None:
    crd = CRDS["slaq.dev_tenantslas.yaml"]
    assert crd["spec"]["scope"] == "Cluster"
    columns = {c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Tier", "TTFT-ms", "Attainment", "At-Risk"} <= columns


def test_kubectl_get_tenantsla_shows_why_a_quota_cannot_serve_every_replica() -> None:
    columns = {c["name"]: c for c in CRDS["slaq.dev_tenantslas.yaml"]["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Quota"]["jsonPath"] == '.status.conditions[?(@.type=="QuotaSplit")].reason'
    assert columns["Quota-Split"]["jsonPath"] == '.status.conditions[?(@.type=="QuotaSplit")].message'
    assert columns["Quota-Split"]["priority"] == 1  # the numbers, with -o wide


def test_optional_sub_objects_default_so_nested_defaults_apply() -> None:
    spec = _schema("InferencePool")["properties"]["spec"]
    assert spec["properties"]["engine"]["default"] == {}
    assert spec["properties"]["engine"]["properties"]["maxNumSeqs"]["default"] == 256
    assert "default" not in spec["properties"]["model"]  # required: no default
