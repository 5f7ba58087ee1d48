"""`slaq render`: the objects the operator would apply, from manifest files (no cluster)."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import codecs

from slaq.api.pool import InferencePool
from slaq.api.runtime import TENANT_TABLE_KEY
from slaq.api.table import TenantTable, derive_key_hash_key, hash_api_key, key_fingerprint
from slaq.cli import main
from slaq.manifests import read_manifest_set
from slaq.operator.offline import REVIEW_KEY, key_secret_refs, render_from_manifests, review_secret
from slaq.operator.render_cli import render_yaml
from slaq.operator.gateway import GIE_API_VERSION, render_gateway_inference_pool
from slaq.operator.names import SALT_SECRET_KEY, SALT_SECRET_NAME
from tests.operator.test_operator_kmock import EXAMPLES, operator, seed
from slaq.testing.kube import KubeEmulator
from tests.support.images import CPU_IMAGE, IMAGE_FLAGS, TEST_IMAGES
from tests.support.polling import eventually

KUBECTL = shutil.which("kubectl")
DEMO_KEYS = {"vip": "sk-demo-vip-0123456789abcdef", "standard": "sk-demo-standard-0123456789abcdef",
             "free": "sk-demo-free-0123456789abcdef"}


def render(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["render", *map(str, args), *IMAGE_FLAGS])
    out, err = capsys.readouterr()
    return code, out, err


def objects(stream: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(stream) if d]


def table_of(secret: dict[str, Any]) -> TenantTable:
    """The table the operator writes (the Secret's data)."""
    return TenantTable.model_validate_json(base64.b64decode(secret["data"][TENANT_TABLE_KEY]))


def review_of(secret: dict[str, Any]) -> dict[str, Any]:
    """The table as `slaq render` prints it for review."""
    assert "data" not in secret
    return yaml.safe_load(secret["stringData"][REVIEW_KEY])


@pytest.fixture()
def salt_key_file(tmp_path: Path) -> Path:
    path = tmp_path / "salt.key"
    path.write_bytes(os.urandom(32))
    return path


def test_the_cpu_example_renders_the_pools_objects_with_the_table_for_review(capsys: pytest.CaptureFixture[str],
                                                                             salt_key_file: Path) -> None:
    code, out, err = render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", EXAMPLES, "--salt-key-file", salt_key_file)
    assert code == 0, err
    rendered = objects(out)
    assert [(o["kind"], o["metadata"]["name"]) for o in rendered] == [
        ("Secret", "tiny-cpu-tenants"), ("NetworkPolicy", "tiny-cpu"), ("Service", "tiny-cpu"), ("PodDisruptionBudget", "tiny-cpu"),
        ("Deployment", "tiny-cpu")]
    review = {t["name"]: t for t in review_of(rendered[0])["tenants"]}
    hash_key = derive_key_hash_key(salt_key_file.read_bytes())
    assert {n: t["keyFingerprints"] for n, t in review.items()} == {
        n: [key_fingerprint(hash_api_key(k, hash_key))] for n, k in DEMO_KEYS.items()}
    assert {n: t["keySecret"] for n, t in review.items()} == {n: f"slaq-system/tenant-{n}-keys" for n in DEMO_KEYS}
    assert not any(key in out for key in DEMO_KEYS.values())
    # The examples hold two pools binding every tenant: each pool's table carries half of a quota.
    assert {n: t["share"]["requestsPerMinute"] for n, t in review.items()} == {"vip": 300, "standard": 600, "free": 60}
    assert out.startswith("---\n# slaq render: the tenant table for review")


def test_without_a_salt_key_file_the_output_says_its_fingerprints_are_random(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", EXAMPLES)
    assert code == 0, err
    # Without --salt-key-file the salts are random, and the output says so where a reviewer looks.
    assert "random key" in err and "\n# slaq render: cache salts come from a random key" in out.split("apiVersion", 1)[0]


def _exposed(stream: str) -> str:
    """The stream and every base64 string in it decoded: what a reader of the committed YAML holds."""
    decoded = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str):
            try:
                decoded.append(base64.b64decode(value, validate=True).decode("utf-8", "replace"))
            except ValueError:
                pass

    walk(objects(stream))
    return "\n".join([stream, *decoded])


def _forms(secret: bytes) -> set[str]:
    return {secret.hex(), base64.b64encode(secret).decode(), base64.urlsafe_b64encode(secret).decode().rstrip("=")}


def test_the_output_holds_no_key_hash_key_salt_or_key_hash(capsys: pytest.CaptureFixture[str], salt_key_file: Path) -> None:
    salt_key = salt_key_file.read_bytes()
    pools = [EXAMPLES / "pool-gpu.yaml", EXAMPLES / "pool-cpu.yaml"]
    code, out, err = render(capsys, *pools, "--tenants", EXAMPLES, "--salt-key-file", salt_key_file)
    assert code == 0, err
    # What the operator writes into the cluster for the same inputs: the secrets to look for.
    found = read_manifest_set([EXAMPLES])
    applied = render_from_manifests(read_manifest_set(pools).pools, found, salt_key, images=TEST_IMAGES).objects
    tables = [table_of(o) for o in applied if o["kind"] == "Secret"]
    assert len(tables) == 2
    secrets_ = {"the cache-salt key": salt_key, "the key-hash key": derive_key_hash_key(salt_key)}
    for table in tables:
        assert table.key_hash_key == derive_key_hash_key(salt_key).hex()
        for entry in table.tenants:
            secrets_[f"{table.pool} {entry.name}'s cache salt"] = bytes.fromhex(entry.cache_salt)
            for key_hash in entry.key_hashes:
                secrets_[f"{table.pool} {entry.name}'s key hash"] = bytes.fromhex(key_hash.split(":", 1)[1])
    assert len(secrets_) == 2 + 2 * 3 * 2

    leaked = [what for what, secret in secrets_.items() if any(form in _exposed(out) for form in _forms(secret))]
    assert not leaked, f"slaq render printed {leaked}"
    # The negative control: the objects the operator applies, printed as before, hold every one of
    # them but the cache-salt key itself (the rest derive from it).
    old = render_yaml(applied)
    assert [what for what, secret in secrets_.items() if any(form in _exposed(old) for form in _forms(secret))] == list(secrets_)[1:]


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

        refs = key_secret_refs(read_manifest_set([tenants]))

        def applied(obj: dict[str, Any]) -> dict[str, Any] | None:
            live = kube.read(plural[obj["kind"]], "inference", obj["metadata"]["name"])
            if live is None:
                return None
            # The table as the operator wrote it, reviewed as `slaq render` reviews its own.
            return review_secret(as_applied(live), refs) if obj["kind"] == "Secret" else as_applied(live)

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
    review = review_of(objects(out)[0])
    assert [(t["name"], t["keyFingerprints"]) for t in review["tenants"]] == [("free", []), ("standard", []), ("vip", [])]
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
    assert review_of(rendered[0])["pool"] == "team-a/tiny-cpu"


def test_a_pool_naming_no_image_needs_the_default_for_its_device(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["render", str(EXAMPLES / "pool-cpu.yaml"), "--tenants", str(EXAMPLES), "--default-gpu-image", "r/e:gpu"])
    _, err = capsys.readouterr()
    assert code == 1 and "spec.engine.image" in err and "--default-cpu-image" in err
    code, out, _ = render(capsys, EXAMPLES / "pool-cpu.yaml", "--tenants", EXAMPLES)
    (deployment,) = [o for o in objects(out) if o["kind"] == "Deployment"]
    assert {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]} == {CPU_IMAGE}
