"""The chart and the operator agree: pool pod labels, the sidecar port, and `slaq operator`'s flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helm.chart import CHART, NAMESPACE, PROMETHEUS_OPERATOR_API, named, of_kind, render

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
EXAMPLE_POOLS = [d for name in ("pool-gpu.yaml", "pool-cpu.yaml") for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def _pod_template(body: dict) -> dict:
    from slaq.api.pool import InferencePool
    from slaq.operator.children import render_deployment

    from tests.support.images import TEST_IMAGES

    return render_deployment(TEST_IMAGES.resolve(InferencePool.model_validate(body)))["spec"]["template"]


@pytest.mark.parametrize("body", EXAMPLE_POOLS, ids=lambda b: b["metadata"]["name"])
def test_pool_pods_carry_the_labels_the_chart_selects_by(body: dict) -> None:
    labels = _pod_template(body)["metadata"]["labels"]
    assert VALUES["pools"]["podLabels"].items() <= labels.items(), "the PodMonitor would miss pool pods"
    assert labels[VALUES["pools"]["nameLabel"]] == body["metadata"]["name"], "the PodMonitor's pool label would be wrong"


@pytest.mark.parametrize("body", EXAMPLE_POOLS, ids=lambda b: b["metadata"]["name"])
def test_the_sidecar_ports_are_the_ones_the_chart_admits_and_scrapes(body: dict) -> None:
    containers = _pod_template(body)["spec"]["containers"]
    ports = [port for container in containers for port in container.get("ports", [])]
    from slaq.api.runtime import SIDECAR_PORT_NAME

    tenant, metrics = SIDECAR_PORT_NAME, VALUES["networkPolicy"]["metricsPortName"]
    assert [p["name"] for p in ports] == [tenant, metrics]  # the engine's port is never named on the pod
    (monitor,) = of_kind(render(api_versions=[PROMETHEUS_OPERATOR_API]), "PodMonitor")
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == [metrics]  # never the tenant port


def test_pool_selector_never_selects_the_operator_pod() -> None:
    operator_labels = named(render(), "Deployment", "slaq-operator")["spec"]["template"]["metadata"]["labels"]
    assert not VALUES["pools"]["podLabels"].items() <= operator_labels.items()


def _operator_args(values: dict | None = None) -> list[str]:
    container = named(render(values), "Deployment", "slaq-operator")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["slaq"]
    return container["args"]


def _parse(args: list[str]):
    from slaq.cli import build_parser

    try:
        return build_parser().parse_args(args)
    except SystemExit as exc:  # argparse's answer to an unknown flag or command
        raise AssertionError(f"`slaq {' '.join(args)}` is refused by the slaq CLI") from exc


def test_slaq_operator_accepts_the_default_arguments() -> None:
    parsed = _parse(_operator_args())
    assert parsed.command == "operator"
    assert parsed.namespace == NAMESPACE, "the cache-salt key must live in the release namespace"
    assert parsed.liveness == "http://0.0.0.0:8080/healthz"
    assert parsed.observe_interval == 15.0 and parsed.verbose is False


def test_slaq_operator_accepts_every_argument_the_values_turn_on() -> None:
    parsed = _parse(_operator_args({"operator": {"verbose": True, "healthPort": 9090, "observeIntervalSeconds": 2.5}}))
    assert parsed.verbose is True and parsed.observe_interval == 2.5
    assert parsed.liveness == "http://0.0.0.0:9090/healthz"


def test_slaq_operator_accepts_the_pools_default_images_the_chart_passes() -> None:
    images = {"gpu": "r/slaq-engine:1", "cpu": "r/slaq-engine:1-cpu", "sidecar": "r/slaq-sidecar:1"}
    parsed = _parse(_operator_args({"pools": {"images": images}}))
    assert (parsed.default_gpu_image, parsed.default_cpu_image, parsed.default_sidecar_image) == tuple(images.values())
    from slaq.operator.cli import default_images
    from slaq.operator.images import PoolImages

    assert default_images(parsed) == PoolImages(**images)
    assert default_images(_parse(_operator_args())) == PoolImages()


def test_probes_call_the_liveness_endpoint_the_operator_serves() -> None:
    container = named(render(), "Deployment", "slaq-operator")["spec"]["template"]["spec"]["containers"][0]
    liveness = _parse(container["args"]).liveness
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == container["livenessProbe"]["httpGet"]["port"])
    assert liveness == f"http://0.0.0.0:{port}{container['livenessProbe']['httpGet']['path']}"
    assert container["readinessProbe"]["httpGet"] == container["livenessProbe"]["httpGet"]


def test_slaq_operator_accepts_the_network_policy_arguments() -> None:
    parsed = _parse(_operator_args({"networkPolicy": {"monitoringNamespaces": ["prometheus", "grafana"]}}))
    assert parsed.network_policies is True and parsed.monitoring_namespaces == "prometheus,grafana"
    assert _parse(_operator_args({"networkPolicy": {"enabled": False}})).network_policies is False
