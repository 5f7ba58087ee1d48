"""docs/results.md is what the benchmarks' reports in docs/results/ render to, and every report says
how, when and from which commit it was produced (slaq.bench.results, slaq.bench.envelope)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from slaq.bench import results
from slaq.bench.envelope import command_line, envelope, with_envelope
from slaq.bench.results import PAGE, REPORTS, ResultsError, load_reports, render

ROOT = Path(__file__).resolve().parents[1]


def _a_report(name: str = "pod-1500") -> dict:
    return json.loads((REPORTS / f"{name}.json").read_text())


def test_the_page_is_what_its_reports_render_to() -> None:
    assert PAGE == ROOT / "docs" / "results.md" and REPORTS == ROOT / "docs" / "results"
    assert PAGE.read_text(encoding="utf-8") == render(load_reports()), \
        "docs/results.md is stale against docs/results/*.json: run python -m slaq.bench.results"


def test_every_report_carries_its_command_date_and_commit() -> None:
    for name, report in load_reports().items():
        run = report["run"]
        assert run["command"].startswith(("slaq bench ", "python tools/src/slaq/bench/", "python -m e2e.", "python -m pytest e2e/")), \
            (name, run["command"])
        assert dt.datetime.strptime(run["date"], "%Y-%m-%dT%H:%M:%SZ"), name
        assert run["commit"] is None or len(run["commit"]) == 40, name
        assert f"## {name}\n\n```bash\n{run['command']}\n```\n\nRun {run['date']}, " in PAGE.read_text(encoding="utf-8")


def test_a_changed_figure_makes_the_page_stale(tmp_path: Path) -> None:
    """Negative control: the comparison would catch a report edited (or rerun) without re-rendering."""
    reports = load_reports()
    changed = copy.deepcopy(reports)
    name = "pod-1500"
    entry = changed[name]["sweep"][-1]["policies"]["slaq"]
    entry["tiers"]["standard"]["attainment"] = 0.123456
    assert "0.123" not in render(reports) and "0.123" in render(changed)
    for each, report in changed.items():
        (tmp_path / f"{each}.json").write_text(json.dumps(report))
    assert results.main(["--reports", str(tmp_path), "--page", str(PAGE), "--check"]) == 1
    page = tmp_path / "results.md"
    assert results.main(["--reports", str(tmp_path), "--page", str(page)]) == 0
    assert results.main(["--reports", str(tmp_path), "--page", str(page), "--check"]) == 0


@pytest.mark.parametrize("drop", ["command", "date"])
def test_a_report_without_its_command_or_date_is_refused(drop: str, tmp_path: Path, capsys) -> None:
    report = _a_report()
    del report["run"][drop]
    (tmp_path / "odd.json").write_text(json.dumps(report))
    with pytest.raises(ResultsError, match=f"odd.json: the envelope has no '{drop}'"):
        load_reports(tmp_path)
    assert results.main(["--reports", str(tmp_path), "--page", str(tmp_path / "page.md")]) == 2
    assert "odd.json" in capsys.readouterr().err and not (tmp_path / "page.md").exists()


def test_hand_typed_figures_without_an_envelope_or_schema_are_refused(tmp_path: Path) -> None:
    report = _a_report()
    del report["run"]
    (tmp_path / "typed.json").write_text(json.dumps(report))
    with pytest.raises(ResultsError, match="typed.json: no 'run' envelope"):
        load_reports(tmp_path)
    (tmp_path / "typed.json").write_text(json.dumps({"run": {"command": "slaq bench x", "date": "2026-12-04T00:00:00Z"},
                                                     "attainment": 1.0}))
    with pytest.raises(ResultsError, match="typed.json: unknown schema None"):
        load_reports(tmp_path)


def test_the_envelope_names_the_command_as_typed_and_the_time_in_utc() -> None:
    assert command_line([str(ROOT / "core/src/slaq/__main__.py"), "bench", "sim", "--seed", "1"]) == "slaq bench sim --seed 1"
    assert command_line([str(ROOT / "tools/src/slaq/bench/sched_overhead.py"), "--repeats", "3"]) == \
        "python tools/src/slaq/bench/sched_overhead.py --repeats 3"
    assert command_line(["/x/slaq", "bench", "sim", "--objective", "critical=0.5 0.1"]) == \
        "slaq bench sim --objective 'critical=0.5 0.1'"
    at = dt.datetime(2026, 12, 4, 19, 30, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    run = envelope(["/x/slaq", "bench"], now=at)
    assert run["date"] == "2026-12-04T17:30:05Z" and run["command"] == "slaq bench"
    assert run["commit"] is None or len(run["commit"]) == 40
    assert list(with_envelope({"schema": "s", "run": "old"}, run)) == ["run", "schema"]


def test_section_links_use_the_fragments_github_gives_the_headings() -> None:
    assert results.anchor("pod-1500") == "pod-1500"
    assert results.anchor("pod-6000-load1.5") == "pod-6000-load15"  # GitHub drops the dot
    page = PAGE.read_text(encoding="utf-8")
    for name in load_reports():
        assert f"[{name}](#{results.anchor(name)})" in page and f"\n## {name}\n" in page


@pytest.mark.parametrize("readme", ["README.md", "engine/README.md", "tools/src/slaq/bench/README.md"])
def test_the_readmes_link_to_the_page_for_their_benchmark_figures(readme: str) -> None:
    text = (ROOT / readme).read_text(encoding="utf-8")
    target = Path("docs/results.md") if readme == "README.md" else Path(*[".."] * (len(Path(readme).parts) - 1), "docs", "results.md")
    assert f"]({target.as_posix()}" in text and (ROOT / readme).parent.joinpath(target).resolve() == PAGE


def test_the_page_shows_what_each_policy_swapped_or_recomputed() -> None:
    """`--kv-swap` figures per policy: victims swapped and recomputed (with why), host transfer time, the rule's prices."""
    report = copy.deepcopy(_a_report("engine-1500"))
    entry = report["sweep"][-1]
    slaq = entry["policies"]["slaq"]
    slaq.update(preemptions=62, recompute_tax=0.000285, recomputed_tokens=457)
    slaq["kv_swap"] = {"host_cache_gib": 1.0, "host_link_gb_s": 55.0, "host_seal_gb_s": 12.6,
                       "rule": {"seal_and_open_s_per_token": 2.5e-05, "recompute_s_per_token": 3.0e-05},
                       "victims": 62, "swapped_victims": 60, "recomputed_victims": 2,
                       "refusals": {"recompute": 0, "refused": 2}, "transfer_s": 0.29}
    entry["policies"]["slaq-noswap"] = {**slaq, "kv_swap": None, "preemptions": 58, "recompute_tax": 0.00675, "recomputed_tokens": 10807}
    page = render({"kv": report})
    assert ("; 62 preemptions, recompute tax 0.03 % (457 tokens); KV swap: 60 of 62 victims swapped, 2 recomputed "
            "(no room or nothing to save: 2), 0.290 s of host transfers (1 GiB host cache, 55 GB/s link, sealing 12.6 GB/s; "
            "per token 25.0 µs out and back against 30.0 µs to recompute)\n") in page
    assert "; 58 preemptions, recompute tax 0.68 % (10,807 tokens); no KV swap (victims recomputed)\n" in page
    slaq_line = next(line for line in page.splitlines() if line.startswith(f"- load {entry['load']:g}, `slaq`: "))
    critical = slaq["tiers"]["critical"]
    assert slaq_line.startswith(f"- load {entry['load']:g}, `slaq`: critical TTFT {critical['ttft_attainment']:.3f} / "
                                f"TPOT {critical['tpot_attainment']:.3f}, standard TTFT ")
    slaq["kv_swap"].update(host_seal_gb_s=None)
    assert "55 GB/s link, sealing not counted; per token" in render({"kv": report})
    slaq["kv_swap"].update(victims=0, swapped_victims=0, recomputed_victims=0)
    assert "; 62 preemptions, recompute tax 0.03 % (457 tokens); KV swap on, no victims (1 GiB host cache)\n" in render({"kv": report})


def test_the_page_names_a_window_or_bursts_the_arrivals_were_shaped_by() -> None:
    report = copy.deepcopy(_a_report("engine-1500"))
    assert "densest" not in "\n".join(results.render_sim(report)) and "bursts at" not in "\n".join(results.render_sim(report))
    report["workload"].update(window_s=600.0, window_density=1.3668, bursts={"factor": 4.0, "period_s": 10.0, "burst_s": 1.25})
    assert (", arrivals trace, its densest 600 s (1.37× the trace's mean density), bursts at 4× the mean rate for 1.25 s of every "
            "10 s; the engine alone") in results.render_sim(report)[0]


def _live_quota_skew_report(tmp_path: Path) -> dict:
    """What e2e/test_quota_skew.py writes with --quota-skew-report (its own write_report), with made-up figures."""
    from e2e.test_quota_skew import write_report

    def mode(epsilon: float, refused_cold: int, shares: tuple[float, float]) -> dict:
        return {"window_s": 23.4, "window_admitted": 94, "window_quota": 93.6, "epsilon": epsilon, "exact_sent": 120,
                "exact_admitted_fraction": round((120 - refused_cold) / 120, 4), "exact_tiny-cpu-0_sent": 96, "exact_tiny-cpu-1_sent": 24,
                "exact_tiny-cpu-0_refused": 0, "exact_tiny-cpu-1_refused": refused_cold,
                "share_tiny-cpu-0": shares[0], "share_tiny-cpu-1": shares[1]}

    run = {"command": "python -m pytest e2e/test_quota_skew.py -s -p no:cacheprovider --quota-skew-report docs/results/quota-skew-live.json",
           "date": "2026-12-05T22:00:00Z", "commit": "a" * 40, "dirty": False, "load_average": 3.5, "cpus": 2}
    figures = {"local": mode(0.0043, 1, (192.02, 47.98)), "store": mode(-0.0021, 0, (192.0, 48.0)),
               "store_calls": {"answered": {"precheck": 1200.0, "reserve": 240.0, "settle": 240.0, "heartbeat": 10.0, "probe": 0.0},
                               "fallen_back": {"precheck": 9.0, "reserve": 0.0, "settle": 0.0, "heartbeat": 0.0, "probe": 0.0}},
               "kill": {"requests_after_kill": 17, "admitted_after_kill": 17, "first_token_after_kill_s": 0.038, "fallbacks": 21.0,
                        "long_streams_ended_after_kill": 2, "kill_at_s": 1.37}}
    path = tmp_path / "quota-skew-live.json"
    write_report(path, run, SimpleNamespace(figures=figures), time.monotonic() - 281.2, 0)
    report = json.loads(path.read_text())
    assert list(report)[:2] == ["run", "schema"] and report["run"] == run and report["duration_s"] == 281
    assert report["setup"]["quota_rpm"] == 240 and report["thresholds"]["epsilon"] == 0.1  # the test's constants
    report["load_average_end"] = 6.25  # the machine's, at write time
    return report


def test_the_page_shows_the_live_quota_skew_test_figures(tmp_path: Path) -> None:
    """The live test's report renders each mode's ε and exact-phase admission, the shares, the store's calls and the kill."""
    report = _live_quota_skew_report(tmp_path)
    page = render({"quota-skew-live": report})
    assert "\n## quota-skew-live\n\n```bash\npython -m pytest e2e/test_quota_skew.py -s -p no:cacheprovider --quota-skew-report " in page
    assert "Run 2026-12-05T22:00:00Z, commit `aaaaaaaaaaaa`, load average 3.5 on 2 CPUs at the start." in page
    assert ("| per-pod shares (no store) | 50 s | 23.4 s | 94 / 93.6 | +0.0043 | 119 of 120 (0.992) | 96 / 24 | 0 / 1 | 192.02 / 47.98 |"
            in page)
    assert "| shared store (`--quota-store`, redis) | 50 s | 23.4 s | 94 / 93.6 | -0.0021 | 120 of 120 (1.000) | 96 / 24 | 0 / 0 | 192.00 / 48.00 |" in page
    assert "behind HAProxy weighted 80/20;" in page and "a tenant's 240 rpm" in page and "Every test of the run passed." in page
    assert "281 s with two tiny CPU engine starts; load average 6.25 at the end" in page
    assert "in the shared-store mode (both sidecars) answered / decided on the local shares after a timeout: precheck 1,200 / 9, reserve 240 / 0," in page
    assert ("17 of the 17 requests sent after the kill admitted on the local shares, the first answered 38 ms after it; "
            "2 of the streams the store had admitted finished after the kill;") in page
    assert "shares within 1% of the quota of the 80/20 split" in page
    # An overload that went on until both pods had refused for the window's 10 s says how long it ran.
    report["setup"] |= {"max_overload_s": 110.0, "min_window_s": 10.0}
    report["figures"]["local"]["overload_s"] = 61.3
    page = render({"quota-skew-live": report})
    assert "for 50 s or on, up to 110 s, until both pods have refused for 10 s, ε = admitted" in page
    assert "| per-pod shares (no store) | 61.3 s | 23.4 s |" in page and "| shared store (`--quota-store`, redis) | 50 s |" in page
    # A failed run says so; a run of one test (-k) shows the mode it has and nothing of the others.
    report["failed"] = 2
    del report["figures"]["store"], report["figures"]["store_calls"], report["figures"]["kill"]
    page = render({"quota-skew-live": report})
    assert "2 test(s) of the run FAILED" in page and "shared store (`--quota-store`" not in page and "SIGKILL" not in page
    assert "| per-pod shares (no store) |" in page


def test_the_page_shows_each_cluster_signals_wall_clock() -> None:
    """The simulator's speed on the machine that ran it is in the report (`wall_s`), so the page shows it, not a README."""
    report = copy.deepcopy(_a_report("cluster-wva-ramp-all"))
    report["signals"]["slaq"]["wall_s"] = 503.2
    page = render({"cluster": report})
    assert "| lost | simulator's wall clock |" in page
    row = next(line for line in page.splitlines() if line.startswith("| `slaq` | "))
    assert row.endswith("| 503 s |")
    del report["signals"]["slaq"]["wall_s"]
    assert next(line for line in render({"cluster": report}).splitlines() if line.startswith("| `slaq` | ")).endswith("| — |")


def test_the_page_says_what_prompt_a_sidecar_latency_run_sent_and_how_the_sidecar_counted_it() -> None:
    report = copy.deepcopy(_a_report("sidecar-latency-1x300"))
    assert "a prompt of" not in "\n".join(results.render_sidecar_latency(report))  # the default prompt: nothing said
    report.update(prompt_tokens=4096, prompt_chars=19840, tokenizer="tiny")
    assert ", a prompt of 4,096 tokens (19,840 characters) counted by the sidecar with the `tiny` tokenizer) and through" in \
        "\n".join(results.render_sidecar_latency(report))
    report.update(tokenizer=None, prompt_chars=16384)
    assert ", a prompt of 4,096 tokens (16,384 characters) estimated by the sidecar (no tokenizer)) and through" in \
        "\n".join(results.render_sidecar_latency(report))


QUOTA_STORE_FIGURES = {
    "redis": "7.0.15", "timeout_s": 0.25, "failures_to_open": 2, "skew": 0.8, "reserved_tokens": 100, "used_tokens": 60,
    "reservation": {"requests": 2000, "in_store": 2000, "p50_ms": 0.106, "p99_ms": 4.126, "max_ms": 6.364, "mean_ms": 0.252},
    "killed": {"decisions": 3, "decision_ms": [0.26, 0.34, 0.01], "admitted_on_shares": 3, "admitted_in_store": 0, "refused": 0,
               "reserve_fallbacks": 3, "breaker_after": "open"},
    "stalled": {"decisions": 3, "decision_ms": [251.74, 252.02, 0.02], "admitted_on_shares": 3, "admitted_in_store": 0, "refused": 0,
                "reserve_fallbacks": 3, "breaker_after": "open"},
}


def test_the_page_shows_the_quota_store_costs() -> None:
    """quota_store.py's report: an answered reservation's p50 / p99 / max, and each decision after a kill and a stall."""
    run = {"command": "python tools/src/slaq/bench/quota_store.py --out docs/results/quota-store.json", "date": "2026-12-05T22:00:00Z",
           "commit": "b" * 40, "dirty": False, "load_average": 1.5, "cpus": 2}
    page = render({"quota-store": with_envelope({"schema": "slaq.bench.quota_store/v1", **QUOTA_STORE_FIGURES}, run)})
    assert "\n## quota-store\n\n```bash\npython tools/src/slaq/bench/quota_store.py --out docs/results/quota-store.json\n```\n" in page
    assert "on one redis-server 7.0.15 on 127.0.0.1, the sidecar's store settings (timeout 250 ms, the breaker open after 2 failures" in page
    assert "| answering (one after another, 80% on one replica) | 2,000 | p50 0.11, p99 4.13, max 6.36 | 2,000 in the store |" in page
    assert ("| killed (SIGKILL: connections refused) | 3 | each: 0.26, 0.34, 0.01 | 3 on the replica's share, 0 refused; "
            "breaker open |") in page
    assert "| stalled (SIGSTOP: nothing answers) | 3 | each: 251.74, 252.02, 0.02 | 3 on the replica's share, 0 refused;" in page


def test_the_quota_store_benchmark_writes_what_the_page_renders(tmp_path: Path) -> None:
    """The benchmark's own report (a short run against a real redis-server) has the fields the page reads."""
    import shutil

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs Debian's redis-server)")
    from slaq.bench import quota_store

    out = tmp_path / "quota-store.json"
    assert quota_store.main(["--requests", "20", "--decisions", "3", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report)[:2] == ["run", "schema"] and report["schema"] == "slaq.bench.quota_store/v1"
    assert set(report) - {"run", "schema"} == set(QUOTA_STORE_FIGURES)
    assert report["reservation"]["requests"] == report["reservation"]["in_store"] == 20
    for kind in ("killed", "stalled"):
        assert set(report[kind]) == set(QUOTA_STORE_FIGURES[kind]) and len(report[kind]["decision_ms"]) == 3
    page = render({"quota-store": report})
    assert "| answering (one after another, 80% on one replica) | 20 | p50 " in page


def test_the_page_shows_the_operators_tenant_statuses_and_key_rotation() -> None:
    """operator_scale.py's `statuses_s` (operator start until every TenantSLA's status is written) beside `converge_s`,
    a dash for a report from before the field; its key rotation (`rotate_s`) where the report has one."""
    report = copy.deepcopy(_a_report("operator-scale-20x3"))
    report.update(converge_s=10.87, statuses_s=21.5)
    for key in ("rotate_s", "calls_per_rotation"):  # as a report from before the rotation was measured
        report.pop(key, None)
    page = render({"operator": report})
    assert "| table Secrets | converge | tenant statuses | quota change |" in page
    assert f"| {report['table_secrets']:,} | 10.87 s | 21.5 s | {report['change_s']:g} s |" in page
    assert "key Secret patched" not in page
    report.update(rotate_s=0.023, calls_per_rotation=1)
    assert ("- The same tenant's key Secret patched with a new key: 0.023 s until every table of its pools held the new key's "
            "hash instead of the old one, API calls for it: 1 (") in render({"operator": report})
    del report["statuses_s"]
    assert f"| {report['table_secrets']:,} | 10.87 s | — | {report['change_s']:g} s |" in render({"operator": report})


def test_the_page_says_whether_a_sidecar_latency_run_paired_its_two_paths() -> None:
    report = copy.deepcopy(_a_report("sidecar-latency-1x300"))
    report.pop("paired", None)
    assert "through the real sidecar, one path after the other," in "\n".join(results.render_sidecar_latency(report))
    report["paired"] = True
    assert "through the real sidecar, alternately (one request each way, in turn)," in "\n".join(results.render_sidecar_latency(report))
