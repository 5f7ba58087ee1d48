"""e2e/demo_loop.py's figures and summary, from demo JSON reports (no demo run)."""

from __future__ import annotations

from e2e.demo_loop import run_figures, spread, summary


def report(slaq_vip: float, engine_together: list | None, handover_p90: float | None = 30.0, saturated: bool = False) -> dict:
    tenant = lambda met: {"attainment": met}  # noqa: E731
    return {"load": {"slaq": {"A": tenant(slaq_vip), "B": tenant(1.0)}, "stock": {"A": tenant(0.04), "B": tenant(0.06)}},
            "scenario_45": {"slaq": {"engine_together": engine_together, "together": engine_together, "finished": {"A": True, "B": True, "C": True}}},
            "handover": {"A (VIP)": {"p90_ms": handover_p90}}, "calibration": {"capacity_rps": 16.0},
            "front_end_saturated": {"stock": False, "slaq": saturated}}


def test_the_summary_counts_order_and_saturation_and_spreads_the_figures() -> None:
    runs = [{"exit": 0, "figures": run_figures(report(0.97, [["A", "C"], ["B"]]))},
            {"exit": 0, "figures": run_figures(report(0.69, [["B"], ["A", "C"]], 120.0, saturated=True))},
            {"exit": 2, "figures": None}]
    assert runs[1]["figures"]["scenario_problem"].startswith("A did not start first")
    result = summary(runs)
    assert (result["runs"], result["exited_0"], result["scenario_in_order"]) == (3, 2, 1)
    assert result["front_end_saturated"] == {"stock": 0, "slaq": 1}
    assert result["slaq_vip_met"] == {"min": 0.69, "median": 0.83, "max": 0.97}
    assert result["vip_handover_p90_ms"]["max"] == 120.0
    assert spread([0.69, None, 0.97]) == "0.69 / 0.83 / 0.97" and spread([None]) == "—"


def test_the_loops_report_renders_on_the_results_page() -> None:
    from slaq.bench.results import check_report, render_section

    runs = [{"exit": 0, "figures": run_figures(report(0.97, [["A", "C"], ["B"]]))},
            {"exit": 0, "figures": run_figures(report(0.93, [["A", "C"], ["B"]], saturated=True))}]
    loop = {"run": {"command": "python -m e2e.demo_loop --runs 2", "date": "2026-12-04T20:00:00Z", "commit": None},
            "schema": "slaq.e2e.demo_loop/v1", "quick": False, "summary": summary(runs), "runs": runs}
    check_report("demo-loop.json", loop)
    text = "\n".join(render_section("demo-loop", loop))
    assert "run 2 times in a row: 2 exited 0, scenario 4.5 in the report's order (under slaq) in 2" in text
    assert "| slaq VIP SLO met | 93% / 95% / 97% |" in text and "saturated (the demo's verdict) in 0 of stock's" in text
