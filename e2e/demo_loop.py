"""`slaq up --demo` run again and again: does it tell the same story every run (issue 39)?

    python -m e2e.demo_loop [--runs 10] [--quick] [--out docs/results/demo-loop.json]

Runs `python -m slaq up --demo --json RUN.json` `--runs` times in a row (each a fresh pair of
stacks, as a user runs it), and prints one line per run and then the distribution over the runs
(min / median / max) of what issue 39's "done when" names: slaq's and stock's VIP SLO met, the
standard tenant's, scenario 4.5's order under slaq (checked as `e2e/test_demo.py` checks it),
slaq's VIP handover p90, the capacity measured, and whether the run's front end was saturated. A
run that exits non-zero counts as failed. Exit status 0 when every run exited 0 with scenario 4.5
in the report's order. `--out` keeps every run's figures and the summary in the benchmarks' envelope (command, date,
commit, load average) for docs/results.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from e2e.scenario45_loop import order_problem
from slaq.bench.envelope import envelope, with_envelope

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 1800.0
SCHEMA = "slaq.e2e.demo_loop/v1"  # docs/results.md renders it (slaq.bench.results.render_demo_loop)


def run_figures(report: dict[str, Any]) -> dict[str, Any]:
    """One demo JSON's figures the loop compares across runs."""
    load, scenario = report["load"], report["scenario_45"]["slaq"]
    handover = (report.get("handover") or {}).get("A (VIP)") or {}
    return {
        "slaq_vip_met": load["slaq"]["A"]["attainment"], "stock_vip_met": load["stock"]["A"]["attainment"],
        "slaq_standard_met": load["slaq"]["B"]["attainment"], "stock_standard_met": load["stock"]["B"]["attainment"],
        "scenario_problem": order_problem(scenario.get("engine_together"), bool(scenario["finished"]["B"]), scenario.get("together")),
        "vip_handover_p90_ms": handover.get("p90_ms"),
        "capacity_rps": report["calibration"]["capacity_rps"],
        "front_end_saturated": report.get("front_end_saturated"),
    }


def spread(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "—"
    return f"{min(known):.3g} / {statistics.median(known):.3g} / {max(known):.3g}"


def summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    figures = [r["figures"] for r in runs if r["figures"] is not None]
    keys = ("slaq_vip_met", "stock_vip_met", "slaq_standard_met", "stock_standard_met", "vip_handover_p90_ms", "capacity_rps")
    return {
        "runs": len(runs), "exited_0": sum(r["exit"] == 0 for r in runs),
        "scenario_in_order": sum(f["scenario_problem"] is None for f in figures),
        "front_end_saturated": {system: sum(bool((f["front_end_saturated"] or {}).get(system)) for f in figures) for system in ("stock", "slaq")},
        **{key: {"min": min(v), "median": statistics.median(v), "max": max(v)} if (v := [f[key] for f in figures if f[key] is not None]) else None
           for key in keys},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.demo_loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="`slaq up --demo --quick` (fewer samples)")
    parser.add_argument("--out", type=Path, default=None, help="write every run's figures and the summary here (JSON)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    run = envelope()  # started now: the load average at the start
    run["command"] = shlex.join(["python", "-m", "e2e.demo_loop", *(argv if argv is not None else sys.argv[1:])])
    workdir = Path(tempfile.mkdtemp(prefix="slaq-demo-loop-"))
    runs: list[dict[str, Any]] = []
    for index in range(args.runs):
        path = workdir / f"run-{index + 1}.json"
        command = [sys.executable, "-u", "-m", "slaq", "up", "--demo", "--json", str(path), *(["--quick"] if args.quick else [])]
        t0 = time.monotonic()
        with (workdir / f"run-{index + 1}.log").open("w") as log:
            exit_code = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S).returncode
        figures = run_figures(json.loads(path.read_text())) if exit_code == 0 and path.exists() else None
        runs.append({"exit": exit_code, "seconds": round(time.monotonic() - t0), "figures": figures, "log": str(workdir / f"run-{index + 1}.log")})
        if figures is None:
            print(f"run {index + 1}: exit {exit_code} (log {workdir / f'run-{index + 1}.log'})", flush=True)
        else:
            pct = lambda v: "—" if v is None else f"{v:.0%}"  # noqa: E731
            print(f"run {index + 1}: VIP met slaq {pct(figures['slaq_vip_met'])} stock {pct(figures['stock_vip_met'])}; "
                  f"standard slaq {pct(figures['slaq_standard_met'])} stock {pct(figures['stock_standard_met'])}; "
                  f"scenario 4.5 {'in order' if figures['scenario_problem'] is None else figures['scenario_problem']}; "
                  f"VIP handover p90 {figures['vip_handover_p90_ms']} ms; capacity {figures['capacity_rps']:.1f}/s; "
                  f"front end saturated {figures['front_end_saturated']}", flush=True)
    result = summary(runs)
    figures = [r["figures"] for r in runs if r["figures"] is not None]
    print(f"\n{result['exited_0']} of {len(runs)} runs exited 0; scenario 4.5 in order in {result['scenario_in_order']}; "
          f"front end saturated (stock / slaq): {result['front_end_saturated']['stock']} / {result['front_end_saturated']['slaq']}")
    for key, label in (("slaq_vip_met", "slaq VIP met"), ("stock_vip_met", "stock VIP met"), ("slaq_standard_met", "slaq standard met"),
                       ("stock_standard_met", "stock standard met"), ("vip_handover_p90_ms", "slaq VIP handover p90 ms"),
                       ("capacity_rps", "capacity requests/s")):
        print(f"  {label:<26} min / median / max: {spread([f[key] for f in figures])}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"schema": SCHEMA, "quick": args.quick, "summary": result, "runs": runs}
        args.out.write_text(json.dumps(with_envelope(report, run), indent=2) + "\n")
        print(f"figures: {args.out}")
    return 0 if result["exited_0"] == len(runs) and result["scenario_in_order"] == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
