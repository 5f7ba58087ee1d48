"""`slaq engine`: vLLM's OpenAI server, in this process, with the slaq scheduler.

The launcher turns slaq's flags into vLLM server arguments (`server_argv`, a pure function),
prepares the process environment (scheduler knobs for the engine core process, a Prometheus
multiprocess directory so the engine core's metrics reach the server's /metrics, a small CPU KV
cache), and runs vLLM's server as `python -m vllm.entrypoints.openai.api_server` would.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Mapping, MutableMapping, Sequence

from slaq.api.pool import ENGINE_OWNED_FLAGS, owned_engine_flag
from slaq.api.runtime import ENGINE_HOST, ENGINE_PORT, SCHEDULER_CONFIG_ENV
from slaq.engine.request_log import REQUEST_LOG_ENV
from slaq.engine.errors import LaunchError

SCHEDULER_CLS = "slaq.engine.scheduler.SLAScheduler"
CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
CPU_KV_CACHE_GIB_DEFAULT = "1"
# On CPU vLLM binds its OpenMP threads to every core but those it reserves for the engine's other
# processes: one per worker, and one more per worker when a KV connector is configured (for
# NIXL's transfer threads). slaq's connector runs in the worker's own thread and needs none: with
# the extra reservation a 2-core machine has nothing left to reserve, vLLM binds both cores, and
# the OpenMP threads' busy waiting takes the CPU the scheduler, the API server and the sidecar
# need (measured: the worker at 1.4 cores; stock, without a connector, keeps one core free).
CPU_RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
# A sealed copy that fails its tag is recomputed (kv_load_failure_policy=recompute). On a GPU vLLM
# 0.32 picks Model Runner V2, whose update_requests writes the recompute's smaller
# num_computed_tokens only to its CPU copy (vLLM PR 49252, open), so a GPU engine that swaps runs
# the V1 model runner, the one the tamper test proves on vllm-cpu (engine/README.md, KV security).
MODEL_RUNNER_V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"
TINY_MAX_MODEL_LEN = 1024
KV_HOST_CACHE_GIB_DEFAULT = 1.0
KV_TEST_HOOKS = ("inspectPath", "tamperFlag", "stepDelayS")
# "stock" leaves vLLM's defaults (its own scheduler, FCFS): the baseline slaq is compared against.
# "stock-priority" is vLLM's own scheduler with its static priority policy (the request's
# `priority`, then arrival): with every request at the same priority it orders as FCFS does.
SCHEDULERS: dict[str, tuple[str, ...]] = {
    "slaq": ("--scheduler-cls", SCHEDULER_CLS, "--scheduling-policy", "priority"),
    "stock": (),
    "stock-priority": ("--scheduling-policy", "priority"),
}


@dataclass(frozen=True)
class EngineOptions:
    host: str = ENGINE_HOST
    port: int = ENGINE_PORT
    model: str | None = None  # None: the tiny built-in model
    device: str | None = None  # None: cpu for the tiny model, gpu otherwise
    dtype: str | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    load_format: str | None = None
    served_model_name: str | None = None
    revision: str | None = None
    scheduler_config: str | None = None  # validated wire JSON
    scheduler: str = "slaq"  # "stock": vLLM's own FCFS scheduler, for comparisons
    kv_erase: bool = True  # zero KV blocks before another tenant gets them (False: comparisons, negative controls)
    kv_host_cache_gib: float = KV_HOST_CACHE_GIB_DEFAULT  # host memory for preempted requests' sealed KV; 0: recompute instead
    kv_seal_gb_s: float | None = None  # the swap rule's seal throughput; None: measured when the engine starts
    kv_swap_choice: str = "cost"  # "always": swap every victim that fits, whatever the swap rule says (kv_security/swap.py)
    kv_test_hooks: Mapping[str, object] = field(default_factory=dict)  # inspectPath / tamperFlag / stepDelayS: tests only
    request_log: str = "json"  # the scheduler's audit line per finished request (request_log.py); "off": none
    extra: Sequence[str] = field(default_factory=tuple)  # passed through to vLLM


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    environ: dict[str, str]


def uses_tiny_model(options: EngineOptions) -> bool:
    """No model, or the tiny model's served name (what a CPU InferencePool names, see crds/examples/pool-cpu.yaml)."""
    from slaq.engine.tiny_model import SERVED_NAME

    return options.model in (None, SERVED_NAME)


def plan_launch(options: EngineOptions, model_path: str | None = None, environ: Mapping[str, str] | None = None) -> LaunchPlan:
    """vLLM server arguments and environment for `options` (pure; `model_path` is the tiny model's directory)."""
    environ = dict(os.environ if environ is None else environ)
    tiny = uses_tiny_model(options)
    if tiny and model_path is None:
        raise LaunchError("the tiny built-in model needs its directory (ensure_tiny_model())")
    device = options.device or ("cpu" if tiny else "gpu")
    if device not in ("cpu", "gpu"):
        raise LaunchError(f"--device must be cpu or gpu, not {device!r}")
    if options.scheduler not in SCHEDULERS:
        raise LaunchError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, not {options.scheduler!r}")
    kv_security = kv_transfer_config(options)
    refuse_owned_flags(options.extra, kv_security is not None)
    from slaq.engine.tiny_model import SERVED_NAME

    argv = [
        "--model", model_path if tiny else str(options.model),
        "--host", options.host,
        "--port", str(options.port),
        *SCHEDULERS[options.scheduler],
        "--served-model-name", options.served_model_name or (SERVED_NAME if tiny else str(options.model)),
        "--load-format", options.load_format or ("dummy" if tiny else "auto"),
        "--dtype", options.dtype or ("float32" if tiny else "auto"),
    ]
    if tiny or options.max_model_len is not None:
        argv += ["--max-model-len", str(options.max_model_len or TINY_MAX_MODEL_LEN)]
    optional = {
        "--tensor-parallel-size": options.tensor_parallel_size,
        "--gpu-memory-utilization": options.gpu_memory_utilization,
        "--max-num-seqs": options.max_num_seqs,
        "--max-num-batched-tokens": options.max_num_batched_tokens,
        "--revision": options.revision,
    }
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    if tiny:
        argv += ["--tokenizer", model_path, "--enforce-eager"]
    if kv_security:
        argv += ["--kv-transfer-config", kv_security]
    argv += list(options.extra)
    if options.scheduler_config is not None:
        environ[SCHEDULER_CONFIG_ENV] = options.scheduler_config
    environ[REQUEST_LOG_ENV] = options.request_log
    if device == "cpu":
        environ.setdefault(CPU_KV_CACHE_ENV, CPU_KV_CACHE_GIB_DEFAULT)
        if kv_security:
            environ.setdefault(CPU_RESERVED_ENV, str(options.tensor_parallel_size or 1))
    elif kv_security and options.kv_host_cache_gib > 0:
        environ.setdefault(MODEL_RUNNER_V2_ENV, "0")
    return LaunchPlan(argv=argv, environ=environ)


# What slaq engine sets for vLLM and a flag after `--` may not change (the pool's spec fields, also
# in ENGINE_OWNED_FLAGS, may: `slaq engine -- --max-num-seqs 4` is how one tries a value by hand).
LAUNCHER_OWNED_FLAGS = ("--host", "--port", "--uds", "--api-key", "--config", "--scheduler-cls", "--scheduling-policy",
                        "--kv-transfer-config", "--scheduler", "--kv-erase", "--kv-host-cache-gib", "--kv-test-hooks")


def refuse_owned_flags(extra: Sequence[str], kv_connector: bool) -> None:
    """LaunchError for an argument after `--` that sets (or abbreviates) a flag slaq engine owns;
    --kv-transfer-config is free when slaq's KV connector is off."""
    for arg in extra:
        flag = owned_engine_flag(arg)
        if flag in LAUNCHER_OWNED_FLAGS and (flag != "--kv-transfer-config" or kv_connector):
            raise LaunchError(f"{arg!r} after --: {flag} {ENGINE_OWNED_FLAGS[flag]}; remove it"
                              + (" (or turn slaq's KV connector off: --kv-erase off --kv-host-cache-gib 0)" if flag == "--kv-transfer-config" else ""))


def check_parsed(plan: LaunchPlan, parsed: Any) -> None:
    """LaunchError unless vLLM's parsed arguments keep what slaq engine set: the address, no API
    key, the scheduler, and slaq's KV connector. Run after vLLM parsed the whole argv, so a form
    refuse_owned_flags does not know (a config file, a new alias) cannot slip through."""
    def given(flag: str) -> str | None:
        return plan.argv[plan.argv.index(flag) + 1] if flag in plan.argv else None

    problems = []
    if parsed.host != given("--host") or str(parsed.port) != given("--port") or getattr(parsed, "uds", None):
        problems.append(f"it listens on {parsed.host}:{parsed.port}{' (uds ' + parsed.uds + ')' if getattr(parsed, 'uds', None) else ''}, "
                        f"not {given('--host')}:{given('--port')}")
    if getattr(parsed, "api_key", None):
        problems.append("it would require an API key of the sidecar")
    for flag, dest in (("--scheduler-cls", "scheduler_cls"), ("--scheduling-policy", "scheduling_policy")):
        if given(flag) is not None and str(getattr(parsed, dest, None)) != given(flag):
            problems.append(f"{flag} is {getattr(parsed, dest, None)!r}, not {given(flag)!r}")
    ours, theirs = given("--kv-transfer-config"), getattr(parsed, "kv_transfer_config", None)
    if ours is not None:
        want = json.loads(ours)
        got = {k: getattr(theirs, k, None) for k in want} if theirs is not None else None
        if got != want:
            problems.append(f"its KV transfer config is {got}, not slaq's {want}")
    if problems:
        raise LaunchError("vLLM's parsed arguments differ from what slaq engine set: " + "; ".join(problems)
                          + "; remove the flag (or config file) after -- that changed them")


def kv_transfer_config(options: EngineOptions) -> str | None:
    """slaq's KV connector (erase on tenant change, sealed swap of preempted requests) for the slaq
    scheduler; None when both are off or for the stock baseline."""
    from slaq.engine.kv_security.settings import KVSecuritySettings, transfer_config_json

    if options.kv_host_cache_gib < 0:
        raise LaunchError(f"--kv-host-cache-gib must be 0 or more, not {options.kv_host_cache_gib}")
    unknown = set(options.kv_test_hooks) - set(KV_TEST_HOOKS)
    if unknown:
        raise LaunchError(f"--kv-test-hooks: unknown hook(s) {', '.join(sorted(unknown))}; known: {', '.join(KV_TEST_HOOKS)}")
    host_bytes = int(options.kv_host_cache_gib * 2**30)
    if options.scheduler != "slaq" or (not options.kv_erase and host_bytes == 0):
        return None
    hooks = options.kv_test_hooks
    try:
        settings = KVSecuritySettings(erase=options.kv_erase, host_cache_bytes=host_bytes, seal_gb_s=options.kv_seal_gb_s,
                                      swap_choice=options.kv_swap_choice,
                                      inspect_path=hooks.get("inspectPath"), tamper_flag=hooks.get("tamperFlag"),  # type: ignore[arg-type]
                                      step_delay_s=float(hooks.get("stepDelayS", 0.0)))  # type: ignore[arg-type]
    except ValueError as exc:
        flag = "--kv-seal-gb-s" if "hostSealGbS" in str(exc) else "--kv-test-hooks" if "stepDelayS" in str(exc) else "--kv-swap-choice"
        raise LaunchError(f"{flag}: {exc}") from exc
    return transfer_config_json(settings)


def prepare_environment(plan: LaunchPlan, target: MutableMapping[str, str] | None = None) -> None:
    """Apply the plan's environment, and a fresh Prometheus multiprocess directory.

    Must run before vLLM (and prometheus_client) is imported: the client picks its value store
    at import, and the engine core process inherits this environment."""
    target = os.environ if target is None else target
    target.update(plan.environ)
    if "PROMETHEUS_MULTIPROC_DIR" not in target:
        target["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="slaq-engine-metrics-")


def run(options: EngineOptions) -> None:
    from slaq.engine.tiny_model import ensure_tiny_model

    model_path = str(ensure_tiny_model()) if uses_tiny_model(options) else None
    plan = plan_launch(options, model_path)
    prepare_environment(plan)
    from slaq.engine import vllm_compat

    parsed = vllm_compat.parse_server_args(plan.argv)
    check_parsed(plan, parsed)
    vllm_compat.run_server(parsed)
