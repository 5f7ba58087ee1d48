"""Scenario 4.5 under slaq, run again and again against one stack: does it decide the same each time?

    python -m e2e.scenario45_loop [--runs 20] [--system slaq|priority|fcfs] [--scale 0.82]

Starts the demo's stack once (`slaq engine` with the demo's flags and, for slaq, the sidecar with the
example tenants at their report objectives times `--scale`, as the demo's calibration scales them:
0.82 in one CI run, so A's 41 ms and B's 164 ms; `priority` and `fcfs` run stock vLLM), runs scenario 4.5
`--runs` times with fresh prompts each time (as the demo does: a run whose three requests the
client could not send together is run again, up to three times), and checks each run as `e2e/test_demo.py` checks the
demo's slaq run: A starts first, C before B and not with it, B finishes. Prints one line per run and
the pass count; exit status 0 when every run passed. For slaq only the check applies, on the order
the engine scheduled them in (`ScenarioRun.engine_groups`); the stock systems' orders are printed.
"""

from __future__ import annotations

import argparse
import sys
import time

from slaq.local.demo import STOCK_PRIORITY, SCENARIO, _scenario, demo_engine_args, demo_tenants, scaled_tenant, scenario_seed
from slaq.local.errors import ScenarioError
from slaq.local.scenario45 import BACKGROUND_TENANT, ScenarioRun
from slaq.local.stack import LocalStack, StackOptions, new_workdir
from slaq.local.tenants import LocalTenants, local_pool, plan_local_table, read_tenants, write_table
from slaq.local.up import default_tenants


def slaq_order_problem(run: ScenarioRun) -> str | None:
    """What `e2e/test_demo.py` would fail on in this run (None: it passes)."""
    return order_problem(run.engine_groups, run.finished("B"), run.groups)


def order_problem(groups: list[list[str]] | None, b_finished: bool, client_groups: object = None) -> str | None:
    """The check on slaq's engine order (groups of letters started together), as `e2e/test_demo.py` makes it."""
    if groups is None:
        return f"the engine logged no line for A, B or C (the client saw {client_groups})"
    order = [x for g in groups for x in g]
    if "A" not in groups[0]:
        return f"A did not start first: {groups}"
    if not (order.index("C") < order.index("B") and not any("C" in g and "B" in g for g in groups)):
        return f"C did not start before B: {groups}"
    if not b_finished:
        return "B never finished"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.scenario45_loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--system", choices=("slaq", "priority", "fcfs"), default="slaq")
    parser.add_argument("--seed", type=int, default=4545)
    parser.add_argument("--scale", type=float, default=0.82, help="the report's objectives times this")
    args = parser.parse_args(argv)
    local = read_tenants([default_tenants()])
    by_tier = demo_tenants(local)
    names = {p.letter: by_tier[p.tier].metadata.name for p in SCENARIO}
    keys = {letter: local.keys[name][0] for letter, name in names.items()}
    workdir = new_workdir("slaq-scenario45-")
    slaq = args.system == "slaq"
    table_path = None
    if slaq:
        objectives = {p.letter: None if p.report_ttft_ms is None else p.report_ttft_ms * args.scale for p in SCENARIO}
        tenants = LocalTenants([scaled_tenant(by_tier[p.tier], None if objectives[p.letter] is None else objectives[p.letter] / 1000.0)
                                for p in SCENARIO], {name: local.keys[name] for name in names.values()})
        table_path = write_table(plan_local_table(tenants, local_pool("slaq-tiny")), workdir / "tenants.json")
    stack = LocalStack(StackOptions(port=0, scheduler="slaq" if slaq else "stock-priority", engine_args=demo_engine_args(()),
                                    tenant_table=table_path), workdir)
    priorities = {p.letter: STOCK_PRIORITY[p.tier] for p in SCENARIO} if args.system == "priority" else {x: None for x in "ABC"}
    background_priority = STOCK_PRIORITY[next(p.tier for p in SCENARIO if p.letter == BACKGROUND_TENANT)] if args.system == "priority" else None
    passed = 0
    with stack:
        t0 = time.monotonic()
        stack.start()
        print(f"{args.system}: stack ready in {time.monotonic() - t0:.0f}s; logs in {workdir}", flush=True)
        for run_index in range(args.runs):
            seed = scenario_seed(args.seed, 1 + run_index % 900)
            try:
                run = _scenario(stack, stack.served_model_name, keys, args.system, priorities, background_priority, seed)
            except ScenarioError as exc:
                print(f"run {run_index + 1}: FAIL {exc}", flush=True)
                continue
            problem = slaq_order_problem(run) if slaq else None
            passed += problem is None
            print(f"run {run_index + 1}: {'pass' if problem is None else 'FAIL'} together={run.groups} "
                  f"engine={run.engine_groups} ttft_ms={ {x: run.ttft_ms(x) for x in 'ABC'} }{'' if problem is None else ' ' + problem}", flush=True)
    print(f"{args.system}: {passed} of {args.runs} runs passed")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
