"""Pure render functions: the children of crds/examples/ pools, checked without an API server."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slaq.api.pool import InferencePool
from slaq.api.runtime import (ENGINE_HOST, ENGINE_PORT, ENGINE_TABLE_DIR, ENGINE_TABLE_ENV, ENGINE_TABLE_KEY, SCHEDULER_CONFIG_ENV,
                              TENANT_TABLE_DIR, TENANT_TABLE_KEY, MAX_TABLE_PARTS)
from slaq.api.common import KvErase, Tier
from slaq.api.table import EngineTable, TenantEntry, TenantTable, hash_api_key, salt_fingerprint
from slaq.operator.children import milli_quantity, owned_by, render_deployment, render_hpa, render_pdb, render_service, render_table_secret
from slaq.operator.names import pool_selector_labels
from slaq.operator.pod import engine_args, render_pod_template, sidecar_args
from tests.support.images import TEST_IMAGES

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"


def example(name: str) -> InferencePool:
    """An example pool with its images resolved as the tests' operator would (they name none)."""
    return TEST_IMAGES.resolve(InferencePool.model_validate(yaml.safe_load((EXAMPLES / name).read_text())))


@pytest.fixture()
def gpu_pool() -> InferencePool:
    return example("pool-gpu.yaml")


def containers(pool: InferencePool) -> dict[str, dict]:
    return {c["name"]: c for c in render_pod_template(pool)["spec"]["containers"]}


def test_gpu_pod_spec_is_production_grade(gpu_pool: InferencePool) -> None:
    pod = render_pod_template(gpu_pool)["spec"]
    sidecar, engine = containers(gpu_pool)["sidecar"], containers(gpu_pool)["engine"]
    # Non-root, no privilege escalation, read-only root filesystems, no API token in the pod.
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for c in (sidecar, engine):
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"] and sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False
    # Only the sidecar's ports are exposed (tenant and metrics); the engine binds to 127.0.0.1.
    assert sidecar["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"},
                                {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert "ports" not in engine
    args = engine["args"]
    assert args[:5] == ["engine", "--host", ENGINE_HOST, "--port", str(ENGINE_PORT)] and ENGINE_HOST == "127.0.0.1"
    # GPU limits (and requests), placement from the spec.
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1" and engine["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert engine["resources"]["limits"]["memory"] == "64Gi" and "cpu" not in engine["resources"]["limits"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # Probes sized for model load: the engine gets 30 minutes to start before it counts as failed.
    startup = engine["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert "127.0.0.1:8001/health" in " ".join(startup["exec"]["command"])
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/ready" and sidecar["livenessProbe"]["httpGet"]["path"] == "/health"
    # Shared memory for NCCL / tensor parallelism.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
    # preStop drain: the sidecar stops taking traffic after endpoints update; the engine outlives the drain.
    assert sidecar["lifecycle"]["preStop"]["sleep"]["seconds"] == 5
    assert engine["lifecycle"]["preStop"]["sleep"]["seconds"] == 5 + 60
    assert pod["terminationGracePeriodSeconds"] >= 5 + 60 + 5
    # The tenant table Secret is mounted read-only as a directory (a subPath mount would never update).
    assert {"name": "tenant-table", "mountPath": TENANT_TABLE_DIR, "readOnly": True} in sidecar["volumeMounts"]
    # It projects every part of a table split over several Secrets: part 0 always, the others optional.
    sources = [src["secret"] for src in volumes["tenant-table"]["projected"]["sources"]]
    assert len(sources) == MAX_TABLE_PARTS and volumes["tenant-table"]["projected"]["defaultMode"] == 0o440
    assert sources[0] == {"name": "llama3-8b-tenants", "items": [{"key": TENANT_TABLE_KEY, "path": TENANT_TABLE_KEY}]}
    assert sources[1] == {"name": "llama3-8b-tenants-1", "items": [{"key": TENANT_TABLE_KEY, "path": "tenants-1.json"}], "optional": True}
    assert all(src["optional"] for src in sources[1:]) and len({src["name"] for src in sources}) == MAX_TABLE_PARTS
    # The engine mounts only the same Secrets' engine key (KV shares, erase modes: no key hashes,
    # no salts), at the path its env names; never the sidecar's table.
    engine_sources = [src["secret"] for src in volumes["engine-table"]["projected"]["sources"]]
    assert engine_sources[0] == {"name": "llama3-8b-tenants", "items": [{"key": ENGINE_TABLE_KEY, "path": ENGINE_TABLE_KEY}]}
    assert {item["key"] for src in engine_sources for item in src["items"]} == {ENGINE_TABLE_KEY}
    assert {"name": "engine-table", "mountPath": ENGINE_TABLE_DIR, "readOnly": True} in engine["volumeMounts"]
    assert "tenant-table" not in {m["name"] for m in engine["volumeMounts"]}
    assert "engine-table" not in {m["name"] for m in sidecar["volumeMounts"]}
    assert {e["name"]: e.get("value") for e in engine["env"]}[ENGINE_TABLE_ENV] == f"{ENGINE_TABLE_DIR}/{ENGINE_TABLE_KEY}"
    # The scheduler knobs travel to the engine as wire JSON.
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert json.loads(env[SCHEDULER_CONFIG_ENV])["agingBoundSeconds"] == 60
    # ...and to the sidecar, the very same JSON: both containers host one policy with one config.
    sidecar_command = sidecar.get("args", []) + sidecar.get("command", [])
    assert sidecar_command[sidecar_command.index("--scheduler-config") + 1] == env[SCHEDULER_CONFIG_ENV]


def test_the_engine_probe_imports_the_standard_library_whatever_its_working_directory_holds(gpu_pool: InferencePool, tmp_path: Path) -> None:
    """The image's working directory is the repository (/opt/slaq): a folder there named like a
    standard module must not be what the probe imports."""
    command = render_pod_template(gpu_pool)["spec"]["containers"][1]["startupProbe"]["exec"]["command"]
    assert command[0] == "python3"
    (tmp_path / "http").mkdir()  # urllib.request imports http.client
    (tmp_path / "http" / "__init__.py").write_text("raise SystemExit('SHADOWED')")
    shadowed = subprocess.run([sys.executable, *[a for a in command[1:] if a != "-I"]], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "SHADOWED" in shadowed.stderr  # the negative control: without isolation the folder wins
    probed = subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "SHADOWED" not in probed.stderr and ("URLError" in probed.stderr or probed.returncode == 0), probed.stderr


def test_sidecar_and_engine_flags_follow_the_contract(gpu_pool: InferencePool) -> None:
    assert sidecar_args(gpu_pool) == [
        "--port", "8000", "--metrics-port", "9090", "--engine-url", "http://127.0.0.1:8001", "--tenant-table", f"{TENANT_TABLE_DIR}/{TENANT_TABLE_KEY}",
        "--max-queue-depth", "1024", "--drain-timeout", "60",
        "--scheduler-config", json.dumps(gpu_pool.spec.scheduler.to_wire(), sort_keys=True),
        "--request-limits", json.dumps(gpu_pool.spec.sidecar.request_limits.to_wire(), sort_keys=True),
        "--max-num-seqs", "256", "--max-num-batched-tokens", "8192", "--tokenizer", "meta-llama/Meta-Llama-3-8B-Instruct",
        "--max-model-len", "8192", "--served-model-name", "llama3-8b",
    ]
    assert engine_args(gpu_pool) == [
        "--host", "127.0.0.1", "--port", "8001", "--model", "meta-llama/Meta-Llama-3-8B-Instruct", "--device", "gpu",
        "--dtype", "bfloat16", "--max-model-len", "8192", "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9",
        "--max-num-seqs", "256", "--max-num-batched-tokens", "8192", "--load-format", "auto", "--served-model-name", "llama3-8b",
    ]
    cpu = example("pool-cpu.yaml")
    assert "--served-model-name" not in engine_args(cpu) and engine_args(cpu)[engine_args(cpu).index("--device") + 1] == "cpu"
    assert sidecar_args(cpu)[-2:] == ["--served-model-name", "slaq-tiny"]
    engine = containers(cpu)["engine"]
    assert "nvidia.com/gpu" not in engine["resources"]["limits"]


def test_the_sidecar_counts_with_the_engines_tokenizer_from_the_shared_model_cache(gpu_pool: InferencePool) -> None:
    pool = gpu_pool.model_copy(deep=True)
    pool.spec.model.revision = "abc123"
    args = sidecar_args(pool)
    assert args[args.index("--tokenizer") + 1] == "meta-llama/Meta-Llama-3-8B-Instruct" and args[args.index("--tokenizer-revision") + 1] == "abc123"
    # A tokenizer the engine is told to use (vLLM's own --tokenizer, either spelling) wins, with its own revision.
    pool.spec.model.extra_engine_args = ["--enforce-eager", "--tokenizer=org/tok", "--tokenizer-revision", "t1"]
    args = sidecar_args(pool)
    assert args[args.index("--tokenizer") + 1] == "org/tok" and args[args.index("--tokenizer-revision") + 1] == "t1"
    pool.spec.model.extra_engine_args = ["--tokenizer", "org/tok"]
    assert "--tokenizer-revision" not in sidecar_args(pool)  # the model's revision is not the tokenizer's
    sidecar, engine = containers(pool)["sidecar"], containers(pool)["engine"]
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["HF_HOME"] == {e["name"]: e.get("value") for e in engine["env"]}["HF_HOME"]
    cache = next(m for m in engine["volumeMounts"] if m["name"] == "cache")
    assert cache in sidecar["volumeMounts"] and sidecar["envFrom"] == engine["envFrom"]  # gated models: the same hub token


def test_optional_flags_then_the_separator_and_vllm_flags_go_last(gpu_pool: InferencePool) -> None:
    pool = gpu_pool.model_copy(deep=True)
    pool.spec.model.revision = "abc123"
    pool.spec.model.extra_engine_args = ["--enforce-eager"]
    pool.spec.engine.enable_prefix_caching = False
    pool.spec.sidecar.trust_gateway_headers = True
    assert engine_args(pool)[-5:] == ["--revision", "abc123", "--", "--enforce-eager", "--no-enable-prefix-caching"]
    assert "--trust-gateway-headers" in sidecar_args(pool)
    assert "--trusted-proxies" not in sidecar_args(pool)  # by default no proxy's X-Forwarded-For is believed


def test_the_pools_trusted_proxies_reach_the_sidecar_as_it_parses_them(gpu_pool: InferencePool) -> None:
    from slaq.sidecar.addresses import TrustedProxies

    pool = gpu_pool.model_copy(deep=True)
    pool.spec.sidecar.trusted_proxies = ["10.0.0.0/16", "2001:db8::1"]
    args = sidecar_args(pool)
    proxies = TrustedProxies.parse(args[args.index("--trusted-proxies") + 1])
    assert proxies.client("10.0.4.2", [(b"x-forwarded-for", b"203.0.113.9")]) == "203.0.113.9"
    assert proxies.client("2001:db8::1", [(b"x-forwarded-for", b"203.0.113.9")]) == "203.0.113.9"


def test_a_trusted_proxy_that_is_no_network_is_refused_by_name() -> None:
    import pydantic

    from slaq.api.pool import SidecarSpec

    with pytest.raises(pydantic.ValidationError, match=r"trustedProxies\[1\]"):
        SidecarSpec.model_validate({"trustedProxies": ["10.0.0.0/8", "10.0.0.300"]})


def test_the_pools_request_limits_reach_the_sidecar_as_it_parses_them(gpu_pool: InferencePool) -> None:
    from slaq.sidecar.server import parse_request_limits

    pool = gpu_pool.model_copy(deep=True)
    pool.spec.sidecar.request_limits.max_n = 2
    pool.spec.sidecar.request_limits.allow_beam_search = True
    args = sidecar_args(pool)
    assert parse_request_limits(args[args.index("--request-limits") + 1]) == pool.spec.sidecar.request_limits


def test_deployment_service_pdb_select_the_same_pods(gpu_pool: InferencePool) -> None:
    selector = pool_selector_labels("llama3-8b")
    deployment, service, pdb = render_deployment(gpu_pool), render_service(gpu_pool), render_pdb(gpu_pool)
    assert deployment["spec"]["selector"]["matchLabels"] == selector == service["spec"]["selector"] == pdb["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    # The metrics port is not on the Service: tenants reach the tenant port only.
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"}]
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9090"
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}


def test_replicas_are_clamped_into_bounds(gpu_pool: InferencePool) -> None:
    pool = gpu_pool.model_copy(deep=True)
    pool.spec.replicas.desired = 9
    assert render_deployment(pool)["spec"]["replicas"] == 4
    pool.spec.replicas.desired = 0
    assert render_deployment(pool)["spec"]["replicas"] == 1


def test_hpa_targets_the_pool_on_protected_load(gpu_pool: InferencePool) -> None:
    hpa = render_hpa(gpu_pool)
    assert hpa is not None and hpa["apiVersion"] == "autoscaling/v2"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "slaq.dev/v1alpha1", "kind": "InferencePool", "name": "llama3-8b"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 4)
    assert spec["metrics"] == [{"type": "Pods", "pods": {"metric": {"name": "slaq_protected_load"},
                                                        "target": {"type": "AverageValue", "averageValue": "500m"}}}]
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert render_hpa(example("pool-cpu.yaml")) is None
    # A pool that still sets the deprecated targetSlaRisk keeps it as a second metric (the HPA takes the larger proposal).
    old = gpu_pool.model_copy(deep=True)
    old.spec.autoscaling = type(old.spec.autoscaling).model_validate({"enabled": True, "targetSlaRisk": 0.8})
    assert [m["pods"]["metric"]["name"] for m in render_hpa(old)["spec"]["metrics"]] == ["slaq_protected_load", "slaq_sla_risk"]
    assert render_hpa(old)["spec"]["metrics"][1]["pods"]["target"] == {"type": "AverageValue", "averageValue": "800m"}
    assert milli_quantity(1.25) == "1250m"


def test_table_secret_holds_the_table_and_the_engines_cut_of_it(gpu_pool: InferencePool) -> None:
    salts = {"vip": "a" * 64, "free": "b" * 64}
    table = TenantTable(pool="inference/llama3-8b", revision="r1", tenants=[
        TenantEntry(name="vip", tier=Tier.CRITICAL, key_hashes=[hash_api_key("sk-vip")], cache_salt=salts["vip"], kv_cache_share=0.5),
        TenantEntry(name="free", tier=Tier.BATCH, key_hashes=[hash_api_key("sk-free")], cache_salt=salts["free"], kv_erase=KvErase.ON_FREE)])
    secret = render_table_secret(gpu_pool, table)
    assert secret["metadata"]["name"] == "llama3-8b-tenants" and secret["metadata"]["namespace"] == "inference"
    assert TenantTable.model_validate_json(base64.b64decode(secret["data"][TENANT_TABLE_KEY])) == table
    engine_text = base64.b64decode(secret["data"][ENGINE_TABLE_KEY]).decode()
    engine = EngineTable.model_validate_json(engine_text)
    assert [(t.name, t.kv_cache_share, t.kv_erase, t.salt_fingerprint) for t in engine.tenants] == [
        ("vip", 0.5, KvErase.ON_REUSE, salt_fingerprint(salts["vip"])), ("free", 1.0, KvErase.ON_FREE, salt_fingerprint(salts["free"]))]
    assert engine.revision == "r1" and engine.pool == table.pool
    # Least knowledge: no key hash, no salt, no quota or objective reaches the engine's file
    # (negative control: the sidecar's file has them).
    for secret_part in (hash_api_key("sk-vip"), hash_api_key("sk-free"), *salts.values(), "keyHashes", "cacheSalt", "share", "tier"):
        assert secret_part not in engine_text
        assert secret_part in base64.b64decode(secret["data"][TENANT_TABLE_KEY]).decode()


def test_owner_reference_marks_the_pool_as_controller(gpu_pool: InferencePool) -> None:
    owner = {"apiVersion": "slaq.dev/v1alpha1", "kind": "InferencePool", "metadata": {"name": "llama3-8b", "uid": "u-1"}}
    child = owned_by(render_service(gpu_pool), owner)
    assert child["metadata"]["ownerReferences"] == [{"apiVersion": "slaq.dev/v1alpha1", "kind": "InferencePool", "name": "llama3-8b",
                                                     "uid": "u-1", "controller": True, "blockOwnerDeletion": True}]


def test_a_metrics_port_equal_to_the_tenant_port_is_refused_naming_the_field(gpu_pool: InferencePool) -> None:
    from pydantic import ValidationError

    body = gpu_pool.to_wire()
    body["spec"]["sidecar"] = {"port": 9000, "metricsPort": 9000}
    with pytest.raises(ValidationError, match="sidecar.metricsPort"):
        InferencePool.model_validate(body)
