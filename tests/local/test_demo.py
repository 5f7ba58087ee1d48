"""`slaq up --demo`'s parts without an engine: workload, objectives, scenario 4.5's arithmetic and
order, the client, the sidecar's histogram, the table, the JSON and the PNG."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import datetime
from pathlib import Path

import pytest

from slaq.api.common import Tier
from slaq.cli import build_parser, main, repo_root
from slaq.local import loadgen
from slaq.local.demo import (
    SCENARIO, VIP_SAMPLES, Calibration, DemoOptions, Unloaded, demo_engine_args, describe_objectives, load_plan, loaded_workload, mix_burst,
    scaled_tenant,
)
from slaq.local.demo_report import (
    TenantFigures, bucket_delta, buckets_by_label, client_late_ms, demo_json, histogram_quantile, load_table, order_text, refusal_lines, scenario_block, write_png,
)
from slaq.local.loadgen import Outcome, Plan, PlannedRequest, request_body, stream_one
from slaq.local.scenario45 import KV_BLOCKS, REQUESTS, KvPlan, ScenarioRun, Sized
from slaq.local.tenants import local_pool, plan_local_table, read_tenants
from tests.support.sse_server import chunk, serve, sse_event, stream_sse


def test_the_readme_first_command_installs_and_runs_the_demo() -> None:
    text = (repo_root() / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).splitlines()
    assert block[0].split("#")[0].strip() == "scripts/setup.sh && slaq up --demo"
    assert block[1].split("#")[0].strip() == "scripts/setup.sh && scripts/test.sh"
    args = build_parser().parse_args(["up", "--demo"])
    assert args.demo and args.handler.__name__ == "_up" and not args.quick and args.json_path is None


def test_quick_and_json_are_demo_options(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["up", "--demo", "--quick", "--json", "out/f.json"])
    assert args.quick and args.json_path == Path("out/f.json")
    assert main(["up", "--quick"]) == 2
    assert "--quick and --json go with --demo" in capsys.readouterr().err
    quick = DemoOptions.quick(tenants=(), json_path=Path("f"))
    assert quick.vip_samples < VIP_SAMPLES == DemoOptions(tenants=()).vip_samples and quick.json_path == Path("f")


def test_the_users_engine_flags_come_after_the_demos_and_vllms_after_the_separator() -> None:
    assert demo_engine_args(["--max-num-seqs", "4", "--", "--seed", "1"]) == (
        "--max-num-seqs", "8", "--max-model-len", "768", "--max-num-seqs", "4",
        "--", "--block-size", "32", "--num-gpu-blocks-override", str(KV_BLOCKS), "--stream-interval", "8", "--seed", "1")


def test_the_loaded_run_has_exactly_the_vip_samples_asked_for_at_the_rate() -> None:
    arrivals = loaded_workload(8.0, 100, seed=1)
    vip = SCENARIO[0]
    assert sum(p is vip for _, p in arrivals) == 100 and arrivals[-1][1] is vip
    assert all(0 < a < b for (a, _), (b, _) in zip(arrivals, arrivals[1:]))
    assert len(arrivals) / arrivals[-1][0] == pytest.approx(8.0, rel=0.25)  # Poisson at 8/s
    for profile in SCENARIO:
        assert abs(sum(p is profile for _, p in arrivals) / len(arrivals) - profile.share) < 0.08
    assert loaded_workload(8.0, 100, seed=1) == arrivals  # seeded: both systems see the same traffic
    burst = mix_burst(40)
    assert len(burst) == 40
    for profile in SCENARIO:  # every prefix keeps the mix: completions do not come in clumps by tenant
        for n in (4, 12, 40):
            assert abs(sum(p is profile for p in burst[:n]) - profile.share * n) <= 1


def test_each_system_gets_prompts_of_its_own() -> None:
    workload = loaded_workload(8.0, 5, seed=1)
    stock, slaq = (load_plan("http://x", "m", workload, {"A": "a", "B": "b", "C": "c"}, seed) for seed in (0, 10_000))
    assert [r.at for r in stock.requests] == [r.at for r in slaq.requests]
    assert all(request_body("m", s)["prompt"] != request_body("m", q)["prompt"] for s, q in zip(stock.requests, slaq.requests))
    assert [r.key for r in stock.requests] == [{"A": "a", "B": "b", "C": "c"}[p.letter] for _, p in workload]


def test_capacity_is_the_burst_steady_rate_without_its_ramp_and_tail() -> None:
    from slaq.local.demo import steady_rate

    ends = [0.5, 0.9] + [1.0 + i * 0.1 for i in range(12)] + [3.0, 4.0]  # slow start, 10/s, a long tail
    assert steady_rate(ends) == pytest.approx(10.0)
    assert steady_rate([1.0] * 4) is None and steady_rate([1.0] * 10) is None


def test_prompts_keep_the_reports_proportions() -> None:
    assert [p.prompt_tokens * 10 for p in SCENARIO] == [p.report_prompt_tokens for p in SCENARIO] == [1000, 5000, 100]


def test_objectives_are_the_report_scaled_by_three_times_the_vip_p90_and_never_under_three_times_their_own() -> None:
    vip, standard, free = SCENARIO
    stock = Unloaded({"A": 0.02, "B": 0.05, "C": 0.01}, {"A": 0.03, "B": 0.10, "C": 0.02})
    calibration = Calibration({"stock": stock}, 5.0)
    assert calibration.scale == pytest.approx(3 * 0.03 / 0.050)
    assert calibration.objective_s(vip) == pytest.approx(0.09)  # 50 ms × 1.8 = 3 × its p90
    assert calibration.objective_s(standard) == pytest.approx(0.36)  # 200 ms × 1.8 > 3 × 0.10
    assert calibration.objective_s(free) is None
    slow_b = Calibration({"stock": Unloaded(stock.p50_s, {**stock.p90_s, "B": 0.15})}, 5.0)
    assert slow_b.objective_s(standard) == pytest.approx(0.45)  # 3 × its own p90 is larger


def test_a_fast_machine_never_tightens_the_reports_objectives() -> None:
    vip, standard, _ = SCENARIO
    fast = Calibration({"stock": Unloaded({"A": 0.006, "B": 0.02, "C": 0.005}, {"A": 0.009, "B": 0.03, "C": 0.008})}, 5.0)
    assert fast.scale == 1.0  # 3 × 9 ms / 50 ms would be 0.54
    assert fast.objective_s(vip) == pytest.approx(0.050) and fast.objective_s(standard) == pytest.approx(0.200)
    assert "max(1, 3 × 9 ms" in describe_objectives(fast, {"A": 0.050, "B": 0.200, "C": None})


def test_objectives_leave_the_slower_system_its_margin_too() -> None:
    stock = Unloaded({"A": 0.02, "B": 0.05, "C": 0.01}, {"A": 0.03, "B": 0.10, "C": 0.02})
    slaq = Unloaded({"A": 0.03, "B": 0.06, "C": 0.02}, {"A": 0.05, "B": 0.09, "C": 0.03})
    both = Calibration({"stock": stock, "slaq": slaq}, 5.0)
    assert both.p90_s("A") == 0.05 and both.p90_s("B") == 0.10
    assert both.objective_s(SCENARIO[0]) == pytest.approx(0.15) and both.scale == pytest.approx(3.0)


def test_demo_tenants_get_the_scaled_ttft_no_tpot_and_no_quotas() -> None:
    local = read_tenants([repo_root() / "crds" / "examples"])
    vip = next(t for t in local.tenants if t.spec.tier is Tier.CRITICAL)
    scaled = scaled_tenant(vip, 0.1234)
    assert scaled.spec.objectives.ttft_ms == 123.4 and scaled.spec.objectives.tpot_ms is None
    assert scaled.spec.quotas.requests_per_minute is None and scaled.spec.quotas.max_concurrency is None
    assert scaled.spec.quotas.kv_cache_share == 1.0 != vip.spec.quotas.kv_cache_share
    assert vip.spec.objectives.ttft_ms == 50  # the manifest's tenant is left as it was
    local.tenants[:] = [scaled if t is vip else t for t in local.tenants]
    entry = next(e for e in plan_local_table(local, local_pool("slaq-tiny")).tenants if e.name == vip.metadata.name)
    assert entry.ttft_ms == 123.4 and entry.share.requests_per_minute is None


# ---------------------------------------------------------------- scenario 4.5


def test_the_kv_plan_leaves_room_for_a_and_c_but_not_b() -> None:
    plan = KvPlan()
    assert plan.problems() == []
    a, b, c = (REQUESTS[x] for x in "ABC")
    assert a.blocks_when_done() + c.blocks_when_done() <= plan.free_blocks(background_done=True)
    assert b.blocks_at_admission() > plan.free_blocks(background_done=False)
    assert KvPlan(kv_blocks=KV_BLOCKS + 8).problems() == ["B fits beside the background: nothing waits"]
    assert "A and C do not both fit beside the background" in KvPlan(kv_blocks=34).problems()
    small_first = KvPlan(background=(*KvPlan().background, Sized(32, 16)))  # it frees only two blocks when it ends
    assert small_first.problems() == ["B does not fit even once one background request is done",
                                      "C cannot finish before a background request does: serving it first would delay B"]
    short = KvPlan(background=(Sized(544, 16),) * 3)  # done in 16 steps; C takes 17 (its prefill and 16 tokens)
    assert short.decode_margin() == -1
    assert short.problems() == ["C cannot finish before a background request does: serving it first would delay B"]


def test_no_two_scenario_runs_send_a_prompt_block_twice() -> None:
    from slaq.local.demo import scenario_seed
    from slaq.local.scenario45 import BACKGROUND, BLOCK_SIZE, scenario_requests

    first_blocks = []
    for run in (1, 2, 3):
        for request in scenario_requests(scenario_seed(45, run), {x: "k" for x in "ABC"}, {x: None for x in "ABC"}, "k", None):
            first_blocks.append(tuple(request_body("m", request)["prompt"][:BLOCK_SIZE]))
    assert len(first_blocks) == 3 * (len(BACKGROUND) + 3) == len(set(first_blocks))


def _outcome(letter: str, first_token_at: float | None, finished: bool = True) -> Outcome:
    return Outcome(letter, ttft_s=None if first_token_at is None else first_token_at - 0.01,
                   first_token_at=first_token_at, finished=finished, status=200)


def test_the_order_is_the_first_tokens_order_and_close_ones_started_together() -> None:
    run = ScenarioRun("slaq", {"A": _outcome("A", 0.050), "B": _outcome("B", 1.2), "C": _outcome("C", 0.060)})
    assert run.order == ["A", "C", "B"] and run.groups == [["A", "C"], ["B"]]
    assert order_text(run.groups) == "[A C], B"
    late = ScenarioRun("fcfs", {"A": _outcome("A", None, finished=False), "B": _outcome("B", 1.0), "C": _outcome("C", 2.0)})
    assert late.order == ["B", "C", "A"] and late.groups == [["B"], ["C"], ["A"]]
    data = late.as_json()
    assert data["order"] == ["B", "C", "A"] and data["report_order"] == ["B", "A", "C"] and data["finished"]["A"] is False
    block = scenario_block([run, late])
    assert "[A C], B" in block and "A and C first" in block and "not finished: A" in block


def test_the_engine_order_comes_from_the_engines_request_log_whatever_the_client_saw(tmp_path: Path) -> None:
    from slaq.local.demo import engine_started

    def line(request_id: str, arrived: str, queue_wait_s: float) -> str:
        return json.dumps({"time": arrived, "event": "engine_request", "request_id": request_id, "tenant": "t", "tier": "standard",
                           "queue_wait_s": queue_wait_s, "engine_s": 0.3})

    log = tmp_path / "engine-slaq.log"
    log.write_text("\n".join([
        "INFO:     127.0.0.1:43110 - \"POST /v1/completions HTTP/1.1\" 200 OK",
        line("other", "2026-12-02T22:12:35.000Z", 0.5),
        line("rid-a", "2026-12-02T22:12:35.480Z", 0.001),
        line("rid-b", "2026-12-02T22:12:35.479Z", 0.200),  # waited for the background's blocks
        '{"event": "engine_request", "request_id": "rid-c"',  # a torn line is skipped
        line("rid-c", "2026-12-02T22:12:35.481Z", 0.0005),
    ]) + "\n")
    started = engine_started(log, {"A": "rid-a", "B": "rid-b", "C": "rid-c"}, timeout_s=0.0)
    assert set(started) == {"A", "B", "C"} and started["B"] - started["A"] == pytest.approx(0.198, abs=1e-6)
    # the client got all three first tokens in one go (a stall on the way out); the engine did not start them so
    run = ScenarioRun("slaq", {"A": _outcome("A", 0.260), "B": _outcome("B", 0.2601), "C": _outcome("C", 0.2602)}, engine_started=started)
    assert run.groups == [["A", "B", "C"]] and run.engine_groups == [["A", "C"], ["B"]]
    assert run.as_json()["engine_together"] == [["A", "C"], ["B"]]
    missing = engine_started(log, {"A": "rid-a", "B": "rid-x", "C": "rid-c"}, timeout_s=0.0)
    assert set(missing) == {"A", "C"}
    assert ScenarioRun("slaq", run.outcomes, engine_started=missing).engine_groups is None
    assert ScenarioRun("fcfs", run.outcomes).as_json()["engine_together"] is None  # stock vLLM keeps no such log


def test_the_client_keeps_the_answers_request_id() -> None:
    async def handler(body: dict, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nX-Request-Id: 3f2a9c\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(chunk(sse_event("x")) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    async def go() -> Outcome:
        server, url, _ = await serve(handler)
        async with server:
            return await stream_one(url, "m", PlannedRequest(0.0, "A", "k", 4, 2, 1), time.monotonic())

    outcome = asyncio.run(go())
    assert outcome.finished and outcome.request_id == "3f2a9c"


# ---------------------------------------------------------------- the client


def test_stream_one_times_the_first_chunk_and_sends_priority_only_when_asked() -> None:
    async def go(status: int, priority: int | None) -> tuple[Outcome, list[dict]]:
        async def handler(body: dict, writer: asyncio.StreamWriter) -> None:
            if status != 200:
                writer.write(b"HTTP/1.1 %d Refused\r\ncontent-length: 2\r\n\r\n{}" % status)
                return
            # the first token's text may be empty: it still counts
            await stream_sse(writer, [chunk(sse_event("")), chunk(sse_event("x")), chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"])

        server, url, seen = await serve(handler)
        async with server:
            event = asyncio.Event()
            outcome = await stream_one(url, "m", PlannedRequest(0, "A", "k", 7, 3, 1, priority), time.monotonic(), event)
            assert event.is_set() == (status == 200)
        return outcome, [s["body"] for s in seen]

    ok, seen = asyncio.run(go(200, 2))
    assert ok.finished and ok.status == 200 and ok.ttft_s is not None and ok.first_token_at is not None and ok.ended_at is not None
    assert seen[0]["priority"] == 2 and len(seen[0]["prompt"]) == 7 and seen[0]["max_tokens"] == seen[0]["min_tokens"] == 3
    refused, seen = asyncio.run(go(429, None))
    assert not refused.finished and refused.status == 429 and refused.ttft_s is None and "priority" not in seen[0]


def test_the_load_generator_writes_its_results(tmp_path: Path) -> None:
    plan = Plan("http://127.0.0.1:9", "m", [PlannedRequest(0.0, "B", "k", 4, 2, 1)])  # nothing listens: a failed request
    (tmp_path / "plan.json").write_text(plan.to_json())
    assert Plan.from_json(plan.to_json()) == plan
    assert loadgen.main([str(tmp_path / "plan.json"), str(tmp_path / "out.json")]) == 0
    [row] = json.loads((tmp_path / "out.json").read_text())
    assert row["letter"] == "B" and row["finished"] is False and row["status"] is None and row["late_s"] >= 0.0


def test_a_client_that_waits_for_the_cpu_shows_it_as_requests_sent_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two requests planned for the same moment; the first holds the client's event loop for 0.2 s
    (as a client without CPU would be held): the second goes out late, and says so."""
    async def hogging(url: str, model: str, request: PlannedRequest, origin: float, **_: object) -> Outcome:
        outcome = Outcome(request.letter, sent_at=time.monotonic() - origin)
        if request.letter == "A":
            time.sleep(0.2)  # blocks the loop
        return outcome

    monkeypatch.setattr(loadgen, "stream_one", hogging)
    plan = Plan("http://127.0.0.1:9", "m", [PlannedRequest(0.0, "A", "k", 4, 2, 1), PlannedRequest(0.0, "C", "k", 4, 2, 2)])
    first, second = asyncio.run(loadgen.replay(plan))
    assert first.late_s < 0.1 and second.late_s >= 0.2
    rows = {"A": TenantFigures(None, [first]), "C": TenantFigures(None, [second])}
    assert client_late_ms(rows, 100) >= 200.0 and rows["C"].as_json()["client_late_p99_ms"] >= 200.0


def test_the_load_generator_runs_in_a_process_of_its_own(tmp_path: Path) -> None:
    plan = Plan("http://127.0.0.1:9", "m", [PlannedRequest(0.0, "A", "k", 4, 2, 1), PlannedRequest(0.01, "C", "k", 4, 2, 2)])
    seen: list[tuple[int, int]] = []
    outcomes = loadgen.run_in_subprocess(plan, tmp_path, "t", lambda done, total: seen.append((done, total)))
    assert [o.letter for o in outcomes] == ["A", "C"] and not any(o.finished for o in outcomes)
    assert (tmp_path / "t-results.json").exists() and seen[-1] == (2, 2)


# ---------------------------------------------------------------- the sidecar's histogram, the table, the files


def test_sidecar_percentiles_come_from_its_real_histogram_minus_the_earlier_reading() -> None:
    from slaq.sidecar.metrics import SidecarMetrics

    metrics = SidecarMetrics(depth=lambda: {}, risk=lambda: 0.0, in_flight=lambda: 0)
    metrics.ttft.labels("vip", "critical").observe(5.0)  # before the run: must not count
    before = buckets_by_label(metrics.render().decode(), "slaq_ttft_seconds", "tenant")
    for value in [0.04] * 90 + [0.15] * 10:
        metrics.ttft.labels("vip", "critical").observe(value)
    after = buckets_by_label(metrics.render().decode(), "slaq_ttft_seconds", "tenant")
    run = bucket_delta(after["vip"], before["vip"])
    assert run[-1][1] == 100
    assert histogram_quantile(0.5, run) == pytest.approx(0.025 + 0.025 * 50 / 90)  # in the (25 ms, 50 ms] bucket
    assert histogram_quantile(0.99, run) == pytest.approx(0.1 + 0.1 * 9 / 10)  # in the (100 ms, 200 ms] bucket
    assert histogram_quantile(1.0, bucket_delta(after["vip"], None)) > 3.0  # without the delta, the 5 s one is in
    assert histogram_quantile(0.5, []) is None


def test_attainment_counts_refusals_and_unfinished_streams_as_misses() -> None:
    row = TenantFigures(0.1, [Outcome("A", status=200, ttft_s=0.05, finished=True), Outcome("A", status=429),
                              Outcome("A", status=200, ttft_s=0.05, finished=False), Outcome("A", status=200, ttft_s=0.2, finished=True)])
    assert row.attainment == 0.25 and row.sent == 4 and row.done == 2 and row.refused == 1
    assert refusal_lines({"slaq": {"A": row}, "stock": {"A": TenantFigures(0.1, row.outcomes[:1])}}) == \
        "  slaq: 1 of A's 4 requests refused (HTTP 429)"
    assert TenantFigures(None, row.outcomes).attainment is None


def _load() -> dict[str, dict[str, TenantFigures]]:
    def rows(ttft: float, sidecar: list | None) -> dict[str, TenantFigures]:
        return {x: TenantFigures(goal, [Outcome(x, status=200, ttft_s=ttft * (i + 1) / 10, finished=True) for i in range(10)], sidecar)
                for x, goal in (("A", 0.09), ("B", 0.36), ("C", None))}

    return {"stock": rows(1.0, None), "slaq": rows(0.05, [(0.05, 8.0), (0.1, 10.0), (float("inf"), 10.0)])}


def test_the_table_shows_both_systems_client_and_sidecar_figures() -> None:
    table = load_table({"stock vLLM (FCFS)": _load()["stock"], "slaq": _load()["slaq"]}, {p.letter: p.label for p in SCENARIO})
    rows = {line.split("│")[0].split("  ")[0].strip(): line for line in table.splitlines()[3:]}
    assert re.search(r"A \(VIP\)\s+90 │\s+500\s+1000\s+—\s+0%\s+10/10 │\s+25\s+50\s+98\s+100%\s+10/10", rows["A (VIP)"])
    assert "no SLO" in rows["C (free)"]


def test_the_json_has_the_keys_the_issue_names_and_the_png_is_written(tmp_path: Path) -> None:
    run = ScenarioRun("slaq", {"A": _outcome("A", 0.05), "B": _outcome("B", 1.0), "C": _outcome("C", 0.2)})
    report = json.loads(json.dumps(demo_json([run], _load(), {"png": "x"})))
    assert report["scenario_45"]["slaq"]["order"] == ["A", "C", "B"]
    for system in ("stock", "slaq"):
        for letter in "ABC":
            assert {"attainment", "ttft_p50_ms", "ttft_p99_ms", "sidecar_ttft_p99_ms", "done", "sent"} <= set(report["load"][system][letter])
    assert report["load"]["slaq"]["A"]["attainment"] == 1.0 and report["load"]["stock"]["A"]["sidecar_ttft_p99_ms"] is None
    png = write_png(_load(), {"A": "critical", "B": "standard", "C": "batch"}, tmp_path / "p.png", "t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _scenario_on_a_fake_engine(first_token_after_s: dict[int, float], stall_s: dict[int, float]) -> ScenarioRun:
    """Scenario 4.5 against an upstream keyed by prompt length: background (BACKGROUND's prompt length) decodes for
    0.3 s; a request of length n answers its first token after first_token_after_s[n]; stall_s[n]
    holds the (shared) event loop up, the client's sends included, when that request is read."""
    from slaq.local.scenario45 import BACKGROUND, run_scenario

    background = BACKGROUND[0].prompt_tokens

    async def handler(body: dict, writer: asyncio.StreamWriter) -> None:
        n = len(body["prompt"])
        time.sleep(stall_s.get(n, 0.0))  # a synchronous hold-up of the event loop
        await asyncio.sleep(0.0 if n == background else first_token_after_s[n])
        await stream_sse(writer, [chunk(sse_event("x"))])
        await asyncio.sleep(0.3 if n == background else 0.0)
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    async def go() -> ScenarioRun:
        server, url, _ = await serve(handler)
        async with server:
            return await run_scenario("slaq", url, "m", {x: "k" for x in "ABC"}, {x: None for x in "ABC"}, 1, "k")

    return asyncio.run(go())


def test_under_a_hold_the_trio_reaches_the_engine_before_it_continues_and_ttft_counts_from_there() -> None:
    """The demo's hold (the engine core stopped): the background arrives while the engine is stopped
    (one step admits all of it); A, B and C are sent to the running server inside the second hold
    (no sidecar stop: its clock counts from their receipt), the fake engine answers nothing of them
    until that hold ends, and the background keeps its stream."""
    from contextlib import contextmanager

    from slaq.local.scenario45 import BACKGROUND, HANDOVER_S, SETTLE_S, KvPlan, run_scenario

    background = BACKGROUND[0].prompt_tokens
    first_token_after_s = {100: 0.01, 500: 0.2, 10: 0.06}
    seen: list[int] = []
    background_stopped: list[bool] = []  # for each background request: was the engine stopped when it arrived?
    trio_held: list[bool] = []  # for each of A, B and C: was the engine stopped when it arrived?

    async def go() -> ScenarioRun:
        released = asyncio.Event()

        class Hold:
            stops, inside = 0, False

            async def arm(self) -> None:
                pass

            async def holding(self, prompt_tokens: int, blocks: int, max_decoded: int, timeout_s: float) -> None:
                assert prompt_tokens == 3 * background and blocks == 3 * BACKGROUND[0].blocks_at_admission()
                assert max_decoded == 3 * KvPlan().decode_margin() == 3 * (64 - 17)  # C's 16 tokens and its prefill step
                assert self.stops == 1 and not self.inside  # after the background's hold
                await asyncio.sleep(0.05)  # the fake background streams for 0.3 s

            @contextmanager
            def stopped(self):
                self.stops += 1
                self.inside = True
                yield
                self.inside = False
                if self.stops == 2:  # the trio's hold
                    released.set()

        hold = Hold()

        async def handler(body: dict, writer: asyncio.StreamWriter) -> None:
            n = len(body["prompt"])
            if n == background:
                background_stopped.append(hold.inside)
            else:
                seen.append(n)
                trio_held.append(hold.inside and hold.stops == 2)
                await released.wait()
            await asyncio.sleep(0.0 if n == background else first_token_after_s[n])
            await stream_sse(writer, [chunk(sse_event("x"))])
            await asyncio.sleep(0.3 if n == background else 0.0)
            writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

        server, url, _ = await serve(handler)
        async with server:
            return await run_scenario("slaq", url, "m", {x: "k" for x in "ABC"}, {x: None for x in "ABC"}, 1, "k", hold=hold)

    run = asyncio.run(go())
    assert background_stopped == [True, True, True] and trio_held == [True, True, True]
    assert sorted(seen) == [10, 100, 500] and run.held_until is not None and run.held_until >= SETTLE_S + HANDOVER_S
    assert run.order == ["A", "C", "B"]
    assert run.ttft_ms("A") == round(1000 * (run.outcomes["A"].first_token_at - run.held_until), 1)  # from the hold's end
    assert run.outcomes["A"].ttft_s > HANDOVER_S  # (from the send, it includes the handover)
    assert all(run.outcomes[x].first_token_at > run.held_until for x in "ABC")


def test_a_scenario_run_orders_by_first_tokens_once_the_background_decodes() -> None:
    run = _scenario_on_a_fake_engine({100: 0.01, 500: 0.2, 10: 0.06}, {})
    assert run.order == ["A", "C", "B"] and run.groups == [["A"], ["C"], ["B"]]
    sent = [run.outcomes[x].sent_at for x in "BAC"]
    assert sent == sorted(sent) and sent[-1] - sent[0] < 0.03  # B, A, C: together, in that order


def test_a_run_whose_requests_were_not_sent_together_is_refused() -> None:
    from slaq.local.scenario45 import NotTogether

    with pytest.raises(NotTogether, match="ms apart, not together"):
        _scenario_on_a_fake_engine({100: 0.01, 500: 0.2, 10: 0.06}, {500: 0.2})  # reading B holds the loop up 200 ms


def test_the_handover_figures_come_from_the_loaded_runs_access_lines_by_tier_and_pipe_depth() -> None:
    from slaq.local.demo_report import access_records, handover_figures, handover_lines

    def line(time_s: str, tier: str, handover: float | None, ahead: int | None) -> str:
        return json.dumps({"time": f"2026-12-04T20:00:{time_s}Z", "event": "request", "tier": tier, "handover_s": handover,
                           "pipe_ahead": ahead}, separators=(",", ":"))

    log = [line("00.000", "critical", 0.5, 20),  # before the loaded run: left out
           "INFO: uvicorn started", line("10.000", "critical", 0.02, 1), line("10.100", "critical", 0.03, 2),
           line("10.200", "critical", 0.09, 9), line("10.300", "batch", 0.01, 0), line("10.400", "critical", None, None)]
    since = datetime.fromisoformat("2026-12-04T20:00:05+00:00").timestamp()
    records = access_records(log, since)
    assert len(records) == 5
    figures = handover_figures(records, {"critical": "A (VIP)", "standard": "B (standard)", "batch": "C (free)"})
    vip = figures["A (VIP)"]
    assert (vip["n"], vip["p50_ms"], vip["p90_ms"], vip["pipe_ahead_max"]) == (3, 30.0, 90.0, 9)
    assert vip["by_pipe_ahead"]["0-2"] == {"n": 2, "p50_ms": 20.0, "p90_ms": 30.0}
    assert vip["by_pipe_ahead"]["8+"]["n"] == 1 and figures["B (standard)"]["n"] == 0
    text = handover_lines(figures)
    assert "A (VIP)" in text and "8+ ahead: 90 / 90 (1)" in text
