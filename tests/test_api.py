"""The API models accept every shipped example and refuse bad manifests, naming the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from slaq.api import InferencePool, RequestSLA, TenantSLA, TenantTable, Tier, duration_seconds, enrich_body, hash_api_key
from slaq.api.table import TenantEntry
from slaq.manifests import Manifest, load_manifests, validate_manifest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "crds" / "examples"


def _examples(kind: str) -> list[dict]:
    return [m.body for m in load_manifests([EXAMPLES]) if m.body.get("kind") == kind]


GPU_POOL = next(p for p in _examples("InferencePool") if p["spec"]["engine"]["device"] == "gpu")
VIP = next(t for t in _examples("TenantSLA") if t["metadata"]["name"] == "vip")


@pytest.mark.parametrize("manifest", list(load_manifests([EXAMPLES])), ids=lambda m: m.label)
def test_every_example_validates(manifest: Manifest) -> None:
    assert validate_manifest(manifest) == []


def test_examples_cover_the_report_scenario() -> None:
    tenants = {t["metadata"]["name"]: TenantSLA.model_validate(t) for t in _examples("TenantSLA")}
    assert tenants["vip"].spec.tier is Tier.CRITICAL and tenants["vip"].spec.objectives.ttft_ms == 50
    assert tenants["standard"].spec.tier is Tier.STANDARD and tenants["standard"].spec.objectives.ttft_ms == 200
    assert tenants["free"].spec.tier is Tier.BATCH and tenants["free"].spec.objectives.ttft_ms is None
    secrets = {s["metadata"]["name"] for s in _examples("Secret")}
    assert {t.spec.api_key_secret_ref.name for t in tenants.values()} <= secrets
    devices = {InferencePool.model_validate(p).spec.engine.device.value for p in _examples("InferencePool")}
    assert devices == {"gpu", "cpu"}


def _set(doc: dict, path: str, value: object) -> dict:
    doc = copy.deepcopy(doc)
    *parents, leaf = path.split(".")
    node = doc
    for part in parents:
        node = node.setdefault(part, {})
    if value is _DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return doc


_DELETE = object()

# (base manifest, field path to break, bad value, the field the error must name, a word the message must hold)
BAD = [
    (VIP, "spec.tier", "gold", "spec.tier", "critical"),
    (VIP, "spec.quotas.requestsPerMinute", -5, "spec.quotas.requestsPerMinute", "greater than or equal"),
    (VIP, "spec.quotas.tokensPerMinute", "many", "spec.quotas.tokensPerMinute", "integer"),
    (VIP, "spec.quotas.maxConcurrency", 0, "spec.quotas.maxConcurrency", "greater than or equal"),
    (VIP, "spec.quotas.kvCacheShare", 0, "spec.quotas.kvCacheShare", "greater than"),
    (VIP, "spec.objectives.ttftMs", _DELETE, "spec", "ttftMs"),
    (VIP, "spec.objectives.ttftMs", "fast", "spec.objectives.ttftMs", "number"),
    (VIP, "spec.objectives.attainmentTarget", 1.5, "spec.objectives.attainmentTarget", "less than or equal"),
    (VIP, "spec.priority", 0, "spec.priority", "Extra inputs"),
    (VIP, "spec.apiKeySecretRef", _DELETE, "spec.apiKeySecretRef", "required"),
    (VIP, "spec.poolSelector.matchExpressions", [{"key": "a", "operator": "Like"}], "spec.poolSelector.matchExpressions.0.operator", "In"),
    (VIP, "metadata.name", "Bad_Name", "metadata.name", "pattern"),
    (VIP, "metadata.namespace", "default", "metadata.namespace", "cluster-scoped"),
    (VIP, "apiVersion", "slaq.dev/v1", "apiVersion", "v1alpha1"),
    (GPU_POOL, "spec.model", _DELETE, "spec.model", "required"),
    (GPU_POOL, "spec.model.name", "", "spec.model.name", "at least 1"),
    (GPU_POOL, "spec.replicas", {"min": 3, "max": 2}, "spec.replicas", "min (3) must be <= max (2)"),
    (GPU_POOL, "spec.drainTimeout", "30 seconds", "spec.drainTimeout", "pattern"),
    (GPU_POOL, "spec.model.gpuMemoryUtilization", 1.5, "spec.model.gpuMemoryUtilization", "less than or equal"),
    (GPU_POOL, "spec.model.tensorParallelSize", 0, "spec.model.tensorParallelSize", "greater than or equal"),
    (GPU_POOL, "spec.model.dtype", "int3", "spec.model.dtype", "bfloat16"),
    (GPU_POOL, "spec.model.tensorParallelSize", 2, "spec", "resources.gpus"),
    (GPU_POOL, "spec.sidecar", {"port": 80}, "spec.sidecar.port", "greater than or equal"),
    (GPU_POOL, "spec.resources.memory", "lots", "spec.resources.memory", "pattern"),
    (GPU_POOL, "spec.autoscaling.targetProtectedLoad", 0, "spec.autoscaling.targetProtectedLoad", "greater than"),
    (GPU_POOL, "spec.engine.device", "tpu", "spec.engine.device", "gpu"),
    (GPU_POOL, "spec.engine.maxNumSeqs", 2.5, "spec.engine.maxNumSeqs", "integer"),
    (GPU_POOL, "spec.gpuType", "h200", "spec.gpuType", "Extra inputs"),
]


@pytest.mark.parametrize(("base", "path", "value", "field", "word"), BAD, ids=[f"{b['kind']}:{p}={v!r}" for b, p, v, _, _ in BAD])
def test_bad_manifest_is_refused_naming_the_field(base: dict, path: str, value: object, field: str, word: str) -> None:
    errors = validate_manifest(Manifest("bad.yaml", 0, _set(base, path, value)))
    assert errors, f"{path}={value!r} was accepted"
    assert any(e.field == field and word in e.message for e in errors), [str(e) for e in errors]


def test_replicas_desired_is_clamped_into_bounds() -> None:
    pool = InferencePool.model_validate(_set(GPU_POOL, "spec.replicas", {"min": 2, "max": 4, "desired": 9}))
    assert pool.spec.replicas.current == 4
    pool = InferencePool.model_validate(_set(GPU_POOL, "spec.replicas", {"min": 2, "max": 4}))
    assert pool.spec.replicas.current == 2


def test_wire_form_round_trips_with_camel_case() -> None:
    pool = InferencePool.model_validate(GPU_POOL)
    wire = pool.to_wire()
    assert wire["spec"]["model"]["gpuMemoryUtilization"] == 0.9
    assert InferencePool.model_validate(wire) == pool


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("2h", 7200.0)])
def test_duration_seconds(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds


def test_key_hash_is_stable_and_reveals_nothing() -> None:
    digest = hash_api_key("sk-demo-vip-0123456789abcdef")
    assert digest == hash_api_key("sk-demo-vip-0123456789abcdef")
    assert digest.startswith("sha256:") and "sk-demo" not in digest and len(digest) == 7 + 64


def test_tenant_table_looks_up_by_key_hash() -> None:
    entry = TenantEntry(name="vip", tier=Tier.CRITICAL, ttft_ms=50, key_hashes=[hash_api_key("k1"), hash_api_key("k2")], cache_salt="x" * 32)
    table = TenantTable(pool="default/tiny-cpu", tenants=[entry])
    assert table.by_key_hash()[hash_api_key("k2")].name == "vip"
    with pytest.raises(ValueError):
        TenantEntry(name="bad", tier=Tier.BATCH, key_hashes=["plain-text-key"], cache_salt="x" * 32)


def test_enrichment_replaces_client_scheduling_fields() -> None:
    body = {"model": "m", "prompt": "hi", "priority": -100, "cache_salt": "steal", "vllm_xargs": {"slaq_tier": "critical"}}
    sla = RequestSLA(tenant="free", tier=Tier.BATCH, arrival=1.0, predicted_output=16)
    out = enrich_body(body, priority=2, cache_salt="s" * 32, sla=sla)
    assert out["priority"] == 2 and out["cache_salt"] == "s" * 32
    assert out["vllm_xargs"]["slaq_tier"] == "batch" and out["vllm_xargs"]["slaq_tenant"] == "free"
    assert body["priority"] == -100  # the client's body is not mutated


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (None, RequestSLA()),
        ({}, RequestSLA()),
        ({"slaq_tier": "platinum"}, RequestSLA()),
        ({"slaq_tier": "critical", "slaq_ttft_ms": 50, "slaq_tpot_ms": None, "slaq_tenant": "vip", "slaq_arrival": 12.5, "slaq_predicted_output": 40},
         RequestSLA(tenant="vip", tier=Tier.CRITICAL, ttft_ms=50.0, arrival=12.5, predicted_output=40)),
        ({"slaq_ttft_ms": -1, "slaq_arrival": float("nan"), "slaq_predicted_output": True}, RequestSLA()),
    ],
)
def test_request_sla_parse_is_lenient(extra: dict | None, expected: RequestSLA) -> None:
    assert RequestSLA.from_extra_args(extra) == expected


def test_request_sla_round_trips_through_xargs() -> None:
    sla = RequestSLA(tenant="vip", tier=Tier.CRITICAL, ttft_ms=50.0, tpot_ms=20.0, arrival=3.0, predicted_output=7)
    assert RequestSLA.from_extra_args(sla.to_xargs()) == sla


def test_example_yaml_is_plain_yaml() -> None:
    for file in EXAMPLES.glob("*.yaml"):
        assert list(yaml.safe_load_all(file.read_text()))
