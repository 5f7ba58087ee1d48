"""CustomResourceDefinitions generated from the pydantic models (the one source of truth).

Pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3 schema. The
conversion inlines `$ref`s, turns `X | None` into `nullable`, numeric `exclusiveMinimum` into
OpenAPI 3.0's boolean form, free-form objects into `x-kubernetes-preserve-unknown-fields`, and
attaches the CEL rules each model module declares.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from slaq.api.common import GROUP, VERSION
from slaq.api.pool import POOL_CEL_RULES, InferencePoolSpec, InferencePoolStatus
from slaq.api.tenant import TENANT_CEL_RULES, TenantSLASpec, TenantSLAStatus

_DROPPED_KEYS = {"title", "$defs", "examples"}


def _openapi(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_openapi(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _openapi(merged, defs)
    if "anyOf" in node:
        variants = [v for v in node["anyOf"] if v.get("type") != "null"]
        if len(variants) == 1 and len(node["anyOf"]) == 2:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            merged = {**_openapi(variants[0], defs), **_openapi(rest, defs), "nullable": True}
            if merged.get("default", 0) is None:
                del merged["default"]
            return merged
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {name: _openapi(prop, defs) for name, prop in value.items()}
        else:
            out[key] = _openapi(value, defs)
    for name, prop in out.get("properties", {}).items():
        # An empty default on optional sub-objects lets the API server apply the defaults inside them.
        if name not in out.get("required", []) and "properties" in prop and "default" not in prop and not prop.get("nullable"):
            prop["default"] = {}
    if out.get("type") == "object":
        extra = out.pop("additionalProperties", None)
        if "properties" not in out:
            if extra is True or extra == {} or extra is None:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(extra, dict):
                out["additionalProperties"] = extra
    if out.get("default", 0) is None:
        del out["default"]
    return out


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return _openapi(schema, schema.get("$defs", {}))


def _attach_rules(root: dict[str, Any], rules: dict[str, list[dict[str, str]]]) -> None:
    for path, path_rules in rules.items():
        node = root
        for part in path.split("."):
            node = node["properties"][part]
        node["x-kubernetes-validations"] = copy.deepcopy(path_rules)


def _resource_schema(spec: type[BaseModel], status: type[BaseModel], rules: dict[str, list[dict[str, str]]], description: str) -> dict[str, Any]:
    root = {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": openapi_schema(spec),
            "status": openapi_schema(status),
        },
    }
    _attach_rules(root, rules)
    return root


def _crd(*, kind: str, plural: str, singular: str, short_names: list[str], scope: str, schema: dict[str, Any],
         columns: list[dict[str, Any]], subresources: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "slaq"}},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": singular,
                      "shortNames": short_names, "categories": ["slaq"]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": schema},
                "subresources": subresources,
                "additionalPrinterColumns": columns,
            }],
        },
    }


def _column(name: str, type_: str, json_path: str, *, priority: int = 0) -> dict[str, Any]:
    """One `additionalPrinterColumns` entry; priority 1 shows only with `kubectl get -o wide`."""
    return {"name": name, "type": type_, **({"priority": priority} if priority else {}), "jsonPath": json_path}


def _condition(type_: str, field: str) -> str:
    """The JSONPath of one field of the status condition of this type."""
    return f'.status.conditions[?(@.type=="{type_}")].{field}'


def inference_pool_crd() -> dict[str, Any]:
    return _crd(
        kind="InferencePool", plural="inferencepools", singular="inferencepool", short_names=["ipool"],
        scope="Namespaced",
        schema=_resource_schema(InferencePoolSpec, InferencePoolStatus, POOL_CEL_RULES,
                                "GPU pods serving one model behind slaq's SLA-aware scheduler."),
        columns=[
            _column("Model", "string", ".spec.model.name"),
            _column("Desired", "integer", ".spec.replicas.desired"),
            _column("Ready", "integer", ".status.readyReplicas"),
            _column("SLA-Risk", "number", ".status.slaRisk"),
            _column("Status", "string", _condition("Ready", "reason")),
            _column("Age", "date", ".metadata.creationTimestamp"),
        ],
        subresources={
            "status": {},
            "scale": {"specReplicasPath": ".spec.replicas.desired", "statusReplicasPath": ".status.replicas",
                      "labelSelectorPath": ".status.selector"},
        },
    )


def tenant_sla_crd() -> dict[str, Any]:
    return _crd(
        kind="TenantSLA", plural="tenantslas", singular="tenantsla", short_names=["tsla"],
        scope="Cluster",
        schema=_resource_schema(TenantSLASpec, TenantSLAStatus, TENANT_CEL_RULES,
                                "A tenant's tier, latency objectives, cluster-wide quotas and API keys."),
        columns=[
            _column("Tier", "string", ".spec.tier"),
            _column("TTFT-ms", "number", ".spec.objectives.ttftMs"),
            _column("TPOT-ms", "number", ".spec.objectives.tpotMs"),
            _column("Attainment", "number", ".status.attainment"),
            _column("At-Risk", "string", _condition("AtRisk", "status")),
            # QuotaBelowReplicas when a quota is too small to give every replica a share; -o wide says which.
            _column("Quota", "string", _condition("QuotaSplit", "reason")),
            _column("Status", "string", _condition("Ready", "reason")),
            _column("Age", "date", ".metadata.creationTimestamp"),
            _column("Quota-Split", "string", _condition("QuotaSplit", "message"), priority=1),
        ],
        subresources={"status": {}},
    )


CRD_FILES = {
    "slaq.dev_inferencepools.yaml": inference_pool_crd,
    "slaq.dev_tenantslas.yaml": tenant_sla_crd,
}

HEADER = "# Generated by `slaq crds` from slaq.api; do not edit by hand.\n"


def render_crd_files() -> dict[str, str]:
    """File name -> YAML text of every CRD."""
    return {name: HEADER + yaml.safe_dump(build(), sort_keys=False, width=120) for name, build in CRD_FILES.items()}
