"""`slaq engine --scheduler stock`: vLLM's own scheduler and FCFS policy, the demo's baseline."""

from __future__ import annotations

import pytest

from slaq.cli import build_parser
from slaq.engine.errors import LaunchError
from slaq.engine.launcher import SCHEDULER_CLS, EngineOptions, plan_launch


def test_stock_leaves_vllms_scheduler_and_fcfs_policy() -> None:
    from slaq.engine import vllm_compat

    argv = plan_launch(EngineOptions(scheduler="stock"), model_path="/cache/tiny", environ={}).argv
    assert "--scheduler-cls" not in argv and "--scheduling-policy" not in argv
    args = vllm_compat.parse_server_args(argv)
    assert args.scheduling_policy == "fcfs"
    assert args.scheduler_cls in (None, "") or "slaq" not in str(args.scheduler_cls)


def test_slaq_is_the_default_and_sets_the_sla_scheduler() -> None:
    from slaq.engine import vllm_compat

    argv = plan_launch(EngineOptions(), model_path="/cache/tiny", environ={}).argv
    args = vllm_compat.parse_server_args(argv)
    assert args.scheduler_cls == SCHEDULER_CLS and args.scheduling_policy == "priority"


def test_an_unknown_scheduler_is_refused_by_name() -> None:
    with pytest.raises(LaunchError, match="--scheduler must be one of slaq, stock"):
        plan_launch(EngineOptions(scheduler="edf"), model_path="/cache/tiny", environ={})


def test_the_cli_flag_reaches_the_options() -> None:
    args = build_parser().parse_args(["engine", "--scheduler", "stock"])
    assert args.scheduler == "stock"
    assert build_parser().parse_args(["engine"]).scheduler == "slaq"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["engine", "--scheduler", "fifo"])


def test_a_cpu_pool_naming_the_tiny_model_gets_the_built_in_one() -> None:
    # crds/examples/pool-cpu.yaml says model name slaq-tiny; the rendered pod runs `slaq engine --model slaq-tiny`.
    argv = plan_launch(EngineOptions(model="slaq-tiny", device="cpu", load_format="dummy"), model_path="/cache/tiny", environ={}).argv
    assert argv[argv.index("--model") + 1] == "/cache/tiny" and argv[argv.index("--tokenizer") + 1] == "/cache/tiny"
    assert argv[argv.index("--served-model-name") + 1] == "slaq-tiny"
    with pytest.raises(LaunchError, match="needs its directory"):
        plan_launch(EngineOptions(model="slaq-tiny"), environ={})
    other = plan_launch(EngineOptions(model="meta-llama/Llama-3.1-8B"), environ={}).argv
    assert other[other.index("--model") + 1] == "meta-llama/Llama-3.1-8B"


def test_stock_priority_is_vllms_own_scheduler_with_its_priority_policy() -> None:
    from slaq.engine import vllm_compat

    argv = plan_launch(EngineOptions(scheduler="stock-priority"), model_path="/cache/tiny", environ={}).argv
    args = vllm_compat.parse_server_args(argv)
    assert args.scheduling_policy == "priority"
    assert args.scheduler_cls in (None, "") or "slaq" not in str(args.scheduler_cls)
    assert build_parser().parse_args(["engine", "--scheduler", "stock-priority"]).scheduler == "stock-priority"
