"""`slaq engine`'s flags, the vLLM arguments they become, and the scheduler configuration it hands over."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slaq.api.runtime import SCHEDULER_CONFIG_ENV
from slaq.api.table import EngineTable, TenantEntry, TenantTable, hash_api_key
from slaq.api.common import Tier
from slaq.engine.config import ENGINE_TABLE_ENV, EngineSchedulerConfig, EngineTableWatcher, read_scheduler_config_argument
from slaq.engine.errors import LaunchError, SchedulerConfigError
from slaq.engine.launcher import SCHEDULER_CLS, EngineOptions, plan_launch, prepare_environment
from slaq.engine.tiny_model import ensure_tiny_model
from tests.engine.harness import build_scheduler

ROOT = Path(__file__).resolve().parents[2]


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_tiny_model_defaults_cpu_dummy_weights_and_the_slaq_scheduler() -> None:
    plan = plan_launch(EngineOptions(), model_path="/cache/tiny", environ={})
    assert _flag(plan.argv, "--model") == "/cache/tiny" and _flag(plan.argv, "--tokenizer") == "/cache/tiny"
    assert _flag(plan.argv, "--scheduler-cls") == SCHEDULER_CLS
    assert _flag(plan.argv, "--scheduling-policy") == "priority"
    assert _flag(plan.argv, "--load-format") == "dummy" and _flag(plan.argv, "--served-model-name") == "slaq-tiny"
    assert _flag(plan.argv, "--host") == "127.0.0.1" and _flag(plan.argv, "--port") == "8001"
    assert plan.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_on_cpu_the_kv_connector_does_not_cost_the_engine_its_reserved_core() -> None:
    """vLLM reserves one more core when a KV connector is set; on two cores that leaves none free."""
    assert plan_launch(EngineOptions(), model_path="/m", environ={}).environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    chosen = plan_launch(EngineOptions(), model_path="/m", environ={"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"})
    assert chosen.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"  # the operator's own choice stands
    for options in (EngineOptions(scheduler="stock"), EngineOptions(kv_erase=False, kv_host_cache_gib=0)):
        assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in plan_launch(options, model_path="/m", environ={}).environ  # no connector
    gpu = plan_launch(EngineOptions(model="meta-llama/Llama-3.1-8B"), environ={})
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in gpu.environ


def test_a_gpu_engine_that_swaps_runs_the_model_runner_whose_recompute_is_proven() -> None:
    """A failed load of a sealed copy is recomputed; vLLM's Model Runner V2 loses that recompute."""
    gpu = "meta-llama/Llama-3.1-8B"
    assert plan_launch(EngineOptions(model=gpu), environ={}).environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    chosen = plan_launch(EngineOptions(model=gpu), environ={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert chosen.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"  # the operator's own choice stands
    for options in (EngineOptions(model=gpu, kv_host_cache_gib=0), EngineOptions(model=gpu, scheduler="stock"), EngineOptions()):
        assert "VLLM_USE_V2_MODEL_RUNNER" not in plan_launch(options, model_path="/m", environ={}).environ  # no swap, or the CPU runner


def test_every_flag_reaches_vllm_and_extra_arguments_pass_through() -> None:
    options = EngineOptions(
        host="0.0.0.0", port=9000, model="meta-llama/Llama-3.1-8B", dtype="bfloat16", max_model_len=8192,
        tensor_parallel_size=2, gpu_memory_utilization=0.85, max_num_seqs=256, max_num_batched_tokens=8192,
        load_format="safetensors", served_model_name="llama", revision="main", scheduler_config='{"agingBoundSeconds":30.0}',
        extra=("--enable-prefix-caching",),
    )
    plan = plan_launch(options, environ={})
    expected = {"--host": "0.0.0.0", "--port": "9000", "--model": "meta-llama/Llama-3.1-8B", "--dtype": "bfloat16",
                "--max-model-len": "8192", "--tensor-parallel-size": "2", "--gpu-memory-utilization": "0.85",
                "--max-num-seqs": "256", "--max-num-batched-tokens": "8192", "--load-format": "safetensors",
                "--served-model-name": "llama", "--revision": "main"}
    for flag, value in expected.items():
        assert _flag(plan.argv, flag) == value, flag
    assert plan.argv[-1] == "--enable-prefix-caching" and "--tokenizer" not in plan.argv
    assert plan.environ[SCHEDULER_CONFIG_ENV] == '{"agingBoundSeconds":30.0}'
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan.environ  # a GPU model sizes its cache from gpu memory utilisation


def test_stock_scheduler_is_vllms_own_default_as_a_baseline() -> None:
    plan = plan_launch(EngineOptions(scheduler="stock"), model_path="/m", environ={})
    assert "--scheduler-cls" not in plan.argv and "--scheduling-policy" not in plan.argv
    with pytest.raises(LaunchError, match="--scheduler"):
        plan_launch(EngineOptions(scheduler="fifo"), model_path="/m", environ={})


def test_the_scheduler_flags_cannot_be_overridden_after_the_separator() -> None:
    with pytest.raises(LaunchError, match="--scheduler-cls"):
        plan_launch(EngineOptions(extra=("--scheduler-cls", "x.Y")), model_path="/m", environ={})


def test_prepare_environment_sets_a_prometheus_multiprocess_dir(tmp_path: Path) -> None:
    target: dict[str, str] = {}
    prepare_environment(plan_launch(EngineOptions(), model_path="/m", environ={}), target)
    assert Path(target["PROMETHEUS_MULTIPROC_DIR"]).is_dir()
    kept = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    prepare_environment(plan_launch(EngineOptions(), model_path="/m", environ={}), kept)
    assert kept["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path)


def test_planning_a_launch_imports_neither_vllm_nor_prometheus_client() -> None:
    # prometheus_client picks its value store when imported: imported before prepare_environment
    # sets PROMETHEUS_MULTIPROC_DIR, the API server's vllm:* series never reach /metrics.
    probe = ("import sys\n"
             "from slaq.cli import build_parser\n"
             "from slaq.engine.launcher import EngineOptions, plan_launch\n"
             "build_parser().parse_args(['engine'])\n"
             "plan = plan_launch(EngineOptions(), '/m')\n"
             "assert '--kv-transfer-config' in plan.argv, plan.argv\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'prometheus_client', 'torch')))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_scheduler_config_reads_json_or_a_file_and_names_what_is_wrong(tmp_path: Path) -> None:
    assert json.loads(read_scheduler_config_argument('{"maxPreemptionsPerStep": 2}'))["maxPreemptionsPerStep"] == 2
    path = tmp_path / "spec.json"
    path.write_text('{"criticalKvHeadroom": 0.2}')
    assert json.loads(read_scheduler_config_argument(str(path)))["criticalKvHeadroom"] == 0.2
    with pytest.raises(SchedulerConfigError, match="neither JSON nor a readable file"):
        read_scheduler_config_argument(str(tmp_path / "missing.json"))
    with pytest.raises(SchedulerConfigError, match="criticalKvHeadroom"):
        read_scheduler_config_argument('{"criticalKvHeadroom": 0.9}')


def test_engine_config_from_environment_reads_the_spec_and_tenant_shares(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    _write_table(path, {"acme": 0.25})
    config = EngineSchedulerConfig.from_environment({SCHEDULER_CONFIG_ENV: '{"agingBoundSeconds": 5}', ENGINE_TABLE_ENV: str(path)})
    assert config.spec.aging_bound_seconds == 5.0 and config.tenant_kv_share == {"acme": 0.25}
    assert EngineSchedulerConfig.from_environment({ENGINE_TABLE_ENV: str(tmp_path / "none.json")}).tenant_kv_share == {}
    with pytest.raises(SchedulerConfigError, match=SCHEDULER_CONFIG_ENV):
        EngineSchedulerConfig.from_environment({SCHEDULER_CONFIG_ENV: "{not json"})


def test_the_engine_refuses_a_table_with_key_hashes_or_salts(tmp_path: Path) -> None:
    """Least knowledge: the sidecar's full table (key hashes, salts) is not an engine table."""
    path = tmp_path / "tenants.json"
    path.write_text(_table({"acme": 0.25}).model_dump_json(by_alias=True))
    with pytest.raises(SchedulerConfigError, match="keyHashes"):
        EngineSchedulerConfig.from_environment({ENGINE_TABLE_ENV: str(path)})


def test_tiny_model_is_generated_once(tmp_path: Path) -> None:
    target = ensure_tiny_model(tmp_path / "tiny")
    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["head_dim"] == 64 and config["num_hidden_layers"] == 2
    stamp = (target / "config.json").stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path / "tiny") == target and (target / "config.json").stat().st_mtime_ns == stamp


def test_cli_refuses_a_bad_scheduler_config_with_a_clear_message() -> None:
    result = subprocess.run([sys.executable, "-m", "slaq", "engine", "--scheduler-config", '{"maxPreemptionsPerStep": -1}'],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "maxPreemptionsPerStep" in result.stderr


def test_cli_help_lists_every_operator_flag() -> None:
    result = subprocess.run([sys.executable, "-m", "slaq", "engine", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    for flag in ("--host", "--port", "--model", "--device", "--dtype", "--max-model-len", "--tensor-parallel-size",
                 "--gpu-memory-utilization", "--max-num-seqs", "--max-num-batched-tokens", "--load-format",
                 "--served-model-name", "--revision", "--scheduler-config", "--scheduler"):
        assert flag in result.stdout, flag


def _table(shares: dict[str, float]) -> TenantTable:
    return TenantTable(pool="ns/pool", tenants=[
        TenantEntry(name=name, tier=Tier.STANDARD, cache_salt="s" * 16, kv_cache_share=share, key_hashes=[hash_api_key(name)])
        for name, share in shares.items()])


def _write_table(path: Path, shares: dict[str, float]) -> None:
    """The engine's cut of a table, as the operator writes it and the kubelet swaps it in (atomically)."""
    staged = path.with_suffix(".new")
    staged.write_text(EngineTable.of(_table(shares)).model_dump_json(by_alias=True))
    staged.replace(path)


def test_engine_table_watcher_reads_a_changed_table_and_keeps_the_shares_on_a_bad_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "engine.json"
    _write_table(path, {"acme": 0.25})
    now = [0.0]
    watcher = EngineTableWatcher(path, interval_s=2.0, clock=lambda: now[0])
    assert watcher.poll() is None  # unchanged, and not looked at before the interval
    _write_table(path, {"acme": 0.5, "beta": 0.1})
    assert watcher.poll() is None
    now[0] = 2.0
    assert watcher.poll().kv_shares() == {"acme": 0.5, "beta": 0.1}
    now[0] = 4.0
    assert watcher.poll() is None  # seen already
    path.write_text("{not a table")
    now[0] = 6.0
    assert watcher.poll() is None and "invalid engine table" in caplog.text
    path.unlink()
    now[0] = 8.0
    assert watcher.poll() is None and "is missing" in caplog.text
    _write_table(path, {"acme": 1.0})
    now[0] = 10.0
    assert watcher.poll().kv_shares() == {"acme": 1.0}


def test_the_scheduler_applies_a_changed_tenant_table_without_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    _write_table(path, {"small": 0.25})
    config = EngineSchedulerConfig.from_environment({ENGINE_TABLE_ENV: str(path)})
    scheduler = build_scheduler(config=config, num_blocks=41)
    assert scheduler.block_manager.rule.tenant_cap_blocks == {"small": 10}
    assert scheduler.table_watcher is not None and scheduler.table_watcher.path == path
    scheduler.table_watcher = scheduler.watch_engine_table(path, interval_s=0.0)  # look at every step
    applied = scheduler.metrics.table_reloads.labels(outcome="applied")
    before = applied._value.get()
    _write_table(path, {"small": 0.5, "new": 0.1})
    scheduler.schedule()
    assert scheduler.block_manager.rule.tenant_cap_blocks == {"small": 20, "new": 4}
    assert applied._value.get() == before + 1
    _write_table(path, {"small": 1.0})
    scheduler.schedule()
    assert scheduler.block_manager.rule.tenant_cap_blocks == {}


def test_the_sidecar_knows_the_pinned_vllm_servers_keep_alive_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar drops idle engine connections before vLLM closes them; that needs vLLM's real default."""
    import vllm.envs

    from slaq.sidecar.proxy import ENGINE_KEEP_ALIVE_S, IDLE_CONNECTION_EXPIRY_S

    monkeypatch.delenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", raising=False)
    assert vllm.envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE == ENGINE_KEEP_ALIVE_S > IDLE_CONNECTION_EXPIRY_S


def test_the_swap_rule_settings_reach_the_connector_and_bad_values_are_refused_by_flag() -> None:
    from slaq.engine.kv_security.settings import KVSecuritySettings
    from slaq.engine.launcher import kv_transfer_config

    default = KVSecuritySettings.from_extra(json.loads(kv_transfer_config(EngineOptions()))["kv_connector_extra_config"])
    assert default.swap_choice == "cost" and default.seal_gb_s is None  # measured when the engine starts
    chosen = json.loads(kv_transfer_config(EngineOptions(kv_seal_gb_s=1.26, kv_swap_choice="always")))["kv_connector_extra_config"]
    assert chosen["hostSealGbS"] == 1.26 and chosen["swapChoice"] == "always"
    with pytest.raises(LaunchError, match="--kv-seal-gb-s.*hostSealGbS must be above 0"):
        kv_transfer_config(EngineOptions(kv_seal_gb_s=0.0))
    with pytest.raises(LaunchError, match="--kv-swap-choice.*swapChoice must be one of cost, always"):
        kv_transfer_config(EngineOptions(kv_swap_choice="sometimes"))
    with pytest.raises(ValueError, match="swapChoice must be one of"):
        KVSecuritySettings.from_extra({"swapChoice": "maybe"})


def test_the_step_delay_test_hook_reaches_the_worker_and_a_negative_delay_is_refused() -> None:
    from slaq.engine.kv_security.settings import KVSecuritySettings
    from slaq.engine.launcher import kv_transfer_config

    extra = json.loads(kv_transfer_config(EngineOptions(kv_test_hooks={"stepDelayS": 0.01})))["kv_connector_extra_config"]
    assert KVSecuritySettings.from_extra(extra).step_delay_s == 0.01
    assert "stepDelayS" not in json.loads(kv_transfer_config(EngineOptions()))["kv_connector_extra_config"]  # off unless asked
    with pytest.raises(LaunchError, match="--kv-test-hooks.*stepDelayS must be 0 or more"):
        kv_transfer_config(EngineOptions(kv_test_hooks={"stepDelayS": -1}))
    with pytest.raises(LaunchError, match="unknown hook.*sleepS"):
        kv_transfer_config(EngineOptions(kv_test_hooks={"sleepS": 1}))
