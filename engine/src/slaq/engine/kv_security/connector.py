"""`SlaqKVConnector`: slaq's KV security as a vLLM 0.32 KV connector (`--kv-transfer-config`).

vLLM builds one instance in the scheduler process (role SCHEDULER: planner.py) and one in each
worker (role WORKER: worker.py); the plan built each step travels to the workers inside the
scheduler output. One connector does both erase and swap, because their order matters within a
step (a preempted request's blocks are sealed before anything zeroes or reuses them, and blocks
are zeroed before a host copy is written back into them); vLLM's MultiConnector gives no order
between its children's worker hooks that slaq could rely on.

Settings: settings.py (`kv_connector_extra_config`, and the `--kv-transfer-config` that loads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slaq.api.table import EngineTable
from slaq.engine import vllm_compat as vc
from slaq.engine.kv_security.planner import KVSecurityPlan, KVSecurityPlanner
from slaq.engine.kv_security.swap import RecomputeModel, SwapOrRecompute
from slaq.engine.kv_security.settings import CONNECTOR_MODULE, CONNECTOR_NAME, KVSecuritySettings, transfer_config_json
from slaq.engine.kv_security.worker import KVSecurityWorker
from slaq.engine.request_log import KVRequestFacts

__all__ = ["CONNECTOR_MODULE", "CONNECTOR_NAME", "KVSecuritySettings", "SlaqKVConnector", "SlaqKVMetadata", "transfer_config_json"]


@dataclass
class SlaqKVMetadata(vc.KVConnectorMetadata):
    plan: KVSecurityPlan


class SlaqKVConnector(vc.KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        settings = KVSecuritySettings.from_extra(vc.connector_settings(vllm_config))
        num_blocks = vc.kv_cache_block_count(kv_cache_config)
        self.settings = settings
        self.planner: KVSecurityPlanner | None = None
        self.worker: KVSecurityWorker | None = None
        if role == vc.KVConnectorRole.SCHEDULER:
            from slaq.engine.config import engine_table_path
            from slaq.engine.metrics import engine_metrics
            import os

            self.block_bytes = vc.kv_bytes_per_block(kv_cache_config)
            self.planner = KVSecurityPlanner(
                num_blocks=num_blocks,
                block_size=vc.config_block_size(vllm_config),
                erase=settings.erase,
                host_capacity_blocks=settings.host_cache_bytes // self.block_bytes,
                metrics=engine_metrics(),
                inspect=settings.inspect_path is not None,
                engine_table=engine_table_path(os.environ),
            )
        else:
            self.worker = KVSecurityWorker(num_blocks=num_blocks, inspect_path=settings.inspect_path, tamper_flag=settings.tamper_flag,
                                           step_delay_s=settings.step_delay_s)

    def use_step_model(self, step_model: RecomputeModel) -> SwapOrRecompute | None:
        """The scheduler's step-time model prices recomputing a victim: install the swap rule (swap.py)
        with the seal throughput of the settings, or measured here once (None without a host cache)."""
        assert self.planner is not None
        if self.planner.swap is None:
            return None
        if self.settings.seal_gb_s is not None:
            seconds_per_byte = 1.0 / (self.settings.seal_gb_s * 1e9)
        else:
            from slaq.engine.kv_security.seal_cost import host_seal_seconds_per_byte

            seconds_per_byte = host_seal_seconds_per_byte(self.block_bytes)
        return self.planner.use_swap_rule(step_model, bytes_per_token=self.block_bytes / self.planner.ownership.block_size,
                                          seal_seconds_per_byte=seconds_per_byte, always=self.settings.swap_choice == "always")

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a host copy is a cache: a lost one means a recompute, nothing more

    # -- scheduler side ---------------------------------------------------------------------------
    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if self.planner is not None:
            self.planner.manager = kv_cache_manager

    def on_new_request(self, request: Any) -> None:
        assert self.planner is not None
        self.planner.arrived(request)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self.planner is not None
        return self.planner.matched_tokens(request, num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self.planner is not None
        self.planner.allocated(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> SlaqKVMetadata:
        assert self.planner is not None
        return SlaqKVMetadata(self.planner.plan(scheduler_output))

    def update_connector_output(self, connector_output: Any) -> None:
        assert self.planner is not None
        self.planner.load_failed(vc.failed_block_ids(connector_output))

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self.planner is not None
        self.planner.finished(request)
        return False, None

    def request_facts(self, request_id: str) -> KVRequestFacts | None:
        """The blocks erased and swapped for a live request, counted as the steps go (the scheduler's audit line)."""
        return self.planner.request_facts(request_id) if self.planner is not None else None

    def apply_table(self, table: EngineTable) -> None:
        """The engine table changed (the scheduler's watcher read it)."""
        if self.planner is not None:
            self.planner.apply_table(table)

    # -- worker side ------------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        assert self.worker is not None
        self.worker.register(kv_caches)

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        assert self.worker is not None
        self.worker.before_forward(kv_connector_metadata.plan)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        assert self.worker is not None
        self.worker.load(self._get_connector_metadata().plan)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def get_block_ids_with_load_errors(self) -> set[int]:
        assert self.worker is not None
        return self.worker.take_failed()
