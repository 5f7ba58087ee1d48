"""The NetworkPolicy a pool owns (netpol.py), rendered without an API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import codecs
from pydantic import ValidationError

from slaq.api.pool import InferencePool
from slaq.api.runtime import ENGINE_PORT, METRICS_PORT_NAME, SIDECAR_PORT_NAME
from slaq.operator.children import render_children, render_deployment
from tests.support.images import TEST_IMAGES
from slaq.operator.netpol import NetworkPolicySettings, render_network_policy

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"


def gpu_pool(**spec: Any) -> InferencePool:
    body = yaml.safe_load((EXAMPLES / "pool-gpu.yaml").read_text())
    body["spec"].update(spec)
    return TEST_IMAGES.resolve(InferencePool.model_validate(body))


def rules(policy: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Peers by port name; fails on a rule with more than one port or none."""
    out = {}
    for rule in policy["spec"]["ingress"]:
        (port,) = rule["ports"]
        assert port["protocol"] == "TCP"
        out[port["port"]] = rule["from"]
    return out


def in_namespace(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}


def test_by_default_the_tenant_port_admits_the_pools_namespace_and_metrics_only_monitoring_and_the_operator() -> None:
    pool = gpu_pool()
    policy = render_network_policy(pool, NetworkPolicySettings(operator_namespace="slaq-system", monitoring_namespaces=("monitoring",)))
    assert policy["metadata"]["namespace"] == "inference" and policy["metadata"]["name"] == "llama3-8b"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert rules(policy) == {
        SIDECAR_PORT_NAME: [in_namespace("inference")],
        METRICS_PORT_NAME: [in_namespace("monitoring"), in_namespace("slaq-system")],
    }
    # The policy selects exactly the pool's pods.
    template = render_deployment(pool)["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert policy["spec"]["podSelector"]["matchLabels"] == render_deployment(pool)["spec"]["selector"]["matchLabels"]


def test_the_policy_names_only_ports_the_pod_exposes_and_never_the_engines() -> None:
    pool = gpu_pool()
    template = render_deployment(pool)["spec"]["template"]
    exposed = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
    admitted = set(rules(render_network_policy(pool)))
    assert admitted == exposed == {SIDECAR_PORT_NAME, METRICS_PORT_NAME}
    assert ENGINE_PORT not in admitted and str(ENGINE_PORT) not in admitted


def test_peers_the_pool_names_replace_the_default_and_metrics_peers_add_to_monitoring() -> None:
    gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway-system"}},
               "podSelector": {"matchLabels": {"app": "envoy"}}}
    ingress = {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]}}
    picker = {"podSelector": {"matchLabels": {"app": "llama3-8b-epp"}}}
    pool = gpu_pool(network={"ingressFrom": [gateway, ingress], "metricsFrom": [picker]})
    policy = render_network_policy(pool, NetworkPolicySettings("ops", ("monitoring", "ops", "grafana")))
    assert rules(policy) == {
        SIDECAR_PORT_NAME: [gateway, ingress],  # the pool's own namespace is no longer admitted
        METRICS_PORT_NAME: [in_namespace("monitoring"), in_namespace("ops"), in_namespace("grafana"), picker],
    }


def test_no_monitoring_namespaces_leaves_the_metrics_port_to_the_operator() -> None:
    policy = render_network_policy(gpu_pool(), NetworkPolicySettings("slaq-system", ()))
    assert rules(policy)[METRICS_PORT_NAME] == [in_namespace("slaq-system")]


def test_an_empty_selector_is_every_namespace_as_the_api_reads_it() -> None:
    pool = gpu_pool(network={"ingressFrom": [{"namespaceSelector": {}}]})
    assert rules(render_network_policy(pool))[SIDECAR_PORT_NAME] == [{"namespaceSelector": {}}]


@pytest.mark.parametrize("network, field", [
    ({"ingressFrom": [{}]}, "network.ingressFrom.0"),
    ({"ingressFrom": []}, "network.ingressFrom"),
    ({"metricsFrom": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}, "network.metricsFrom.0.ipBlock"),
])
def test_a_peer_that_selects_nothing_or_an_ip_block_is_refused_with_the_field_named(network: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        gpu_pool(network=network)
    assert f"\nspec.{field}\n" in str(caught.value)


def test_the_policy_comes_first_among_the_children_and_can_be_left_out() -> None:
    pool = gpu_pool()
    assert [c["kind"] for c in render_children(pool)][:2] == ["NetworkPolicy", "Service"]
    assert "NetworkPolicy" not in [c["kind"] for c in render_children(pool, network=None)]


def test_the_policy_round_trips_through_the_official_model() -> None:
    pool = gpu_pool(network={"ingressFrom": [{"podSelector": {"matchLabels": {"app": "gw"}}}], "metricsFrom": [{"namespaceSelector": {}}]})
    policy = render_network_policy(pool)
    assert codecs.from_dict(policy).to_dict() == policy
