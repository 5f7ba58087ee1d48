"""Every place slaq touches vLLM internals, pinned to vLLM 0.32.0.

vLLM's scheduler internals are not a public API. Nothing else in `slaq.engine` reaches into a
vLLM object's private state: it goes through the functions here, and tests/engine/test_vllm_compat.py
has one test per touch point, so an upgrade shows exactly what broke.

The package is the only place that imports vLLM (tests/engine/test_vllm_seam.py fails otherwise):
`kv_cache_manager` holds the `KVCacheManager` methods slaq's block budget overrides, `offline` builds
a scheduler without a model runner (tests, benchmarks, the simulator), `llm` wraps vLLM's offline
`LLM` for scripts.
"""

from __future__ import annotations

import contextlib
import operator
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request, RequestStatus

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

VLLM_VERSION = "0.32.0"

__all__ = [
    "AsyncScheduler", "KVCacheManager", "Request", "RequestQueue", "SchedulerOutput", "VLLM_VERSION",
]

_INFO_ATTR = "_slaq_info"
_IS_PREFILL_CHUNK = operator.attrgetter("is_prefill_chunk")


# -- requests ------------------------------------------------------------------------------
def extra_args(request: Request) -> dict[str, Any] | None:
    """The `vllm_xargs` of the request, as vLLM hands them to the scheduler."""
    params = request.sampling_params
    return params.extra_args if params is not None else None


def set_priority(request: Request, priority: int) -> None:
    """The priority vLLM's own ordering and preemption read (`Request.priority`, lower runs earlier)."""
    request.priority = priority


def attach_info(request: Request, info: Any) -> None:
    setattr(request, _INFO_ATTR, info)


def attached_info(request: Request) -> Any | None:
    return getattr(request, _INFO_ATTR, None)


# What `attach_info` attached, for a request known to have it (AttributeError otherwise): read for
# queue heads and allocations many times a step, so a C-speed getter.
known_info: Callable[[Request], Any] = operator.attrgetter(_INFO_ATTR)


def finish_reason(request: Request) -> str | None:
    """Why a finished request ended, as vLLM names it in its answers (`stop`, `length`, `abort`, `error`, `repetition`)."""
    reason = request.get_finished_reason()
    return str(reason) if reason is not None else None


def is_preempted(request: Request) -> bool:
    return request.status == RequestStatus.PREEMPTED


def is_running(request: Request) -> bool:
    """In the running batch (not waiting, preempted, loading its KV from a connector, or finished)."""
    return request.status == RequestStatus.RUNNING


def is_decoding(request: Request) -> bool:
    """Running and past its prompt. With async scheduling num_computed_tokens includes in-flight tokens."""
    return (
        request.status == RequestStatus.RUNNING
        and not request.is_prefill_chunk
        and request.num_computed_tokens >= request.num_prompt_tokens
    )


# -- the scheduler -------------------------------------------------------------------------
def install_waiting_queues(scheduler: AsyncScheduler, make_queue: Callable[[], RequestQueue]) -> None:
    """Replace both waiting queues (`kv_holding_waiting` is served before `waiting`); call before any request arrives."""
    if scheduler.waiting or scheduler.kv_holding_waiting:
        raise RuntimeError("waiting queues can only be replaced while empty")
    scheduler.waiting = make_queue()
    scheduler.kv_holding_waiting = make_queue()


def waiting_queues(scheduler: AsyncScheduler) -> tuple[RequestQueue, RequestQueue]:
    """Both waiting queues: `waiting`, then `kv_holding_waiting` (which vLLM serves first)."""
    return scheduler.waiting, scheduler.kv_holding_waiting


def waiting_queue(scheduler: AsyncScheduler) -> RequestQueue:
    """The queue of waiting requests that hold no KV blocks (the one new requests join)."""
    return scheduler.waiting


def first_waiting(scheduler: AsyncScheduler) -> Request:
    """The request of `waiting` that vLLM's waiting loop tries first (the queue must not be empty)."""
    return scheduler.waiting.peek_request()


def running_requests(scheduler: AsyncScheduler) -> list[Request]:
    """The live running list; `remove_all` rebinds `scheduler.running`, so never keep the result across steps."""
    return scheduler.running


def active_request_limit(scheduler: AsyncScheduler) -> int:
    """How many requests may be running; paused streaming sessions hold slots too."""
    return scheduler.max_num_active_reqs - scheduler.num_waiting_for_streaming_input


def batch_full(scheduler: AsyncScheduler) -> bool:
    """Whether `schedule()`'s waiting loop will stop before it looks at a waiting request: the running
    batch, with paused streaming sessions, fills `max_num_active_reqs` (the loop's first check). Within
    a step nothing leaves `running` but what its running loop preempts, and a step that preempts skips
    the waiting loop; read it inside `hold_back`, which lowers the limit."""
    return len(scheduler.running) + scheduler.num_waiting_for_streaming_input >= scheduler.max_num_active_reqs


def preempt(scheduler: AsyncScheduler, request: Request, now: float) -> None:
    """Preempt a running request before `schedule()` runs (waiting admission is skipped in a step
    whose own running loop preempted, so slaq preempts first). `_preempt_request` wants the request
    already out of `running` and manages output placeholders itself."""
    scheduler.running.remove(request)
    scheduler._preempt_request(request, now)


def max_model_len(scheduler: AsyncScheduler) -> int:
    return scheduler.max_model_len


def block_manager(scheduler: AsyncScheduler) -> KVCacheManager:
    return scheduler.kv_cache_manager


def kv_cache_usage(scheduler: AsyncScheduler) -> float:
    """Share of the KV cache in use, 0..1 (what vLLM exports as `vllm:kv_cache_usage_perc`)."""
    return scheduler.kv_cache_manager.usage


def request_by_id(scheduler: AsyncScheduler, request_id: str) -> Request | None:
    """A request the scheduler still holds (None once it finished)."""
    return scheduler.requests.get(request_id)


# Request fields (vLLM 0.32 names), read for every running request in a step: C-speed getters.
request_id: Callable[[Request], str] = operator.attrgetter("request_id")
computed_tokens: Callable[[Request], int] = operator.attrgetter("num_computed_tokens")  # in the KV cache (async: in-flight ones too)
total_tokens: Callable[[Request], int] = operator.attrgetter("num_tokens")  # prompt + output so far
prompt_tokens: Callable[[Request], int] = operator.attrgetter("num_prompt_tokens")
output_tokens: Callable[[Request], int] = operator.attrgetter("num_output_tokens")  # delivered (no async placeholders)
_OUTPUT_TOKEN_IDS = operator.attrgetter("_output_token_ids")


def output_token_counts(requests: Iterable[Request]) -> Iterator[int]:
    """`output_tokens` of each request, in C-speed maps (vLLM's `num_output_tokens` is a Python
    property, the length of this list): for a whole running batch at once."""
    return map(len, map(_OUTPUT_TOKEN_IDS, requests))
max_tokens: Callable[[Request], int] = operator.attrgetter("max_tokens")
arrival_time: Callable[[Request], float] = operator.attrgetter("arrival_time")
priority: Callable[[Request], int] = operator.attrgetter("priority")  # what vLLM's priority heap orders by first
is_prefill_chunk: Callable[[Request], bool] = _IS_PREFILL_CHUNK  # prompt tokens left to compute


@contextlib.contextmanager
def step_token_budget(scheduler: AsyncScheduler, tokens: int | None) -> Iterator[None]:
    """Cap this step's token budget: `schedule()` copies `max_num_scheduled_tokens` into its local
    budget and asserts against it at the end, so set it before the call and restore it after.
    `scheduler_config.max_num_batched_tokens` (the input-buffer size) is left alone."""
    if tokens is None:
        yield
        return
    saved = scheduler.max_num_scheduled_tokens
    scheduler.max_num_scheduled_tokens = max(1, min(saved, tokens))
    try:
        yield
    finally:
        scheduler.max_num_scheduled_tokens = saved


def decodes_first(scheduler: AsyncScheduler) -> None:
    """Put running decodes ahead of running prefill chunks (stable). `schedule()`'s running loop
    walks `running` in order, so a capped budget would otherwise go to a prefill chunk first and
    starve the decodes behind it. Rebinding `running` is what vLLM's own `remove_all` does."""
    running = scheduler.running
    if any_prefill_chunk(running):  # every step while a TPOT objective runs
        scheduler.running = [r for r in running if not r.is_prefill_chunk] + [r for r in running if r.is_prefill_chunk]


def any_prefill_chunk(requests: Sequence[Request]) -> bool:
    """Whether any of `requests` has a prompt chunk left (C-speed scan: no Python frame per request)."""
    return any(map(_IS_PREFILL_CHUNK, requests))


def longest_prefill_context(requests: Sequence[Request]) -> int:
    """The most tokens of KV computed by any of `requests` with a prompt chunk left: the context its
    next chunk's attention reads (0: none has a chunk left)."""
    if not any_prefill_chunk(requests):
        return 0
    return max(r.num_computed_tokens for r in requests if r.is_prefill_chunk)


def prefill_pairs(scheduler: AsyncScheduler, output: SchedulerOutput) -> int:
    """(query, key) pairs the prompt chunks of `output` attend over: n x context + n^2 / 2 for a chunk of
    n tokens at `context`. Read right after `schedule()`, whose `_update_after_schedule` has already
    counted the step's tokens in `num_computed_tokens`; single-token steps (decodes) are left to the KV term."""
    scheduled = output.num_scheduled_tokens
    if output.total_num_scheduled_tokens == len(scheduled):
        return 0  # one token each: all decodes (no Python loop over the batch)
    requests = scheduler.requests
    pairs = 0
    for request_id, new in scheduled.items():
        if new > 1:
            request = requests.get(request_id)
            if request is not None:
                pairs += new * (request.num_computed_tokens - new) + new * new // 2
    return pairs


def is_prefilling(request: Request) -> bool:
    """Running with prompt tokens still to compute (its next chunk is a prefill chunk).
    The plain flag is read first: most running requests decode, and the enum comparison costs more."""
    return request.is_prefill_chunk and request.status == RequestStatus.RUNNING


def decoded_tokens(request: Request) -> int:
    """Output tokens delivered so far (async placeholders not counted) while the request runs and
    decodes; 0 while it has prompt (or, after a preemption, recomputed) tokens left to prefill."""
    if request.is_prefill_chunk or request.status != RequestStatus.RUNNING:
        return 0
    return request.num_output_tokens


def prefill_tokens_left(request: Request) -> int:
    """Tokens still to compute: the rest of the prompt (and, after a preemption, of the output); 1 for a decode."""
    return max(0, request.num_tokens - request.num_computed_tokens)


@contextlib.contextmanager
def hold_back(scheduler: AsyncScheduler, requests: Sequence[Request]) -> Iterator[None]:
    """Leave running `requests` out of one `schedule()` call (they get no tokens this step, as when
    the budget runs out), so a waiting request can take their share of the budget. The admission
    limit is lowered by as many, so the running batch never exceeds `max_num_seqs`."""
    if not requests:
        yield
        return
    held = set(map(id, requests))
    scheduler.running = [r for r in scheduler.running if id(r) not in held]
    saved = scheduler.max_num_active_reqs
    scheduler.max_num_active_reqs = saved - len(requests)
    try:
        yield
    finally:
        scheduler.max_num_active_reqs = saved
        scheduler.running.extend(requests)


def step_token_limit(scheduler: AsyncScheduler) -> int:
    return scheduler.max_num_scheduled_tokens


def total_scheduled_tokens(output: SchedulerOutput) -> int:
    return output.total_num_scheduled_tokens


def most_tokens_per_request(model_runner_output: Any) -> int:
    """The most tokens any request received in one model output (1 without speculative decoding; 0
    when none did): what a request's delivered output can grow by between two outputs. C-speed."""
    return max(map(len, model_runner_output.sampled_token_ids or ()), default=0)


def preempted_ids(output: SchedulerOutput) -> set[str]:
    """Every request preempted in the step that produced `output` (slaq's and vLLM's own)."""
    return output.preempted_req_ids or set()


def admitted_ids(output: SchedulerOutput) -> list[str]:
    """Requests that got their first step in the step that produced `output`, or their first after a
    preemption (vLLM lists a resumed request among the cached ones, flagged resumed)."""
    ids = [new.req_id for new in output.scheduled_new_reqs]
    resumed = output.scheduled_cached_reqs.resumed_req_ids
    if resumed:
        ids.extend(resumed)
    return ids


def adopt_block_manager(scheduler: AsyncScheduler, manager_cls: type[KVCacheManager]) -> KVCacheManager:
    """Turn the scheduler's KVCacheManager into `manager_cls` in place, keeping its block pool and
    coordinator (built by `Scheduler.__init__` from arguments slaq does not duplicate)."""
    manager = scheduler.kv_cache_manager
    if not issubclass(manager_cls, type(manager)):
        raise TypeError(f"{manager_cls.__name__} must subclass {type(manager).__name__}")
    manager.__class__ = manager_cls
    return manager


# -- the block pool ------------------------------------------------------------------------
def block_size(scheduler: AsyncScheduler) -> int:
    return scheduler.block_size


def usable_blocks(manager: KVCacheManager) -> int:
    """All blocks of the pool except vLLM's reserved null block."""
    return manager.block_pool.num_gpu_blocks - 1


def free_blocks(manager: KVCacheManager) -> int:
    """Blocks that can be handed out now (includes cached blocks nobody references)."""
    return manager.block_pool.get_num_free_blocks()


def admission_blocks(scheduler: AsyncScheduler, request: Request) -> int:
    """Free blocks `allocate_slots` wants before it admits a waiting request without prefix hits:
    with `scheduler_reserve_full_isl` (vLLM's default) its whole sequence, else its first chunk,
    plus the watermark vLLM keeps free whenever a request is already running."""
    manager = scheduler.kv_cache_manager
    if scheduler.scheduler_reserve_full_isl:
        tokens = min(request.num_tokens, scheduler.max_model_len)
    else:
        tokens = request.num_computed_tokens + min(request.num_tokens - request.num_computed_tokens, scheduler.max_num_scheduled_tokens)
    watermark = manager.watermark_blocks if scheduler.running else 0
    return -(-tokens // scheduler.block_size) - -(-request.num_computed_tokens // scheduler.block_size) + watermark


def request_blocks(manager: KVCacheManager, request_id: str) -> list["KVCacheBlock"]:
    """The blocks a request holds, all KV cache groups."""
    return [block for group in manager.get_blocks(request_id).blocks for block in group]


def evict_first(manager: KVCacheManager, blocks: Sequence["KVCacheBlock"]) -> int:
    """Move those of `blocks` that sit unreferenced in the free queue (cached prefixes) to its
    front, so they are reused (their prefix evicted) before any other cached block."""
    queue = manager.block_pool.free_block_queue
    movable = [b for b in blocks if b.ref_cnt == 0 and not b.is_null and b.prev_free_block is not None]
    for block in movable:
        queue.remove(block)
    queue.prepend_n(movable)
    return len(movable)


def cached_free_floor(manager: KVCacheManager) -> int:
    """A lower bound on the free blocks that hold no cached prefix: free blocks less every prefix-cache
    key (keys of blocks in use and partial-prefix keys included, so never an overestimate of what is
    cached, except where two blocks share a key). Allocation takes these before evicting anything."""
    pool = manager.block_pool
    return pool.get_num_free_blocks() - len(pool.cached_block_hash_to_block)


block_id: Callable[["KVCacheBlock"], int] = operator.attrgetter("block_id")


def cached_hash(block: "KVCacheBlock") -> Any:
    """The block's prefix-cache key (None when it holds no cached prefix); a new object whenever
    the block is evicted and cached again."""
    return block.block_hash


def free_queue_order(manager: KVCacheManager) -> list[int]:
    """Block ids in eviction order (for tests and debugging; O(blocks))."""
    return [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]


# -- the OpenAI server -----------------------------------------------------------------------
def parse_server_args(argv: Sequence[str]) -> Any:
    """vLLM's own OpenAI-server argument parser (`python -m vllm.entrypoints.openai.api_server`)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="slaq engine (vLLM server)"))
    args = parser.parse_args(list(argv))
    validate_parsed_serve_args(args)
    return args


def run_server(args: Any) -> None:
    """Run vLLM's OpenAI server in this process until it is stopped (as vLLM's own `main()` does)."""
    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server as vllm_run_server
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()
    configure_logging_from_args(args)
    uvloop.run(vllm_run_server(args))


# -- the KV connector (slaq.engine.kv_security) ------------------------------------------------
# vLLM's KV-connector interface is its public extension point for KV transfer; what slaq reads of
# the objects it is handed (scheduler output fields, block lists, the KV cache config) is below.
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

KV_CONNECTOR_EXPORTS = (KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)


def scheduled_blocks(output: SchedulerOutput) -> Iterator[tuple[str, list[int], int, int, bool]]:
    """(request id, block ids, computed tokens at scheduling, scheduled tokens, replaces) for every
    request in a step (the first KV cache group: slaq's models have one). `replaces`: the ids are the
    request's whole block list (new or resumed), whose first computed tokens are prefix-cache hits;
    otherwise they are the blocks appended this step."""
    scheduled = output.num_scheduled_tokens
    for new in output.scheduled_new_reqs:
        yield new.req_id, list(new.block_ids[0]) if new.block_ids else [], new.num_computed_tokens, scheduled.get(new.req_id, 0), True
    cached = output.scheduled_cached_reqs
    resumed = cached.resumed_req_ids
    for request_id, new_blocks, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
        blocks = list(new_blocks[0]) if new_blocks else []
        yield request_id, blocks, computed, scheduled.get(request_id, 0), request_id in resumed


def skip_prefix_cache_reads(request: Request) -> None:
    """The request reads nothing from the prefix cache (vLLM's per-request switch, set at arrival)."""
    request.skip_reading_prefix_cache = True


def evict_cached_blocks(manager: KVCacheManager, block_ids: Sequence[int]) -> None:
    """Drop these blocks' prefix-cache entries (blocks still held stay held), so no request hits them."""
    if block_ids:
        manager.evict_blocks(set(block_ids))


def kv_connector(scheduler: AsyncScheduler) -> Any | None:
    """The scheduler-side KV connector vLLM built from `--kv-transfer-config` (None without one)."""
    return scheduler.connector


def first_group_block_ids(blocks: Any) -> list[int]:
    """Block ids of a `KVCacheBlocks` (as `update_state_after_alloc` receives it), first KV cache group."""
    return list(blocks.get_block_ids()[0])


def kv_cache_block_count(kv_cache_config: Any) -> int:
    return kv_cache_config.num_blocks


def kv_bytes_per_block(kv_cache_config: Any) -> int:
    """Bytes one block holds across every layer (what a host copy of it costs)."""
    total = sum(tensor.size for tensor in kv_cache_config.kv_cache_tensors)
    return max(1, total // max(1, kv_cache_config.num_blocks))


def connector_settings(vllm_config: Any) -> dict[str, Any]:
    """`kv_connector_extra_config` of `--kv-transfer-config`."""
    return dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})


def config_block_size(vllm_config: Any) -> int:
    return vllm_config.cache_config.block_size


def failed_block_ids(connector_output: Any) -> set[int]:
    """Blocks the worker-side connector could not load this step (`KVConnectorOutput.invalid_block_ids`)."""
    return set(connector_output.invalid_block_ids or ()) if connector_output is not None else set()


class RecomputesLoadFailures(AsyncScheduler):
    """vLLM 0.32's `kv_load_failure_policy=recompute` with async scheduling, made to finish.

    When a KV connector reports blocks it could not load (`invalid_block_ids`), vLLM truncates the
    running request's `num_computed_tokens` to the first bad block and skips this step's output, so
    the request recomputes from there. With async scheduling it leaves two things behind (vLLM issue
    45138): the step's output placeholder, which keeps counting in the request's next token count
    and its max-tokens guard, so the request never finishes; and the step already scheduled after
    this one, whose output was sampled from the bad KV and would still be delivered. Both are reset
    the way vLLM's own `_handle_stopped_request` resets a resumed turn: placeholders to zero, every
    in-flight output marked stale and dropped."""

    def _update_requests_with_invalid_blocks(self, requests: Any, invalid_block_ids: set[int],
                                             num_scheduled_tokens: dict[str, int], evict_blocks: bool = True) -> Any:
        affected, tokens, to_evict = super()._update_requests_with_invalid_blocks(
            requests, invalid_block_ids, num_scheduled_tokens, evict_blocks)
        for request_id in affected:
            request = self.requests.get(request_id)
            if request is not None and request.status == RequestStatus.RUNNING:
                discard_in_flight_output(request)
        return affected, tokens, to_evict


class ReportsFreedRequests(AsyncScheduler):
    """Calls `request_freed(request)` once for every request that leaves the scheduler, after vLLM
    freed it: finished in a step (stop, length), or aborted from the API server (a client that went
    away). Both go through `_free_request`, which also tells the KV connector (`request_finished`)."""

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        freed = super()._free_request(request, delay_free_blocks)
        self.request_freed(request)
        return freed

    def request_freed(self, request: Request) -> None:
        return None


def discard_in_flight_output(request: Request) -> None:
    """Every output still in flight for the request is dropped when it arrives; no placeholder is
    left counting toward its next step."""
    request.spec_token_ids = []
    request.drop_stale_output = True
    request.num_stale_output_tokens = request.num_in_flight_tokens
    request.num_output_placeholders = 0
