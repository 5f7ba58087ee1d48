"""The engine's audit line (engine/src/slaq/engine/request_log.py) on the real vLLM 0.32 scheduler machinery (no model):
one line per request that leaves the scheduler, with the sidecar's request id, its queue waits
and its preemptions by reason; nothing is kept once it has left."""

from __future__ import annotations

import io
import json

from vllm.v1.request import RequestStatus

from slaq.api.common import Tier
from slaq.engine import vllm_compat as vc
from slaq.engine.preemption import REASON_BATCH_FULL, REASON_KV_EXHAUSTED
from slaq.engine.request_log import EVENT, REQUEST_LOG_ENV, RequestLog

from tests.engine.harness import Driver, build_scheduler, make_request


def logged(driver: Driver) -> io.StringIO:
    buffer = io.StringIO()
    driver.scheduler.request_log = RequestLog("json", buffer)
    return buffer


def lines(buffer: io.StringIO) -> dict[str, dict]:
    """The lines by the sidecar's request id (each request below is one engine request)."""
    records = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert all(r["event"] == EVENT for r in records)
    by_id = {r["request_id"]: r for r in records}
    assert len(by_id) == len(records), "one line per request"
    return by_id


def _preemptions(driver: Driver, request) -> int:
    return sum(request.request_id in step for step in driver.preempted)


def test_a_request_preempted_for_kv_carries_its_preemptions_and_waits_and_the_others_none() -> None:
    # 14 blocks of 16 tokens: two 48-token prompts decoding 100 tokens each cannot both fit, so
    # vLLM's own KV-exhaustion preemption (inside schedule()) preempts one of them.
    driver = Driver(build_scheduler(max_num_seqs=2, num_blocks=14))
    buffer = logged(driver)
    first = make_request(Tier.BATCH, tenant="free", prompt_tokens=48, max_tokens=100, request_id="sidecar-1")
    second = make_request(Tier.BATCH, tenant="free", prompt_tokens=48, max_tokens=100, request_id="sidecar-2")
    driver.add(first, second)
    driver.run_until_idle()
    records = lines(buffer)
    assert set(records) == {"sidecar-1", "sidecar-2"}
    counts = {r.request_id: _preemptions(driver, r) for r in (first, second)}
    assert sum(counts.values()) >= 1, "the cache did run out"
    for request, record in zip((first, second), (records["sidecar-1"], records["sidecar-2"])):
        assert record["engine_request_id"] == request.request_id and (record["tenant"], record["tier"]) == ("free", "batch")
        assert record["preemptions"] == counts[request.request_id]
        assert record["preemptions_by_reason"] == ({REASON_KV_EXHAUSTED: counts[request.request_id]} if counts[request.request_id] else {})
        assert record["finish"] == "length" and record["output_tokens"] == 100 and record["prompt_tokens"] == 48
        assert record["queue_wait_s"] >= 0.0 and record["engine_s"] >= record["queue_wait_s"]
        assert record["requeue_wait_s"] >= 0.0 and (record["requeue_wait_s"] > 0.0) == (counts[request.request_id] > 0)
        assert record["kv_erased_blocks"] is None and record["kv_swap_out_blocks"] is None  # no KV connector here
        assert vc.attached_info(request).facts is None  # dropped when it left


def test_an_urgent_preemption_is_logged_with_its_reason() -> None:
    driver = Driver(build_scheduler(max_num_seqs=4))
    buffer = logged(driver)
    batch = [make_request(Tier.BATCH, tenant="bulk", max_tokens=60, request_id=f"bulk-{i}") for i in range(4)]
    driver.add(*batch)
    for _ in range(3):
        driver.step()
    urgent = make_request(Tier.CRITICAL, tenant="vip", ttft_ms=200.0, request_id="vip-1")
    driver.add(urgent)
    victims = driver.step().preempted_req_ids
    assert len(victims) == 1
    driver.run_until_idle()
    records = lines(buffer)
    victim = next(r for r in batch if r.request_id in victims)
    assert records[f"bulk-{batch.index(victim)}"]["preemptions_by_reason"] == {REASON_BATCH_FULL: 1}
    assert records["vip-1"]["preemptions"] == 0 and records["vip-1"]["tier"] == "critical"
    assert sum(r["preemptions"] for r in records.values()) == 1


def test_a_request_aborted_while_waiting_gets_its_line_with_the_wait_so_far() -> None:
    driver = Driver(build_scheduler(max_num_seqs=1))
    buffer = logged(driver)
    running = make_request(Tier.BATCH, max_tokens=50, request_id="runs")
    waiting = make_request(Tier.BATCH, max_tokens=50, request_id="leaves")
    driver.add(running, waiting)
    driver.step()
    driver.scheduler.finish_requests(waiting.request_id, RequestStatus.FINISHED_ABORTED)  # the client went away
    driver.run_until_idle()
    records = lines(buffer)
    assert records["leaves"]["finish"] == "abort" and records["leaves"]["output_tokens"] == 0
    assert records["leaves"]["queue_wait_s"] >= 0.0 and records["runs"]["finish"] == "length"


def test_off_writes_nothing_and_keeps_nothing(monkeypatch) -> None:
    monkeypatch.delenv(REQUEST_LOG_ENV, raising=False)
    driver = Driver(build_scheduler())
    assert not driver.scheduler.request_log.enabled  # an embedded scheduler (simulator, benchmarks) logs nothing
    request = make_request(Tier.STANDARD, max_tokens=4, request_id="quiet")
    driver.add(request)
    assert vc.attached_info(request).facts is None
    driver.run_until_idle()
    monkeypatch.setenv(REQUEST_LOG_ENV, "json")
    assert RequestLog.from_environment().enabled  # what `slaq engine` sets
