"""helm lint, the default render, and every optional part present when enabled and absent when not."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helm.chart import (
    CHART,
    EVERYTHING_ON,
    NAMESPACE,
    OPERATOR_REPOSITORY,
    PROMETHEUS_OPERATOR_API,
    REQUIRED_SET,
    kinds,
    named,
    notes,
    of_kind,
    render,
    render_failure,
    run_helm,
    with_required,
)

OPERATOR = "slaq-operator"
POOL_POD_LABELS = {"app.kubernetes.io/component": "inference", "app.kubernetes.io/managed-by": "slaq-operator"}


def test_helm_lint_strict_passes() -> None:
    result = run_helm("lint", "--strict", str(CHART), *REQUIRED_SET)
    assert "0 chart(s) failed" in result.stdout


def test_helm_lint_strict_passes_with_every_option_on(tmp_path) -> None:
    values = tmp_path / "values.json"
    values.write_text(json.dumps(with_required(EVERYTHING_ON)), encoding="utf-8")
    result = run_helm("lint", "--strict", str(CHART), "--values", str(values))
    assert "0 chart(s) failed" in result.stdout


def test_renders_by_default_the_operator_its_rbac_and_the_crds() -> None:
    objects = render()
    assert kinds(objects) == {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment",
                              "Role", "RoleBinding", "NetworkPolicy"}  # Secret reads in the release namespace; pool pods fenced
    assert {c["metadata"]["name"] for c in of_kind(objects, "CustomResourceDefinition")} == {"inferencepools.slaq.dev", "tenantslas.slaq.dev"}
    named(objects, "Deployment", OPERATOR)
    named(objects, "ServiceAccount", OPERATOR)
    assert [r["metadata"]["name"] for r in of_kind(objects, "ClusterRole")] == [OPERATOR]
    for obj in objects:
        if obj["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "slaq"


def test_operator_pod_is_hardened_and_probed() -> None:
    deployment = named(render(), "Deployment", OPERATOR)
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == f"{OPERATOR_REPOSITORY}:0.1.0"  # the chart's appVersion, the documented build's tag
    assert container["command"] == ["slaq"] and container["args"][0] == "operator"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert container["livenessProbe"]["httpGet"]["port"] == "health"
    assert container["readinessProbe"]["httpGet"]["port"] == "health"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"health": 8080}
    # A read-only root needs somewhere writable for Python's temporary files.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert pod["serviceAccountName"] == OPERATOR


def test_image_tag_and_digest_values() -> None:
    container = named(render({"image": {"tag": "0.2.0"}}), "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{OPERATOR_REPOSITORY}:0.2.0"
    digest = "sha256:" + "a" * 64
    container = named(render({"image": {"digest": digest}}), "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{OPERATOR_REPOSITORY}@{digest}"


@pytest.mark.parametrize("image", [None, {"repository": ""}, {"tag": "0.2.0"}])
def test_without_an_operator_image_the_chart_refuses_to_render_saying_what_to_set(image: dict | None) -> None:
    given = ["--set-json", f"image={json.dumps(image)}"] if image else []
    for command in (["template", "slaq", str(CHART)], ["install", "slaq", str(CHART), "--dry-run=client"]):
        refused = run_helm(*command, *given, check=False)
        assert refused.returncode != 0, f"helm {command[0]} rendered without an operator image"
        assert "image.repository is required" in refused.stderr
        assert "docker build -f operator/Dockerfile -t REGISTRY/slaq-operator:0.1.0 ." in refused.stderr
    # helm lint lets a `required` value pass on purpose (a chart is linted without site values); it warns.
    linted = run_helm("lint", "--strict", str(CHART), *given)
    assert "image.repository is required" in linted.stderr + linted.stdout
    # The same through the tests' own helper, whose default image a test's values override.
    assert "--set image.repository=REGISTRY/slaq-operator" in render_failure({"image": {**(image or {}), "repository": ""}})


def test_pool_images_reach_the_operator_only_when_set() -> None:
    def args(values: dict | None = None) -> list[str]:
        return named(render(values), "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]["args"]

    assert not [a for a in args() if a.startswith("--default-")]
    images = {"gpu": "registry.test/slaq-engine:0.1.0", "cpu": "registry.test/slaq-engine:0.1.0-cpu",
              "sidecar": "registry.test/slaq-sidecar:0.1.0"}
    assert [a for a in args({"pools": {"images": images}}) if a.startswith("--default-")] == [
        f"--default-{kind}-image={image}" for kind, image in images.items()]
    assert [a for a in args({"pools": {"images": {"cpu": images["cpu"]}}}) if a.startswith("--default-")] == [
        f"--default-cpu-image={images['cpu']}"]


def test_crds_absent_when_disabled() -> None:
    objects = render({"crds": {"enabled": False}})
    assert not of_kind(objects, "CustomResourceDefinition")
    assert "crds.enabled=false" in notes({"crds": {"enabled": False}})


def test_crds_kept_on_uninstall_by_default_and_not_when_keep_is_off() -> None:
    for crd in of_kind(render(), "CustomResourceDefinition"):
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    for crd in of_kind(render({"crds": {"keep": False}}), "CustomResourceDefinition"):
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_service_account_and_rbac_absent_when_disabled() -> None:
    objects = render({"serviceAccount": {"create": False, "name": "existing"}, "rbac": {"create": False}})
    assert not {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "RoleBinding"} & kinds(objects)
    assert named(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


def test_existing_service_account_needs_a_name() -> None:
    from tests.helm.chart import render_failure

    assert "serviceAccount.name is required" in render_failure({"serviceAccount": {"create": False}})


def test_secret_reads_are_confined_to_roles_by_default() -> None:
    objects = render()
    assert [(r["metadata"]["namespace"], r["metadata"]["name"], r["rules"]) for r in of_kind(objects, "Role")] == [
        (NAMESPACE, f"{OPERATOR}-secrets", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}]),
        (NAMESPACE, f"{OPERATOR}-tables", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "patch", "delete"]}])]
    (cluster_role,) = of_kind(objects, "ClusterRole")
    assert not {"get", "list", "watch"} & {v for r in cluster_role["rules"] if "secrets" in r["resources"] for v in r["verbs"]}
    args = named(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith(("--key-secret-namespaces", "--open-namespaces"))]
    assert "It may read API-key Secrets only in: slaq-system;" in notes({})
    assert "It may write Secrets (pools' tenant tables) only in: slaq-system;" in notes({})
    assert "It may write Secrets (pools' tenant tables) only in: inference, slaq-system;" in notes({"rbac": {"poolNamespaces": ["inference"]}})


def test_secret_namespaces_confine_secret_reads_to_roles() -> None:
    objects = render({"rbac": {"secretNamespaces": ["tenants", NAMESPACE]}})
    roles = [r for r in of_kind(objects, "Role") if r["metadata"]["name"] == f"{OPERATOR}-secrets"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(["tenants", NAMESPACE])  # no duplicate
    for role in roles:
        # read-only: the operator reads and watches tenants' key Secrets, never writes them
        assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}]
    bindings = [b for b in of_kind(objects, "RoleBinding") if b["metadata"]["name"] == f"{OPERATOR}-secrets"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(["tenants", NAMESPACE])
    assert all(b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{OPERATOR}-secrets"} for b in bindings)
    (cluster_role,) = of_kind(objects, "ClusterRole")
    secret_verbs = {v for r in cluster_role["rules"] if "secrets" in r["resources"] for v in r["verbs"]}
    assert "get" not in secret_verbs
    assert "It may read API-key Secrets only in: tenants, slaq-system;" in notes({"rbac": {"secretNamespaces": ["tenants"]}})
    args = named(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--key-secret-namespaces=tenants,slaq-system" in args  # the operator refuses key Secrets elsewhere
    opened = named(render({"binding": {"openNamespaces": ["shared-pools"]}}), "Deployment", OPERATOR)
    assert "--open-namespaces=shared-pools" in opened["spec"]["template"]["spec"]["containers"][0]["args"]


def test_operator_args() -> None:
    args = named(render(), "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "operator"
    extra = named(render({"operator": {"extraArgs": ["--x=1"]}}), "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert extra[-1] == "--x=1"


def test_network_policy_rendered_by_default_and_absent_when_disabled() -> None:
    (policy,) = of_kind(render(), "NetworkPolicy")
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert "NetworkPolicy" not in kinds(render({"networkPolicy": {"enabled": False}}))


def test_the_charts_policy_fences_the_operator_pod_to_its_health_port() -> None:
    objects = render()
    (policy,) = of_kind(objects, "NetworkPolicy")
    operator_pod = named(objects, "Deployment", OPERATOR)["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= operator_pod["metadata"]["labels"].items()
    assert not POOL_POD_LABELS.items() <= policy["spec"]["podSelector"]["matchLabels"].items()  # pools: the operator's policies
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (port,) = rule["ports"]
    assert port == {"protocol": "TCP", "port": "health"}
    assert [p["name"] for p in operator_pod["spec"]["containers"][0]["ports"]] == ["health"]


def test_pool_policies_are_the_operators_fed_the_monitoring_namespaces() -> None:
    args = named(render(), "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--monitoring-namespaces=monitoring" in args and "--no-network-policies" not in args
    values = {"networkPolicy": {"monitoringNamespaces": ["prometheus", "grafana"]}}
    args = named(render(values), "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--monitoring-namespaces=prometheus,grafana" in args
    args = named(render({"networkPolicy": {"monitoringNamespaces": []}}), "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--monitoring-namespaces=" in args  # none: the operator's own namespace only, not the operator's default
    off = named(render({"networkPolicy": {"enabled": False}}), "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-network-policies" in off and not [a for a in off if a.startswith("--monitoring-namespaces")]


def test_pod_monitor_needs_the_prometheus_operator_api() -> None:
    assert "PodMonitor" not in kinds(render())
    assert "PodMonitor" not in kinds(render({"monitoring": {"podMonitor": {"enabled": False}}}, api_versions=[PROMETHEUS_OPERATOR_API]))
    (monitor,) = of_kind(render(api_versions=[PROMETHEUS_OPERATOR_API]), "PodMonitor")
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"any": True}
    assert spec["selector"]["matchLabels"] == POOL_POD_LABELS
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert endpoint["relabelings"] == [{"sourceLabels": ["__meta_kubernetes_pod_label_slaq_dev_pool"], "targetLabel": "pool"}]


def test_pod_monitor_follows_the_pod_contract() -> None:
    from slaq.api.runtime import METRICS_PATH, METRICS_PORT_NAME

    (monitor,) = of_kind(render(api_versions=[PROMETHEUS_OPERATOR_API]), "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == METRICS_PORT_NAME
    assert monitor["spec"]["podMetricsEndpoints"][0]["path"] == METRICS_PATH


DASHBOARD_TOPICS = ("TTFT", "attainment", "Queue depth", "Rejections", "SLA risk", "Replicas")


def test_grafana_dashboard_absent_by_default_and_complete_when_enabled() -> None:
    assert "ConfigMap" not in kinds(render())
    (config_map,) = of_kind(render({"monitoring": {"grafanaDashboard": {"enabled": True}}}), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["slaq.json"])
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    for topic in DASHBOARD_TOPICS:
        assert topic.lower() in titles.lower(), f"no panel about {topic}: {titles}"
    for panel in dashboard["panels"]:
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
    assert any("by (tier" in t["expr"] for p in dashboard["panels"] if "TTFT" in p["title"] for t in p["targets"])


def test_prometheus_adapter_rules_expose_protected_load_as_a_pods_metric() -> None:
    assert "ConfigMap" not in kinds(render())
    (config_map,) = of_kind(render({"autoscaling": {"prometheusAdapter": {"enabled": True, "namespace": "monitoring"}}}), "ConfigMap")
    assert config_map["metadata"]["namespace"] == "monitoring"
    rules = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    # slaq_sla_risk too, for pools that still set the deprecated targetSlaRisk (a second HPA metric).
    assert [rule["name"]["as"] for rule in rules] == ["slaq_protected_load", "slaq_sla_risk"]
    for rule in rules:
        assert rule["seriesQuery"].startswith(rule["name"]["as"] + "{")
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]


def test_keda_scaled_objects_one_per_pool_on_the_scale_subresource() -> None:
    assert "ScaledObject" not in kinds(render())
    pools = [
        {"name": "llama", "namespace": "team-a", "minReplicas": 1, "maxReplicas": 4, "targetProtectedLoad": 0.8},
        {"name": "mistral", "namespace": "team-b", "minReplicas": 2, "maxReplicas": 8, "targetProtectedLoad": 0.5},
    ]
    assert "ScaledObject" not in kinds(render({"autoscaling": {"keda": {"enabled": False, "pools": pools}}}))
    scaled = of_kind(render({"autoscaling": {"keda": {"enabled": True, "pools": pools}}}), "ScaledObject")
    assert [(s["metadata"]["namespace"], s["spec"]["scaleTargetRef"]["name"]) for s in scaled] == [("team-a", "llama"), ("team-b", "mistral")]
    first = scaled[0]["spec"]
    assert first["scaleTargetRef"] == {"apiVersion": "slaq.dev/v1alpha1", "kind": "InferencePool", "name": "llama"}
    assert (first["minReplicaCount"], first["maxReplicaCount"]) == (1, 4)
    assert first["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert "cooldownPeriod" not in first  # scale-to-zero only; pools never go to zero
    (trigger,) = first["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "0.8"
    assert trigger["metadata"]["query"] == 'sum(max by (pod) (slaq_protected_load{namespace="team-a",pool="llama"}))'
    assert trigger["metadata"]["ignoreNullValues"] == "false"  # no series: the HPA holds, not a scale-down to min
    # A pool that still names the deprecated targetSlaRisk gets a second trigger on the risk.
    (old,) = of_kind(render({"autoscaling": {"keda": {"enabled": True, "pools": [{**pools[0], "targetSlaRisk": 0.8}]}}}), "ScaledObject")
    assert [(t["metadata"]["query"], t["metadata"]["threshold"]) for t in old["spec"]["triggers"]] == [
        ('sum(max by (pod) (slaq_protected_load{namespace="team-a",pool="llama"}))', "0.8"),
        ('sum(max by (pod) (slaq_sla_risk{namespace="team-a",pool="llama"}))', "0.8")]
    assert all(t["metadata"]["ignoreNullValues"] == "false" for t in old["spec"]["triggers"])


def test_keda_scales_with_the_behaviour_of_the_operators_hpa() -> None:
    """Whichever autoscaler a pool uses, it scales as `slaq bench cluster` measured: the chart's
    ScaledObject carries the operator's HPA behaviour (its policies and scale-down window), not the
    HPA defaults (every replica removed at once after the window, max(4 pods, 100 %) added per 15 s)."""
    from slaq.operator.children import render_hpa
    from tests.operator.test_render import example

    gpu_pool = example("pool-gpu.yaml")
    for window in (300, 120):
        gpu_pool.spec.autoscaling.scale_down_stabilization_seconds = window
        hpa = render_hpa(gpu_pool)
        pool = {"name": "llama", "namespace": "team-a", "minReplicas": 1, "maxReplicas": 4, "targetProtectedLoad": 0.8}
        (scaled,) = of_kind(render({"autoscaling": {"keda": {"enabled": True, "scaleDownStabilizationSeconds": window, "pools": [pool]}}}),
                            "ScaledObject")
        assert scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["spec"]["behavior"]


def test_keda_refuses_min_above_max() -> None:
    from tests.helm.chart import render_failure

    pool = {"name": "llama", "namespace": "team-a", "minReplicas": 5, "maxReplicas": 4, "targetProtectedLoad": 0.8}
    assert "minReplicas (5) above maxReplicas (4)" in render_failure({"autoscaling": {"keda": {"enabled": True, "pools": [pool]}}})


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (None, ["kubectl -n slaq-system rollout status deployment/slaq-operator", "kind: TenantSLA", "/metrics", "No PodMonitor was rendered"]),
        ({"autoscaling": {"prometheusAdapter": {"enabled": True}}}, ["rules.existing=slaq-adapter-rules"]),
        ({"monitoring": {"grafanaDashboard": {"enabled": True}}}, ["ConfigMap slaq-system/slaq-dashboard"]),
        (None, ["A gpu pool must name spec.engine.image", "pools.images.gpu is not set", "pools.images.cpu is not set"]),
        ({"pools": {"images": {"gpu": "r/slaq-engine:1", "cpu": "r/slaq-engine:1-cpu"}}},
         ["Pools that name no spec.engine.image run r/slaq-engine:1 (gpu) and r/slaq-engine:1-cpu (cpu)."]),
    ],
)
def test_notes_tell_the_next_step(values, expected) -> None:
    # `helm install --dry-run=client` takes no --api-versions, so the PodMonitor branch of the notes
    # is not reached here; the PodMonitor itself is tested above.
    text = notes(values)
    for line in expected:
        assert line in text
    if values and "pools" in values:
        assert "must name spec.engine.image" not in text


def test_notes_tenant_example_is_a_valid_tenant_sla() -> None:
    from slaq.api.tenant import TenantSLASpec

    text = notes()
    block = text.split("kubectl apply -f tenant.yaml`:\n\n", 1)[1].split("\n\n", 1)[0]
    manifest = yaml.safe_load(block)
    assert manifest["kind"] == "TenantSLA" and manifest["apiVersion"] == "slaq.dev/v1alpha1"
    spec = TenantSLASpec.model_validate(manifest["spec"])
    assert spec.api_key_secret_ref.namespace == NAMESPACE


def test_chart_refuses_clusters_older_than_what_its_objects_use() -> None:
    # The CRDs carry x-kubernetes-validations (CEL, served from 1.25 on), and the operator's pods
    # stop through a preStop sleep action (pod.py), on by default from 1.30 on.
    from slaq.operator.pod import render_pod_template
    from tests.operator.test_render import example

    pod = render_pod_template(example("pool-gpu.yaml"))
    assert all("sleep" in c["lifecycle"]["preStop"] for c in pod["spec"]["containers"])
    for old in ("1.24.0", "1.29.9"):
        refused = run_helm("template", "slaq", str(CHART), "--kube-version", old, *REQUIRED_SET, check=False)
        assert refused.returncode != 0 and "requires kubeVersion" in refused.stderr
    assert run_helm("template", "slaq", str(CHART), "--kube-version", "1.30.0", *REQUIRED_SET).stdout.count("kind: CustomResourceDefinition") == 2


def test_keda_refuses_a_pool_listed_twice() -> None:
    from tests.helm.chart import render_failure

    pool = {"name": "llama", "namespace": "team-a", "minReplicas": 1, "maxReplicas": 4, "targetProtectedLoad": 0.8}
    error = render_failure({"autoscaling": {"keda": {"enabled": True, "pools": [pool, {**pool, "targetProtectedLoad": 0.5}]}}})
    assert "team-a/llama is listed twice" in error
    other = {**pool, "namespace": "team-b"}  # the same name in another namespace is another pool
    assert len(of_kind(render({"autoscaling": {"keda": {"enabled": True, "pools": [pool, other]}}}), "ScaledObject")) == 2
