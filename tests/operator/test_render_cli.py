"""`slaq render`: the objects the operator would apply, from manifest files (no cluster)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import codecs

from slaq.api.pool import InferencePool
from slaq.api.runtime import TENANT_TABLE_KEY
from slaq.api.table import TenantTable, hash_api_key
from slaq.cli import main
from slaq.operator.gateway import GIE_API_VERSION, render_gateway_inference_pool
from slaq.operator.names import SALT_SECRET_KEY, SALT_SECRET_NAME
from tests.operator.test_operator_kmock import EXAMPLES, operator, seed
from slaq.testing.kube import KubeEmulator
from tests.support.polling import eventually

KUBECTL = shutil.which("kubectl")
DEMO_KEYS = {"vip": "sk-demo-vip-0123456789abcdef", "standard": "sk-demo-standard-0123456789abcdef",
             "free": "sk-demo-free-0123456789abcdef"}


def render(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["render", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def objects(stream: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(stream) if d]


def table_of(secret: dict[str, Any]) -> TenantTable:
    return TenantTable.model_validate_json(base64.b64decode(secret["data"][TENANT_TABLE_KEY]))


@pytest.fixture()
def salt_key_file(tmp_path: Path) -> Path:
    path = tmp_path / "salt.key"
    path.write_bytes(os.urandom(32))
    return path


def test_the_cpu_example_renders_the_pools_objects_with_key_hashes_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", EXAMPLES)
    assert code == 0, err
    rendered = objects(out)
    assert [(o["kind"], o["metadata"]["name"]) for o in rendered] == [
        ("Secret", "tiny-cpu-tenants"), ("NetworkPolicy", "tiny-cpu"), ("Service", "tiny-cpu"), ("PodDisruptionBudget", "tiny-cpu"),
        ("Deployment", "tiny-cpu")]
    table = table_of(rendered[0])
    assert {t.name: t.key_hashes for t in table.tenants} == {n: [hash_api_key(k, table.hash_key())] for n, k in DEMO_KEYS.items()}
    assert not any(key in out for key in DEMO_KEYS.values())
    # The examples hold two pools binding every tenant: each pool's table carries half of a quota.
    assert {t.name: t.share.requests_per_minute for t in table.tenants} == {"vip": 300, "standard": 600, "free": 60}
    # Without --salt-key-file the salts are random, and the output says so where a reviewer looks.
    assert "random key" in err and out.startswith("---\n# slaq render: cache salts come from a random key")


def test_a_pool_behind_a_gateway_renders_the_gateway_api_inference_pool_the_operator_applies(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    body = yaml.safe_load((EXAMPLES / "pool-cpu.yaml").read_text())
    body["spec"]["gateway"] = {"inferencePool": True}
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(yaml.safe_dump(body))
    code, out, err = render(capsys, pool_file, "--tenants", EXAMPLES)
    assert code == 0, err
    rendered = objects(out)
    assert [(o["apiVersion"], o["kind"]) for o in rendered][-2:] == [("apps/v1", "Deployment"), (GIE_API_VERSION, "InferencePool")]
    assert rendered[-1] == render_gateway_inference_pool(InferencePool.model_validate(body))
    code, out, _ = render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", EXAMPLES)
    assert code == 0 and GIE_API_VERSION not in out  # the gateway off (the example): no such object


def test_every_object_round_trips_through_the_official_models(capsys: pytest.CaptureFixture[str], salt_key_file: Path) -> None:
    code, out, err = render(capsys, EXAMPLES / "pool-gpu.yaml", EXAMPLES / "pool-cpu.yaml", "--tenants", EXAMPLES,
                            "--salt-key-file", salt_key_file)
    assert code == 0, err
    rendered = objects(out)
    assert {o["kind"] for o in rendered} == {"Secret", "NetworkPolicy", "Service", "PodDisruptionBudget", "Deployment",
                                             "HorizontalPodAutoscaler"}
    for obj in rendered:
        model = codecs.from_dict(obj)  # lightkube-models: the resource class for apiVersion + kind
        assert type(model).__name__ == obj["kind"]
        # lightkube drops keys its models do not know: a misspelt or misplaced field shows up as a difference.
        assert model.to_dict() == obj, obj["kind"]


def test_the_round_trip_catches_a_misplaced_field(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", EXAMPLES)
    deployment = next(o for o in objects(out) if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    assert codecs.from_dict(deployment).to_dict() != deployment


def test_a_given_salt_key_makes_the_output_reproducible(capsys: pytest.CaptureFixture[str], salt_key_file: Path) -> None:
    runs = [render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", EXAMPLES, "--salt-key-file", salt_key_file) for _ in range(2)]
    assert runs[0][0] == 0 and runs[0][1] == runs[1][1]
    assert "random key" not in runs[0][1] + runs[0][2]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (scripts/setup.sh installs it)")
async def test_the_output_passes_kubectl_apply_dry_run(kube: KubeEmulator, capsys: pytest.CaptureFixture[str],
                                                       salt_key_file: Path) -> None:
    # kubectl's client-side dry run still asks an API server which resource each kind is (discovery),
    # so it runs against the emulator; --validate=false because the emulator serves no OpenAPI schema
    # (the official models above check the fields).
    code, out, err = render(capsys, EXAMPLES / "pool-gpu.yaml", "--tenants", EXAMPLES, "--salt-key-file", salt_key_file)
    assert code == 0, err
    process = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", str(kube.kubeconfig), "apply", "--dry-run=client", "--validate=false", "-f", "-",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(kube.kubeconfig.parent)})
    stdout, stderr = await asyncio.wait_for(process.communicate(out.encode()), timeout=60)
    assert process.returncode == 0, stderr.decode()
    assert stdout.decode().splitlines() == [
        "secret/llama3-8b-tenants created (dry run)", "networkpolicy.networking.k8s.io/llama3-8b created (dry run)",
        "service/llama3-8b created (dry run)",
        "poddisruptionbudget.policy/llama3-8b created (dry run)", "deployment.apps/llama3-8b created (dry run)",
        "horizontalpodautoscaler.autoscaling/llama3-8b created (dry run)"]


SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "ownerReferences", "managedFields")


def as_applied(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k not in SERVER_FIELDS}
    return {k: v for k, v in {**obj, "metadata": meta}.items() if k != "status"}


async def test_render_matches_what_the_operator_applies(kube: KubeEmulator, capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    tenants = tmp_path / "tenants"
    tenants.mkdir()
    for name in ("tenants.yaml", "tenant-keys.yaml"):
        shutil.copy(EXAMPLES / name, tenants / name)
    async with operator(kube):
        await seed(kube)  # pool-gpu.yaml and the example tenants, in the emulated cluster
        salt = await eventually(lambda: kube.read("v1/secrets", "slaq-system", SALT_SECRET_NAME), what="cache-salt key")
        key_file = tmp_path / "salt.key"
        key_file.write_bytes(base64.b64decode(salt["data"][SALT_SECRET_KEY]))
        code, out, err = render(capsys, EXAMPLES / "pool-gpu.yaml", "--tenants", tenants, "--salt-key-file", key_file)
        assert code == 0, err
        rendered = objects(out)
        plural = {"Secret": "v1/secrets", "NetworkPolicy": "networking.k8s.io/v1/networkpolicies", "Service": "v1/services", "PodDisruptionBudget": "policy/v1/poddisruptionbudgets",
                  "Deployment": "apps/v1/deployments", "HorizontalPodAutoscaler": "autoscaling/v2/horizontalpodautoscalers"}

        def applied(obj: dict[str, Any]) -> dict[str, Any] | None:
            live = kube.read(plural[obj["kind"]], "inference", obj["metadata"]["name"])
            return live and as_applied(live)

        for obj in rendered:
            await eventually(lambda: applied(obj) == obj, what=f"the operator's {obj['kind']} equal to the rendered one")
    assert len(rendered) == 6


def test_a_missing_key_secret_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "tenants.yaml", tmp_path / "tenants.yaml")
    code, out, err = render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", tmp_path)
    assert code == 1 and out == ""
    assert "TenantSLA free" in err and "tenants.yaml[2]" in err and "Secret slaq-system/tenant-free-keys (spec.apiKeySecretRef) not found" in err
    assert "--allow-missing-keys" in err


def test_allow_missing_keys_renders_the_tenant_without_hashes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "tenants.yaml", tmp_path / "tenants.yaml")
    code, out, err = render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", tmp_path, "--allow-missing-keys")
    assert code == 0, err
    table = table_of(objects(out)[0])
    assert [(t.name, t.key_hashes) for t in table.tenants] == [("free", []), ("standard", []), ("vip", [])]
    assert err.count("rendered without key hashes") == 3


def test_a_bad_pool_field_is_named_with_its_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pool = yaml.safe_load((EXAMPLES / "pool-cpu.yaml").read_text())
    pool["spec"]["replicas"]["max"] = 0
    bad = tmp_path / "pool.yaml"
    bad.write_text(yaml.safe_dump(pool))
    code, out, err = render(capsys, bad, "--tenants", EXAMPLES)
    assert code == 1 and out == ""
    assert f"{bad}[0] InferencePool/tiny-cpu: not a valid InferencePool: spec.replicas" in err


def test_inputs_without_the_needed_kinds_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = render(capsys, EXAMPLES / "tenants.yaml", "--tenants", EXAMPLES)
    assert code == 1 and "no InferencePool documents in" in err
    code, _, err = render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", EXAMPLES / "pool-gpu.yaml")
    assert code == 1 and "no TenantSLA documents in" in err
    short = tmp_path / "short.key"
    short.write_bytes(b"0123")
    code, _, err = render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", EXAMPLES, "--salt-key-file", short)
    assert code == 1 and f"--salt-key-file {short}: holds 4 bytes" in err
    code, _, err = render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", tmp_path / "nowhere")
    assert code == 1 and "nowhere does not exist" in err


def test_a_pool_without_a_namespace_takes_the_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path, salt_key_file: Path) -> None:
    pool = yaml.safe_load((EXAMPLES / "pool-cpu.yaml").read_text())
    del pool["metadata"]["namespace"]
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    code, out, err = render(capsys, tmp_path / "pool.yaml", "--tenants", EXAMPLES, "-n", "team-a", "--salt-key-file", salt_key_file)
    assert code == 0, err
    rendered = objects(out)
    assert {o["metadata"]["namespace"] for o in rendered} == {"team-a"}
    assert table_of(rendered[0]).pool == "team-a/tiny-cpu"
    assert json.loads(base64.b64decode(rendered[0]["data"][TENANT_TABLE_KEY]))["pool"] == "team-a/tiny-cpu"
