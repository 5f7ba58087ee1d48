"""The pool pod: the sidecar (tenant and metrics ports) in front of the engine bound to 127.0.0.1.

`sidecar_args` and `engine_args` are the whole command-line contract with `slaq sidecar` and
`slaq engine`; everything else here is how the pod is run safely on a GPU node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slaq.api.common import duration_seconds
from slaq.api.pool import Device, InferencePool
from slaq.api.runtime import (
    ENGINE_HOST,
    ENGINE_PORT,
    ENGINE_TABLE_DIR,
    ENGINE_TABLE_ENV,
    ENGINE_TABLE_KEY,
    HEALTH_PATH,
    MAX_TABLE_PARTS,
    METRICS_PATH,
    METRICS_PORT_NAME,
    QUOTA_STORE_PASSWORD_ENV,
    READY_PATH,
    SCHEDULER_CONFIG_ENV,
    SIDECAR_PORT_NAME,
    TENANT_TABLE_DIR,
    TENANT_TABLE_KEY,
)
from slaq.api.table import part_file_name
from slaq.operator.names import pool_labels, table_secret_name

RUN_AS_USER = 10001
CACHE_DIR = "/var/cache/slaq"  # HOME and model/compile caches: the root filesystem is read-only
PRESTOP_SECONDS = 5  # lets endpoint removal reach every proxy before the sidecar stops accepting
GRACE_SLACK_SECONDS = 10
# Model download and load: up to 30 minutes before the engine counts as failed to start.
ENGINE_STARTUP_PERIOD_SECONDS = 10
ENGINE_STARTUP_FAILURES = 180


@dataclass(frozen=True)
class QuotaStoreRef:
    """The install's shared quota store (the chart's quotaStore.redis): sidecars count tenants' whole
    quotas there (`slaq sidecar --quota-store`). The password Secret is read from each pool's namespace."""

    url: str
    password_secret: str | None = None
    password_key: str = "password"


def engine_url() -> str:
    return f"http://{ENGINE_HOST}:{ENGINE_PORT}"


def served_model_name(pool: InferencePool) -> str:
    return pool.spec.model.served_model_name or pool.spec.model.name


def drain_seconds(pool: InferencePool) -> int:
    return max(1, round(duration_seconds(pool.spec.drain_timeout)))


def _number(value: float) -> str:
    return format(value, "g")


def _vllm_flag(args: list[str], flag: str) -> str | None:
    """The value of `flag` among vLLM arguments (`--flag value` or `--flag=value`), the last one winning."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def tokenizer_args(pool: InferencePool) -> list[str]:
    """The sidecar counts prompt tokens with the tokenizer the engine uses: the model's own, or the one
    named by a `--tokenizer` among the extra engine arguments (and its revision)."""
    model = pool.spec.model
    tokenizer = _vllm_flag(model.extra_engine_args, "--tokenizer")
    revision = _vllm_flag(model.extra_engine_args, "--tokenizer-revision") if tokenizer else model.revision
    return ["--tokenizer", tokenizer or model.name, *(["--tokenizer-revision", revision] if revision else [])]


def model_cache_env() -> list[dict[str, Any]]:
    """Both containers download into and read from the pod's one model cache (the `cache` volume)."""
    return [
        {"name": "HOME", "value": CACHE_DIR},
        {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
    ]


def hub_credentials(pool: InferencePool) -> list[dict[str, Any]]:
    """Optional per-pool Secret for model-hub credentials (e.g. HF_TOKEN for gated models)."""
    return [{"secretRef": {"name": f"{pool.metadata.name}-engine-env", "optional": True}}]


def sidecar_args(pool: InferencePool, store: QuotaStoreRef | None = None) -> list[str]:
    """Arguments of `slaq sidecar` (after the subcommand)."""
    spec = pool.spec
    args = [
        "--port", str(spec.sidecar.port),
        "--metrics-port", str(spec.sidecar.metrics_port),
        "--engine-url", engine_url(),
        "--tenant-table", f"{TENANT_TABLE_DIR}/{TENANT_TABLE_KEY}",
        "--max-queue-depth", str(spec.sidecar.max_queue_depth),
        "--drain-timeout", str(drain_seconds(pool)),
        # The same scheduler spec the engine reads from its environment: both containers host one policy.
        "--scheduler-config", json.dumps(spec.scheduler.to_wire(), sort_keys=True),
        # The tenant boundary's bounds: what one request may ask of the engine.
        "--request-limits", json.dumps(spec.sidecar.request_limits.to_wire(), sort_keys=True),
        # The engine's shape, for the queue discipline's load and first-token lead (as the engine sees them).
        "--max-num-seqs", str(spec.engine.max_num_seqs),
        "--max-num-batched-tokens", str(spec.engine.max_num_batched_tokens),
        # Prompt tokens counted as the engine counts them (the tokenizer comes from the model cache or the hub).
        *tokenizer_args(pool),
    ]
    if spec.model.max_model_len is not None:
        args += ["--max-model-len", str(spec.model.max_model_len)]
    if spec.sidecar.trust_gateway_headers:
        args.append("--trust-gateway-headers")
    if spec.sidecar.trusted_proxies:
        args += ["--trusted-proxies", ",".join(spec.sidecar.trusted_proxies)]
    if store is not None:
        args += ["--quota-store", store.url]
    return [*args, "--served-model-name", served_model_name(pool)]


def engine_args(pool: InferencePool) -> list[str]:
    """Arguments of `slaq engine` (after the subcommand): slaq's flags, then `--` and the vLLM flags
    (extra engine args as given; ModelSpec refuses the ones slaq owns)."""
    model, engine = pool.spec.model, pool.spec.engine
    args = [
        "--host", ENGINE_HOST,
        "--port", str(ENGINE_PORT),
        "--model", model.name,
        "--device", engine.device.value,
        "--dtype", model.dtype.value,
    ]
    if model.max_model_len is not None:
        args += ["--max-model-len", str(model.max_model_len)]
    args += [
        "--tensor-parallel-size", str(model.tensor_parallel_size),
        "--gpu-memory-utilization", _number(model.gpu_memory_utilization),
        "--max-num-seqs", str(engine.max_num_seqs),
        "--max-num-batched-tokens", str(engine.max_num_batched_tokens),
        "--load-format", model.load_format.value,
    ]
    if model.served_model_name:
        args += ["--served-model-name", model.served_model_name]
    if model.revision:
        args += ["--revision", model.revision]
    vllm = list(model.extra_engine_args)
    if not engine.enable_prefix_caching:
        vllm.append("--no-enable-prefix-caching")  # a vLLM engine argument: it goes after `--` with the extra ones
    return [*args, "--", *vllm] if vllm else args


def _container_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _engine_health_probe(period: int, failures: int, timeout: int) -> dict[str, Any]:
    # The engine listens on 127.0.0.1 only, which kubelet's httpGet (pod IP) cannot reach.
    check = f"import urllib.request; urllib.request.urlopen('{engine_url()}{HEALTH_PATH}', timeout={timeout - 1})"
    # -I: isolated, so neither the working directory nor PYTHON* variables shape what it imports.
    return {"exec": {"command": ["python3", "-I", "-c", check]}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": timeout}


def container_images(pool: InferencePool) -> tuple[str, str]:
    """(engine image, sidecar image): the sidecar runs the engine's image unless the pool names its own.
    The pool's images must be named or resolved first (images.PoolImages.resolve)."""
    engine = pool.spec.engine.image
    if engine is None:
        raise ValueError(f"InferencePool {pool.metadata.name}: spec.engine.image is unset; resolve the pool's images "
                         "with the operator's defaults first (slaq.operator.images.PoolImages.resolve)")
    return engine, pool.spec.sidecar.image or engine


def _slaq_container(pool: InferencePool, subcommand: str, args: list[str], image: str) -> dict[str, Any]:
    """A container running `slaq <subcommand> <args>` from `image`, named after the subcommand."""
    return {
        "name": subcommand,
        "image": image,
        "imagePullPolicy": pool.spec.engine.image_pull_policy,
        "command": ["slaq"],
        "args": [subcommand, *args],
    }


def render_sidecar_container(pool: InferencePool, store: QuotaStoreRef | None = None) -> dict[str, Any]:
    spec = pool.spec
    password = [] if store is None or store.password_secret is None else [
        {"name": QUOTA_STORE_PASSWORD_ENV, "valueFrom": {"secretKeyRef": {"name": store.password_secret, "key": store.password_key}}}]
    return {
        **_slaq_container(pool, "sidecar", sidecar_args(pool, store), container_images(pool)[1]),
        "ports": [{"name": SIDECAR_PORT_NAME, "containerPort": spec.sidecar.port, "protocol": "TCP"},
                  {"name": METRICS_PORT_NAME, "containerPort": spec.sidecar.metrics_port, "protocol": "TCP"}],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            *model_cache_env(),
            *password,
        ],
        "envFrom": hub_credentials(pool),  # a gated model's tokenizer needs the hub token too
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        # Readiness follows the engine (model loaded) and the tenant table; liveness only the process.
        "readinessProbe": {"httpGet": {"path": READY_PATH, "port": SIDECAR_PORT_NAME}, "periodSeconds": 5,
                           "timeoutSeconds": 3, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": HEALTH_PATH, "port": SIDECAR_PORT_NAME}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 3},
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "tenant-table", "mountPath": TENANT_TABLE_DIR, "readOnly": True},
            {"name": "cache", "mountPath": CACHE_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def render_engine_container(pool: InferencePool) -> dict[str, Any]:
    spec = pool.spec
    limits: dict[str, str] = {"memory": spec.resources.memory}
    requests: dict[str, str] = {"cpu": spec.resources.cpu, "memory": spec.resources.memory}
    if spec.engine.device is Device.GPU:
        limits["nvidia.com/gpu"] = str(spec.resources.gpus)
        requests["nvidia.com/gpu"] = str(spec.resources.gpus)
    return {
        **_slaq_container(pool, "engine", engine_args(pool), container_images(pool)[0]),
        "env": [
            {"name": SCHEDULER_CONFIG_ENV, "value": json.dumps(spec.scheduler.to_wire(), sort_keys=True)},
            {"name": ENGINE_TABLE_ENV, "value": f"{ENGINE_TABLE_DIR}/{ENGINE_TABLE_KEY}"},
            *model_cache_env(),
            {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        ],
        "envFrom": hub_credentials(pool),
        # CPU is requested, not limited: throttling a busy engine costs tail latency.
        "resources": {"requests": requests, "limits": limits},
        "startupProbe": _engine_health_probe(ENGINE_STARTUP_PERIOD_SECONDS, ENGINE_STARTUP_FAILURES, 5),
        "livenessProbe": _engine_health_probe(15, 4, 10),
        # The engine outlives the sidecar's drain, so in-flight requests finish.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS + drain_seconds(pool)}}},
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "cache", "mountPath": CACHE_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
            # The scheduler reads tenants' KV shares and erase modes from its table (and follows its
            # updates); the engine never sees key hashes or cache salts.
            {"name": "engine-table", "mountPath": ENGINE_TABLE_DIR, "readOnly": True},
        ],
    }


def _table_volume(volume: str, pool_name: str, key: str) -> dict[str, Any]:
    """One key of every part of the pool's table Secret(s), as `key`, `key-1`...: part 0 always
    exists, the others only for a table split over several Secrets (optional sources).
    The kubelet updates a projected volume in place, all files at once (only subPath mounts go stale)."""
    sources = [{"secret": {"name": table_secret_name(pool_name, part), "items": [{"key": key, "path": part_file_name(key, part)}],
                           **({"optional": True} if part else {})}} for part in range(MAX_TABLE_PARTS)]
    return {"name": volume, "projected": {"defaultMode": 0o440, "sources": sources}}


def render_pod_template(pool: InferencePool, store: QuotaStoreRef | None = None) -> dict[str, Any]:
    spec, name = pool.spec, pool.metadata.name
    placement = spec.placement
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # pool pods never talk to the API server
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": PRESTOP_SECONDS + drain_seconds(pool) + GRACE_SLACK_SECONDS,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                            "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [render_sidecar_container(pool, store), render_engine_container(pool)],
        "volumes": [
            # Two projections of the one table Secret: each container gets only its own key.
            _table_volume("tenant-table", name, TENANT_TABLE_KEY),
            _table_volume("engine-table", name, ENGINE_TABLE_KEY),
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shared_memory}},
            {"name": "cache", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
        ],
        "topologySpreadConstraints": [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {k: v for k, v in pool_labels(name).items() if k != "app.kubernetes.io/managed-by"}},
        }],
    }
    if placement.node_selector:
        pod_spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in placement.tolerations]
    if placement.affinity:
        pod_spec["affinity"] = dict(placement.affinity)
    if placement.priority_class_name:
        pod_spec["priorityClassName"] = placement.priority_class_name
    return {
        "metadata": {
            "labels": pool_labels(name),
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(spec.sidecar.metrics_port),
                            "prometheus.io/path": METRICS_PATH},
        },
        "spec": pod_spec,
    }
