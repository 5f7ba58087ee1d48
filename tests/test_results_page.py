"""docs/results.md is what the benchmarks' reports in docs/results/ render to, and every report says
how, when and from which commit it was produced (slaq.bench.results, slaq.bench.envelope)."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path

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
        assert run["command"].startswith(("slaq bench ", "python tools/src/slaq/bench/", "python -m e2e.")), (name, run["command"])
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


def test_the_page_says_what_prompt_a_sidecar_latency_run_sent_and_how_the_sidecar_counted_it() -> None:
    report = copy.deepcopy(_a_report("sidecar-latency-1x300"))
    assert "a prompt of" not in "\n".join(results.render_sidecar_latency(report))  # the default prompt: nothing said
    report.update(prompt_tokens=4096, prompt_chars=19840, tokenizer="tiny")
    assert ", a prompt of 4,096 tokens (19,840 characters) counted by the sidecar with the `tiny` tokenizer) and through" in \
        "\n".join(results.render_sidecar_latency(report))
    report.update(tokenizer=None, prompt_chars=16384)
    assert ", a prompt of 4,096 tokens (16,384 characters) estimated by the sidecar (no tokenizer)) and through" in \
        "\n".join(results.render_sidecar_latency(report))
