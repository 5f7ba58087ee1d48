"""The engine argv the operator renders runs through the real `slaq engine` parser and vLLM's own.

`slaq engine`'s flags, then `--`, then vLLM's: a flag after `--` that slaq owns or that would
weaken the pod is refused three times: by the CRD (CEL), by the model (older servers), and by the
launcher after vLLM parsed the whole argv (the final address, scheduler and KV connector).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from slaq.api.crdgen import inference_pool_crd
from slaq.api.pool import ENGINE_OWNED_FLAG_PATTERN, ENGINE_OWNED_FLAGS, InferencePool, ModelSpec
from slaq.cli import build_parser
from slaq.engine import vllm_compat
from slaq.engine.cli import engine_options
from slaq.engine.errors import LaunchError
from slaq.engine.launcher import check_parsed, plan_launch, uses_tiny_model
from slaq.operator.pod import engine_args

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"


def example_pools() -> list[dict[str, Any]]:
    return [d for path in sorted(EXAMPLES.glob("pool-*.yaml")) for d in yaml.safe_load_all(path.read_text())
            if d and d.get("kind") == "InferencePool"]


def pool_with(model: dict[str, Any] | None = None, engine: dict[str, Any] | None = None) -> dict[str, Any]:
    body = yaml.safe_load((EXAMPLES / "pool-cpu.yaml").read_text())
    body["spec"]["model"].update(model or {})
    body["spec"]["engine"].update(engine or {})
    return body


def launch(argv: list[str], tmp_path: Path) -> tuple[Any, Any]:
    """`slaq engine <argv>` as far as the server start: slaq's parser, the launch plan, vLLM's parser."""
    options = engine_options(build_parser().parse_args(["engine", *argv]))
    plan = plan_launch(options, model_path=str(tmp_path) if uses_tiny_model(options) else None)
    return plan, vllm_compat.parse_server_args(plan.argv)


RENDERED = [*[(d["metadata"]["name"], d) for d in example_pools()],
            ("extra-args", pool_with({"extraEngineArgs": ["--enforce-eager", "--seed", "7"]})),
            ("no-prefix-caching", pool_with(engine={"enablePrefixCaching": False}))]


@pytest.mark.parametrize("name,body", RENDERED, ids=[n for n, _ in RENDERED])
def test_every_rendered_engine_argv_parses_and_keeps_what_slaq_sets(name: str, body: dict[str, Any], tmp_path: Path) -> None:
    pool = InferencePool.model_validate(body)
    argv = engine_args(pool)
    plan, parsed = launch(argv, tmp_path)
    check_parsed(plan, parsed)
    assert (parsed.host, parsed.port, parsed.scheduler_cls, parsed.scheduling_policy) == (
        "127.0.0.1", 8001, "slaq.engine.scheduler.SLAScheduler", "priority")
    assert parsed.kv_transfer_config.kv_connector == "SlaqKVConnector"
    assert parsed.max_num_seqs == pool.spec.engine.max_num_seqs
    if name == "extra-args":
        assert (parsed.enforce_eager, parsed.seed) == (True, 7)
    if name == "no-prefix-caching":
        assert parsed.enable_prefix_caching is False


REFUSED = ["--host", "--host=0.0.0.0", "--host=\n0.0.0.0", "--hos", "--port=9", "--uds", "--api-key", "--api_key=x", "--config", "--kv-erase",
           "--kv_transfer_config.kv_connector", "--kv-transfer-config={}", "--scheduler", "--scheduler-cls", "--scheduling-policy=fcfs",
           "--model", "--max-num-seqs=4", "--no-enable-prefix-caching"]


@pytest.mark.parametrize("arg", REFUSED)
def test_an_owned_or_weakening_flag_in_extra_engine_args_is_refused_with_the_field_named(arg: str) -> None:
    with pytest.raises(ValidationError, match=r"model\.extraEngineArgs\[1\]"):
        ModelSpec.model_validate({"name": "m", "extraEngineArgs": ["--enforce-eager", arg]})


@pytest.mark.parametrize("arg", ["--enforce-eager", "--seed", "--max-logprobs=5", "--kv-cache-dtype", "--config-format",
                                 "--enable-chunked-prefill", "--api-server-count", "0.0.0.0"])
def test_ordinary_vllm_flags_pass(arg: str) -> None:
    assert ModelSpec.model_validate({"name": "m", "extraEngineArgs": [arg]}).extra_engine_args == [arg]


def test_every_owned_flag_is_refused_and_the_crd_carries_the_same_rule_on_the_field() -> None:
    for flag in ENGINE_OWNED_FLAGS:
        with pytest.raises(ValidationError, match="extraEngineArgs"):
            ModelSpec.model_validate({"name": "m", "extraEngineArgs": [flag]})
    model = inference_pool_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"]
    [rule] = [r for r in model["x-kubernetes-validations"] if r["fieldPath"] == ".extraEngineArgs"]
    assert ENGINE_OWNED_FLAG_PATTERN in rule["rule"]
    # The API server refuses a rule whose estimated cost passes 10,000,000 (cel-go's estimate for
    # matches: 0.1 per string character times 0.25 per regex character, per item).
    items = model["properties"]["extraEngineArgs"]
    estimate = items["maxItems"] * (items["items"]["maxLength"] * 0.1) * (len(ENGINE_OWNED_FLAG_PATTERN) * 0.25)
    assert estimate < 10_000_000, estimate


@pytest.mark.parametrize("arg", ["--hos", "--host=0.0.0.0", "--kv_transfer_config.kv_connector", "--api-key", "--config"])
def test_the_launcher_refuses_an_owned_flag_after_the_separator(arg: str, tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="after --"):
        launch(["--", arg, "x"], tmp_path)


def test_the_launcher_compares_what_vllm_parsed_with_what_it_set(tmp_path: Path) -> None:
    """A form the flag check does not know (here: bypassed) still cannot move the engine off 127.0.0.1
    nor replace slaq's KV connector: vLLM's parsed values are compared with the plan."""
    plan, _ = launch([], tmp_path)
    for extra, what in ((["--host", "0.0.0.0"], "listens on 0.0.0.0"),
                        (["--kv-transfer-config", '{"kv_connector": "Other", "kv_role": "kv_both"}'], "KV transfer config"),
                        (["--api-key", "k"], "API key"),
                        (["--scheduling-policy", "fcfs"], "--scheduling-policy")):
        parsed = vllm_compat.parse_server_args([*plan.argv, *extra])
        with pytest.raises(LaunchError, match=what):
            check_parsed(plan, parsed)
