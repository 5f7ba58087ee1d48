"""`slaq up --demo`'s pure parts: the workload, the objective scaling, the tenants it serves, the table."""

from __future__ import annotations

import re

import pytest

from slaq.api.common import Tier
from slaq.cli import build_parser, repo_root
from slaq.local.demo import (
    SCENARIO, Calibration, RunFigures, mix_burst, prompt_tokens, reference_ttft_s, results_table, scaled_tenant,
    scenario_workload,
)
from slaq.local.tenants import local_pool, plan_local_table, read_tenants


def test_the_readme_first_command_installs_and_runs_the_demo() -> None:
    text = (repo_root() / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).splitlines()
    assert block[0].split("#")[0].strip() == "scripts/setup.sh && slaq up --demo"
    assert block[1].split("#")[0].strip() == "scripts/setup.sh && scripts/test.sh"
    args = build_parser().parse_args(["up", "--demo"])
    assert args.demo and args.handler.__name__ == "_up"


def test_workload_rate_and_mix_follow_the_request() -> None:
    arrivals = scenario_workload(4.0, 200.0, seed=1)
    assert 700 < len(arrivals) < 900  # Poisson, 4/s over 200 s
    assert all(0 <= a < b for (a, _), (b, _) in zip(arrivals, arrivals[1:]))
    for profile in SCENARIO:
        share = sum(1 for _, p in arrivals if p is profile) / len(arrivals)
        assert abs(share - profile.share) < 0.05
    assert scenario_workload(4.0, 200.0, seed=1) == arrivals  # seeded: both runs see the same traffic
    assert len(mix_burst(24)) == 24


def test_prompts_keep_the_reports_proportions() -> None:
    assert [prompt_tokens(p) for p in SCENARIO] == [100, 500, 10]


def test_objectives_scale_by_the_measured_p90_over_the_reference_vip_ttft() -> None:
    vip, standard, free = SCENARIO
    reference = reference_ttft_s(vip.report_prompt_tokens)
    assert 0.02 < reference < 0.05  # a 1,000-token prefill on an H200 for an 8B model: tens of ms
    calibration = Calibration({vip.label: 3 * reference, standard.label: 0.1, free.label: 0.01},
                              {vip.label: 4 * reference, standard.label: 0.2, free.label: 0.02}, reference, 3.0)
    assert calibration.scale == pytest.approx(4.0)
    assert calibration.objective_s(vip) == pytest.approx(0.2)
    assert calibration.objective_s(standard) == pytest.approx(0.8)
    assert calibration.objective_s(free) is None


def test_demo_tenants_get_the_scaled_ttft_no_tpot_and_no_quotas() -> None:
    local = read_tenants([repo_root() / "crds" / "examples"])
    vip = next(t for t in local.tenants if t.spec.tier is Tier.CRITICAL)
    scaled = scaled_tenant(vip, 0.1234)
    assert scaled.spec.objectives.ttft_ms == 123.4 and scaled.spec.objectives.tpot_ms is None
    assert scaled.spec.quotas.requests_per_minute is None and scaled.spec.quotas.max_concurrency is None
    assert vip.spec.objectives.ttft_ms == 50  # the manifest's tenant is left as it was
    local.tenants[:] = [scaled if t is vip else t for t in local.tenants]
    entry = next(e for e in plan_local_table(local, local_pool("slaq-tiny")).tenants if e.name == vip.metadata.name)
    assert entry.ttft_ms == 123.4 and entry.share.requests_per_minute is None


def test_the_table_shows_both_runs_per_tenant() -> None:
    vip, standard, free = SCENARIO
    runs = {
        "stock": {vip.label: RunFigures(10, 10, 3, 0, [0.1] * 10), standard.label: RunFigures(4, 4, 4, 0, [0.2] * 4),
                  free.label: RunFigures(5, 5, 0, 0, [0.3] * 5)},
        "slaq": {vip.label: RunFigures(10, 9, 9, 1, [0.05] * 9), standard.label: RunFigures(4, 4, 2, 0, [0.5] * 4),
                 free.label: RunFigures(5, 2, 0, 3, [1.0, 2.0])},
    }
    table = results_table(runs, {vip.label: 0.09, standard.label: 0.36, free.label: None})
    rows = {line.split("│")[0].split("  ")[0].strip(): line for line in table.splitlines()[3:]}
    assert re.search(r"100\s+100\s+30%\s+10/10 │\s+50\s+50\s+90%\s+9/10", rows[vip.label])
    assert "no SLO" in rows[free.label] and "2/5" in rows[free.label] and "2000" in rows[free.label]
