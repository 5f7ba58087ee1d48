"""One test per vLLM touch point in slaq.engine.vllm_compat: an upgrade shows exactly what broke."""

from __future__ import annotations

import pytest
import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.request_queue import SchedulingPolicy

from slaq.api.common import Tier
from slaq.engine import vllm_compat as vc
from slaq.engine.launcher import SCHEDULER_CLS

from tests.engine.harness import BLOCK_SIZE, Driver, build_scheduler, make_request


def _stock(**kwargs) -> AsyncScheduler:
    return build_scheduler(AsyncScheduler, **kwargs)


def test_pinned_vllm_version() -> None:
    assert vllm.__version__ == vc.VLLM_VERSION


def test_extra_args_are_the_requests_vllm_xargs() -> None:
    request = make_request(Tier.BATCH, tenant="acme")
    assert vc.extra_args(request)["slaq_tenant"] == "acme"


def test_attach_info_round_trips_and_defaults_to_none() -> None:
    request = make_request(Tier.BATCH)
    assert vc.attached_info(request) is None
    with pytest.raises(AttributeError):
        vc.known_info(request)
    vc.attach_info(request, "facts")
    assert vc.attached_info(request) == "facts" and vc.known_info(request) == "facts"


def test_is_preempted_and_is_decoding_follow_the_request_lifecycle() -> None:
    scheduler = _stock(max_num_seqs=1)
    driver = Driver(scheduler)
    request = make_request(Tier.BATCH, prompt_tokens=40, max_tokens=50)
    driver.add(request)
    assert not vc.is_decoding(request) and not vc.is_preempted(request) and not vc.is_running(request)
    driver.step()
    assert vc.is_decoding(request) and vc.is_running(request)  # whole prompt scheduled; async: computed tokens include in-flight ones
    vc.preempt(scheduler, request, 0.0)
    assert vc.is_preempted(request) and not vc.is_decoding(request) and not vc.is_running(request)


def test_decoded_tokens_counts_delivered_outputs_only_while_decoding() -> None:
    scheduler = _stock(max_num_seqs=1)
    driver = Driver(scheduler)
    request = make_request(Tier.BATCH, prompt_tokens=40, max_tokens=50)
    driver.add(request)
    with vc.step_token_budget(scheduler, 16):
        driver.step()  # a prompt chunk: nothing to pace yet
    assert vc.decoded_tokens(request) == 0
    driver.step()  # the rest of the prompt: first token delivered
    assert vc.decoded_tokens(request) == 1
    driver.step()
    driver.step()
    assert vc.decoded_tokens(request) == 3
    output = scheduler.schedule()  # async: the in-flight step's token is a placeholder, not delivered
    assert vc.decoded_tokens(request) == 3
    driver.answer(output)
    vc.preempt(scheduler, request, 0.0)
    assert request.num_output_tokens == 4 and vc.decoded_tokens(request) == 0  # preempted: not paced


def test_install_waiting_queues_replaces_both_queues_and_refuses_when_busy() -> None:
    scheduler = _stock()
    queues = []
    vc.install_waiting_queues(scheduler, lambda: queues.append(type(scheduler.waiting)()) or queues[-1])
    assert scheduler.waiting is queues[0] and scheduler.kv_holding_waiting is queues[1]
    scheduler.add_request(make_request(Tier.BATCH))
    try:
        vc.install_waiting_queues(scheduler, lambda: type(scheduler.waiting)())
    except RuntimeError:
        pass
    else:
        raise AssertionError("replacing a non-empty queue must fail")


def test_waiting_queues_are_the_schedulers_two_queues() -> None:
    scheduler = _stock()
    assert vc.waiting_queues(scheduler) == (scheduler.waiting, scheduler.kv_holding_waiting)
    assert vc.waiting_queue(scheduler) is scheduler.waiting
    request = make_request(Tier.BATCH)
    scheduler.add_request(request)
    assert list(vc.waiting_queue(scheduler)) == [request]  # where a new request waits


def test_first_waiting_priority_and_is_prefill_chunk_are_what_vllms_loops_read() -> None:
    scheduler = _stock(max_num_batched_tokens=32)
    late, early = make_request(Tier.BATCH, prompt_tokens=64), make_request(Tier.CRITICAL, prompt_tokens=64)
    vc.set_priority(late, 2)
    vc.set_priority(early, 0)
    scheduler.add_request(late)
    scheduler.add_request(early)
    assert vc.first_waiting(scheduler) is early and [vc.priority(r) for r in (early, late)] == [0, 2]
    driver = Driver(scheduler)
    driver.step()  # 32 of the critical prompt's 64 tokens
    assert vc.running_requests(scheduler) == [early] and vc.is_prefill_chunk(early)


def test_request_id_is_the_id_the_scheduler_knows_the_request_by() -> None:
    scheduler = _stock()
    request = make_request(Tier.BATCH)
    scheduler.add_request(request)
    assert vc.request_by_id(scheduler, vc.request_id(request)) is request


def test_running_requests_is_the_live_list() -> None:
    scheduler = _stock()
    driver = Driver(scheduler)
    request = make_request(Tier.BATCH, max_tokens=3)
    driver.add(request)
    driver.step()
    assert vc.running_requests(scheduler) == [request]
    driver.run_until_idle()
    assert vc.running_requests(scheduler) == []  # remove_all rebinds scheduler.running


def test_active_request_limit_is_max_num_seqs() -> None:
    assert vc.active_request_limit(_stock(max_num_seqs=3)) == 3


def test_batch_full_means_the_waiting_loop_looks_at_no_waiting_request() -> None:
    scheduler = _stock(max_num_seqs=2)
    driver = Driver(scheduler)
    running = make_request(Tier.BATCH, max_tokens=50)
    driver.add(running)
    driver.step()
    assert not vc.batch_full(scheduler)
    with vc.hold_back(scheduler, [running]):  # lowers the limit with the batch: still one free slot
        assert not vc.batch_full(scheduler)
    driver.add(make_request(Tier.BATCH, max_tokens=50))
    driver.step()
    assert vc.batch_full(scheduler)
    waiting = make_request(Tier.CRITICAL)
    driver.add(waiting)
    peeked: list[object] = []
    peek = scheduler.waiting.peek_request
    scheduler.waiting.peek_request = lambda: peeked.append(peek()) or peeked[-1]
    output = driver.step()
    assert peeked == [] and waiting.request_id not in output.num_scheduled_tokens
    scheduler.running.pop()  # a free slot: the loop looks again
    assert not vc.batch_full(scheduler)
    driver.step()
    assert peeked and peeked[0] is waiting


def test_preempt_puts_the_request_back_in_waiting_and_reports_it() -> None:
    scheduler = _stock(max_num_seqs=1)
    driver = Driver(scheduler)
    request = make_request(Tier.BATCH, max_tokens=50)
    driver.add(request)
    driver.step()
    vc.preempt(scheduler, request, 0.0)
    assert request not in scheduler.running and len(scheduler.waiting) == 1
    output = driver.step()
    assert request.request_id in vc.preempted_ids(output)
    assert request.request_id in output.num_scheduled_tokens  # resumed (slot free again)


def test_max_model_len_and_block_size() -> None:
    scheduler = _stock(max_model_len=256)
    assert vc.max_model_len(scheduler) == 256 and vc.block_size(scheduler) == BLOCK_SIZE


def test_request_fields_block_manager_usage_and_lookup_follow_one_request() -> None:
    scheduler = _stock(num_blocks=50)
    assert vc.block_manager(scheduler) is scheduler.kv_cache_manager and vc.kv_cache_usage(scheduler) == 0.0
    request = make_request(Tier.BATCH, prompt_tokens=40, max_tokens=20, arrival=5.0)
    facts = (vc.computed_tokens, vc.total_tokens, vc.prompt_tokens, vc.output_tokens, vc.max_tokens, vc.arrival_time)
    assert [f(request) for f in facts] == [0, 40, 40, 0, 20, 5.0]
    driver = Driver(scheduler)
    driver.add(request)
    assert vc.request_by_id(scheduler, request.request_id) is request
    driver.step()  # the whole prompt, and its first output token back
    assert [f(request) for f in facts] == [40, 41, 40, 1, 20, 5.0]
    assert vc.kv_cache_usage(scheduler) > 0.0
    assert [vc.block_id(b) for b in vc.request_blocks(vc.block_manager(scheduler), request.request_id)] == [
        b.block_id for b in scheduler.kv_cache_manager.get_blocks(request.request_id).blocks[0]]
    driver.run_until_idle()
    assert vc.request_by_id(scheduler, request.request_id) is None


def test_most_tokens_per_request_is_the_longest_sampled_list_of_a_model_output() -> None:
    from slaq.engine.vllm_compat import offline

    assert vc.most_tokens_per_request(offline.model_runner_output(["a", "b", "c"], [[7], [], [7, 8, 9]])) == 3
    assert vc.most_tokens_per_request(offline.model_runner_output(["a"], [[]])) == 0
    assert vc.most_tokens_per_request(offline.model_runner_output([], [])) == 0
    scheduler = _stock()
    request = make_request(Tier.BATCH, prompt_tokens=20, max_tokens=5)
    scheduler.add_request(request)
    output = scheduler.schedule()
    before = vc.output_tokens(request)
    runner_output = offline.model_runner_output([request.request_id], [[7]])
    scheduler.update_from_output(output, runner_output)
    assert vc.output_tokens(request) - before == vc.most_tokens_per_request(runner_output) == 1  # what the output appended


def test_step_token_budget_caps_one_step_and_restores() -> None:
    scheduler = _stock(max_num_batched_tokens=512)
    driver = Driver(scheduler)
    driver.add(make_request(Tier.BATCH, prompt_tokens=300))
    with vc.step_token_budget(scheduler, 64):
        assert vc.step_token_limit(scheduler) == 64
        output = scheduler.schedule()
    driver.answer(output)
    assert output.total_num_scheduled_tokens == 64
    assert vc.step_token_limit(scheduler) == 512
    with vc.step_token_budget(scheduler, None):
        assert vc.step_token_limit(scheduler) == 512


def test_adopt_block_manager_keeps_the_block_pool() -> None:
    scheduler = _stock()
    pool = scheduler.kv_cache_manager.block_pool

    class Marked(KVCacheManager):
        pass

    manager = vc.adopt_block_manager(scheduler, Marked)
    assert type(scheduler.kv_cache_manager) is Marked and manager.block_pool is pool


def test_block_counts_and_request_blocks() -> None:
    scheduler = _stock(num_blocks=50)
    manager = scheduler.kv_cache_manager
    assert vc.usable_blocks(manager) == 49 and vc.free_blocks(manager) == 49
    driver = Driver(scheduler)
    request = make_request(Tier.BATCH, prompt_tokens=40, max_tokens=20)
    driver.add(request)
    driver.step()
    assert len(vc.request_blocks(manager, request.request_id)) == 3
    assert vc.free_blocks(manager) == 46


def _finished_batch_request():
    """A stock scheduler after one 48-token batch request ran to the end; its manager, and the
    blocks the request's prompt held (three full blocks, cached)."""
    scheduler = _stock(num_blocks=50)
    manager = scheduler.kv_cache_manager
    driver = Driver(scheduler)
    request = make_request(Tier.BATCH, prompt_tokens=48, max_tokens=3)
    driver.add(request)
    driver.step()
    blocks = vc.request_blocks(manager, request.request_id)
    driver.run_until_idle()
    return manager, blocks


def test_evict_first_moves_cached_blocks_to_the_front_of_the_free_queue() -> None:
    manager, blocks = _finished_batch_request()
    order = vc.free_queue_order(manager)
    assert order[0] not in {b.block_id for b in blocks}  # vLLM keeps cached prefixes at the back
    assert vc.evict_first(manager, blocks) == 3
    assert set(vc.free_queue_order(manager)[:3]) == {b.block_id for b in blocks}
    assert vc.free_blocks(manager) == 49


def test_cached_free_floor_and_cached_hash() -> None:
    assert vc.cached_free_floor(_stock(num_blocks=50).kv_cache_manager) == 49
    manager, blocks = _finished_batch_request()
    assert [vc.cached_hash(b) is not None for b in blocks] == [True, True, True]
    assert vc.cached_free_floor(manager) == 49 - 3


def test_parse_server_args_accepts_the_slaq_scheduler() -> None:
    args = vc.parse_server_args(["--model", "/tmp/m", "--scheduler-cls", SCHEDULER_CLS, "--scheduling-policy", "priority", "--port", "9"])
    assert args.scheduler_cls == SCHEDULER_CLS and args.scheduling_policy == "priority" and args.port == 9


def test_run_server_runs_vllms_server_coroutine_with_the_parsed_args(monkeypatch) -> None:
    import inspect

    import vllm.entrypoints.launchers.api_server.entry as entry
    import vllm.entrypoints.serve.utils.api_utils as api_utils

    assert inspect.iscoroutinefunction(entry.run_server) and next(iter(inspect.signature(entry.run_server).parameters)) == "args"
    calls: list[object] = []

    async def fake_server(args) -> None:
        calls.append(args)

    monkeypatch.setattr(entry, "run_server", fake_server)
    monkeypatch.setattr(api_utils, "cli_env_setup", lambda: calls.append("env"))
    args = vc.parse_server_args(["--model", "/tmp/m", "--scheduler-cls", SCHEDULER_CLS, "--port", "9"])
    vc.run_server(args)
    assert calls == ["env", args]  # environment set up first, then vLLM's server on an event loop, to its end


def test_admission_blocks_is_what_allocate_slots_wants_for_a_waiting_request() -> None:
    from vllm.v1.request import RequestStatus

    scheduler = _stock(num_blocks=121, max_num_seqs=4, max_model_len=2048, max_num_batched_tokens=2048)
    watermark = scheduler.kv_cache_manager.watermark_blocks  # what vLLM keeps free for admissions (0 by default in 0.32)
    driver = Driver(scheduler)
    driver.add(make_request(Tier.BATCH, prompt_tokens=150, max_tokens=8))  # 10 blocks; its decodes stay in them
    driver.step()
    free = vc.free_blocks(scheduler.kv_cache_manager)
    too_big = make_request(Tier.BATCH, prompt_tokens=BLOCK_SIZE * (free - watermark + 1), max_tokens=1)
    fits = make_request(Tier.BATCH, prompt_tokens=BLOCK_SIZE * (free - watermark), max_tokens=1)
    assert vc.admission_blocks(scheduler, too_big) == free + 1 and vc.admission_blocks(scheduler, fits) == free
    driver.add(too_big)
    assert too_big.request_id not in driver.step().num_scheduled_tokens
    scheduler.finish_requests(too_big.request_id, RequestStatus.FINISHED_ABORTED)
    driver.add(fits)
    assert fits.request_id in driver.step().num_scheduled_tokens


def test_decodes_first_is_a_stable_partition_of_running() -> None:
    scheduler = _stock(max_num_seqs=4, max_num_batched_tokens=64)
    driver = Driver(scheduler)
    prefill = make_request(Tier.BATCH, prompt_tokens=300)
    decodes = [make_request(Tier.BATCH, prompt_tokens=16, max_tokens=50) for _ in range(2)]
    driver.add(decodes[0])
    driver.step()
    driver.add(prefill, decodes[1])
    driver.step()
    driver.step()
    assert vc.is_prefilling(prefill) and not vc.is_prefilling(decodes[0])
    assert vc.prefill_tokens_left(prefill) == 300 - prefill.num_computed_tokens > 0
    assert vc.prefill_tokens_left(decodes[0]) == 1  # a decode: its last sampled token
    scheduler.running = [prefill, *decodes]
    vc.decodes_first(scheduler)
    assert scheduler.running == [*decodes, prefill]


def test_hold_back_leaves_requests_out_of_one_step_and_restores_them() -> None:
    scheduler = _stock(max_num_seqs=2, max_num_batched_tokens=64)
    driver = Driver(scheduler)
    prefill = make_request(Tier.BATCH, prompt_tokens=300)
    driver.add(prefill)
    driver.step()
    waiting = make_request(Tier.CRITICAL, prompt_tokens=30)
    driver.add(waiting)
    with vc.hold_back(scheduler, [prefill]):
        assert scheduler.max_num_active_reqs == 1 and prefill not in scheduler.running
        output = scheduler.schedule()
    driver.answer(output)
    assert prefill.request_id not in output.num_scheduled_tokens and waiting.request_id in output.num_scheduled_tokens
    assert vc.total_scheduled_tokens(output) == 30
    assert scheduler.max_num_active_reqs == 2 and prefill in scheduler.running


# -- the KV connector touch points (slaq.engine.kv_security) --------------------------------------
def test_scheduled_blocks_reports_new_requests_whole_and_running_ones_by_appended_blocks() -> None:
    scheduler = _stock()
    driver = Driver(scheduler)
    request = make_request(Tier.BATCH, prompt_tokens=2 * BLOCK_SIZE, max_tokens=BLOCK_SIZE + 2)
    driver.add(request)
    first = driver.step()
    [(rid, blocks, computed, scheduled, replaces)] = list(vc.scheduled_blocks(first))
    assert (rid, computed, scheduled, replaces) == (request.request_id, 0, 2 * BLOCK_SIZE, True)
    assert blocks == [b.block_id for b in vc.request_blocks(scheduler.kv_cache_manager, request.request_id)]
    grown = []
    for _ in range(BLOCK_SIZE + 1):
        output = driver.step()
        grown += [b for r, b, _, _, rep in vc.scheduled_blocks(output) if r == request.request_id and not rep]
        if request.is_finished() or not scheduler.running:
            break
    assert any(grown), "a decode past the prompt's blocks appends a block"


def test_skip_prefix_cache_reads_sets_vllms_per_request_switch() -> None:
    request = make_request(Tier.BATCH)
    vc.skip_prefix_cache_reads(request)
    assert request.skip_reading_prefix_cache is True


def test_evict_cached_blocks_drops_prefix_cache_entries() -> None:
    scheduler = _stock()
    driver = Driver(scheduler)
    request = make_request(Tier.BATCH, prompt_tokens=2 * BLOCK_SIZE, max_tokens=2)
    driver.add(request)
    driver.run_until_idle()
    cached = [b for b in scheduler.kv_cache_manager.block_pool.blocks if vc.cached_hash(b) is not None]
    assert cached
    vc.evict_cached_blocks(scheduler.kv_cache_manager, [b.block_id for b in cached])
    assert all(vc.cached_hash(b) is None for b in cached)


def test_kv_connector_is_none_without_a_transfer_config_and_block_geometry_reads() -> None:
    scheduler = _stock()
    assert vc.kv_connector(scheduler) is None
    config = scheduler.kv_cache_config
    assert vc.kv_cache_block_count(config) == config.num_blocks
    assert vc.kv_bytes_per_block(config) >= 1
    assert vc.config_block_size(scheduler.vllm_config) == BLOCK_SIZE
    assert vc.failed_block_ids(None) == set()


def _answer(scheduler: AsyncScheduler, output, invalid_block_ids: set[int] = frozenset(), token: int = 7) -> list[int]:
    """The model output of a step (one `token` per request past its prompt), with blocks that failed
    to load; returns the tokens delivered."""
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    sampled = [[] if scheduler.requests[r].is_prefill_chunk else [token] for r in ids]
    runner_output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
                                      kv_connector_output=KVConnectorOutput(invalid_block_ids=set(invalid_block_ids)))
    delivered: list[int] = []
    for engine_outputs in scheduler.update_from_output(output, runner_output).values():
        for out in engine_outputs.outputs:
            delivered.extend(out.new_token_ids)
    return delivered


def _load_failure_with_the_next_step_in_flight(scheduler_cls: type) -> tuple[AsyncScheduler, Request, list[int]]:
    """A request's whole prompt is scheduled in one step whose KV load fails (its first block),
    while the next step, a decode sampled from that bad KV, is already in flight (async scheduling)."""
    scheduler = build_scheduler(scheduler_cls, max_num_seqs=1)
    request = make_request(Tier.BATCH, prompt_tokens=40, max_tokens=5)
    scheduler.add_request(request)
    first = scheduler.schedule()
    second = scheduler.schedule()  # in flight while the first step's output comes back
    (blocks,) = scheduler.kv_cache_manager.get_block_ids(request.request_id)
    delivered = _answer(scheduler, first, invalid_block_ids={blocks[0]}, token=666)
    delivered += _answer(scheduler, second, token=666)
    return scheduler, request, delivered


def test_recomputes_load_failures_finishes_the_request_and_drops_output_sampled_from_the_bad_kv() -> None:
    scheduler, request, delivered = _load_failure_with_the_next_step_in_flight(type("Fixed", (vc.RecomputesLoadFailures,), {}))
    assert delivered == [] and request.num_output_placeholders == 0
    recompute = scheduler.schedule()
    assert recompute.num_scheduled_tokens[request.request_id] == 40  # from the failed first block, prompt only
    delivered += _answer(scheduler, recompute)
    for _ in range(20):
        if not scheduler.has_requests():
            break
        delivered += _answer(scheduler, scheduler.schedule())
    assert not scheduler.has_requests() and delivered == [7] * 5


def test_stock_async_scheduler_strands_or_serves_bad_output_after_a_load_failure() -> None:
    """Negative control for the fix above: vLLM 0.32's own AsyncScheduler (issue 45138)."""
    scheduler, request, delivered = _load_failure_with_the_next_step_in_flight(AsyncScheduler)
    for _ in range(20):
        if not scheduler.has_requests():
            break
        delivered += _answer(scheduler, scheduler.schedule())
    assert scheduler.has_requests() or delivered != [7] * 5


def test_set_priority_is_what_vllms_ordering_reads() -> None:
    request = make_request(Tier.BATCH)
    vc.set_priority(request, 7)
    assert request.priority == 7


def test_slaq_scheduler_leaves_vllms_scheduling_policy_attribute_alone() -> None:
    # vLLM's running loop reads `self.policy` to pick a KV-exhaustion victim (lowest priority under
    # PRIORITY, else the last admitted); SLAScheduler must not shadow it with its own policy.
    scheduler = build_scheduler()
    assert scheduler.policy is SchedulingPolicy.PRIORITY


def test_admitted_ids_are_first_steps_and_resumptions_after_a_preemption() -> None:
    scheduler = _stock(max_num_seqs=1)
    driver = Driver(scheduler)
    request = make_request(Tier.BATCH, max_tokens=50)
    driver.add(request)
    assert vc.admitted_ids(driver.step()) == [request.request_id]  # its first step
    assert vc.admitted_ids(driver.step()) == []  # a running decode is not admitted again
    vc.preempt(scheduler, request, 0.0)
    assert vc.admitted_ids(driver.step()) == [request.request_id]  # resumed


class _Freed(vc.ReportsFreedRequests):
    freed: list = []

    def request_freed(self, request) -> None:
        self.freed.append((request.request_id, vc.finish_reason(request), request.request_id in self.requests))


def test_reports_freed_requests_calls_back_once_per_finished_or_aborted_request_with_its_finish_reason() -> None:
    from vllm.v1.request import RequestStatus

    scheduler = build_scheduler(_Freed, max_num_seqs=1)
    scheduler.freed = []
    driver = Driver(scheduler)
    done, aborted = make_request(Tier.BATCH, max_tokens=3), make_request(Tier.BATCH, max_tokens=30)
    driver.add(done, aborted)
    assert vc.finish_reason(done) is None  # not finished yet
    driver.step()
    scheduler.finish_requests(aborted.request_id, RequestStatus.FINISHED_ABORTED)
    driver.run_until_idle()
    assert scheduler.freed == [(aborted.request_id, "abort", False), (done.request_id, "length", False)]
