"""Every rendered object parses into the official Kubernetes models without losing a field.

The `kubernetes` client's deserializer silently drops keys its models do not know, so each object
is parsed and serialized back: a misspelt field (`securityContxt`) or one at the wrong level shows
up as a difference, and a missing required field fails the model's own validation.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from tests.helm.chart import EVERYTHING_ON, PROMETHEUS_OPERATOR_API, render

# Kinds from outside Kubernetes itself: no official model exists; they are checked in test_chart_render.py
# and (PrometheusRule) test_chart_metrics.py.
NOT_BUILT_IN = {"PodMonitor", "ScaledObject", "PrometheusRule"}


def parse(obj: dict[str, Any], model: str) -> Any:
    """The object as the client parses an API server's JSON answer."""
    return client.ApiClient().deserialize(json.dumps(obj), model, "application/json")


def model_name(api_version: str, kind: str) -> str:
    """apps/v1 + Deployment -> V1Deployment, the class name the client generates."""
    version = api_version.rsplit("/", 1)[-1]
    return version[0].upper() + version[1:] + kind


def _rendered(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    return render(values, api_versions=[PROMETHEUS_OPERATOR_API])


RENDERED = [(label, obj) for label, values in (("defaults", None), ("everything-on", EVERYTHING_ON)) for obj in _rendered(values)]
CASES = [(label, obj) for label, obj in RENDERED if obj["kind"] not in NOT_BUILT_IN]


@pytest.mark.parametrize(("label", "obj"), CASES, ids=[f"{label}-{o['kind']}-{o['metadata']['name']}" for label, o in CASES])
def test_object_round_trips_through_the_official_model(label: str, obj: dict[str, Any]) -> None:
    api = client.ApiClient()
    name = model_name(obj["apiVersion"], obj["kind"])
    assert hasattr(client, name), f"no official model {name} for {obj['apiVersion']} {obj['kind']}"
    model = parse(obj, name)
    assert type(model).__name__ == name
    assert api.sanitize_for_serialization(model) == obj


def test_everything_on_renders_every_optional_kind() -> None:
    kinds = {obj["kind"] for _, obj in RENDERED}
    assert {"NetworkPolicy", "ConfigMap", "Role", "RoleBinding", "PodMonitor", "ScaledObject", "PrometheusRule", "CustomResourceDefinition"} <= kinds


def test_the_round_trip_catches_a_misspelt_field() -> None:
    deployment = next(obj for label, obj in CASES if obj["kind"] == "Deployment")
    broken = json.loads(json.dumps(deployment))
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["securityContxt"] = container.pop("securityContext")
    api = client.ApiClient()
    assert api.sanitize_for_serialization(parse(broken, "V1Deployment")) != broken


def test_the_model_refuses_a_missing_required_field() -> None:
    deployment = next(obj for label, obj in CASES if obj["kind"] == "Deployment")
    broken = json.loads(json.dumps(deployment))
    del broken["spec"]["selector"]
    with pytest.raises(ValueError, match="selector"):
        parse(broken, "V1Deployment")
