"""The pod's scheduling policy, one implementation hosted by the sidecar queue and the engine queue.

Each part is a small named registry; `PodPolicy.from_spec` picks one of each from the pool's
`SchedulerSpec`, so both containers, given the same spec, decide alike:

- ranking (`ranking.py`, terms in `terms/`): class order, then formula 1;
- tenant service accounting (`accounting.py`): virtual token counters;
- load (`load.py`): the fuller of the batch and the KV cache;
- preemption victims (`victims.py`): lowest tier, cheapest to recompute;
- step token budget (`step_budget.py`, `tpot_budget.py`): shaped to the tightest TPOT objective, or stock;
- the queue discipline (`discipline.py`): per-tier heaps, missed requests, the starving share.

Each registry (`registry.Registry`) names its part's contract, a `typing.Protocol` beside it
(`Ranking`, `Term`, `Accounting`, `Load`, `VictimOrder`, `StepBudget`), and refuses a second
registration under a taken name. tests/policy/test_conformance.py runs every registered policy
through the same cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from slaq.api.pool import SchedulerSpec
from slaq.policy import tpot_budget  # noqa: F401  registers the `tpot` step budget
from slaq.policy.accounting import ACCOUNTS, Accounting
from slaq.policy.discipline import Discipline
from slaq.policy.load import LOADS, Load
from slaq.policy.ranking import RANKINGS, DeadlineClassRanking
from slaq.policy.registry import Registry
from slaq.policy.step_budget import STEP_BUDGETS, StepBudget
from slaq.policy.victims import VICTIMS, VictimOrder

REGISTRIES: Mapping[str, Registry] = {
    "ranking": RANKINGS,
    "accounting": ACCOUNTS,
    "load": LOADS,
    "victims": VICTIMS,
    "step_budget": STEP_BUDGETS,
}


def policy_names(spec: SchedulerSpec) -> dict[str, str]:
    """The registry entry of each part the spec selects (`spec.policies`)."""
    names = spec.policies
    step_budget = names.step_budget or ("tpot" if spec.tpot_budget_shaping else "stock")
    return {"ranking": names.ranking, "accounting": names.accounting, "load": names.load, "victims": names.victims, "step_budget": step_budget}


@dataclass
class PodPolicy:
    spec: SchedulerSpec
    ranking: DeadlineClassRanking
    accounting: Accounting
    load: Load
    victims: VictimOrder
    step_budget_name: str
    discipline: Discipline

    @classmethod
    def from_spec(cls, spec: SchedulerSpec) -> "PodPolicy":
        names = policy_names(spec)
        return cls(
            spec=spec,
            ranking=RANKINGS[names["ranking"]].from_spec(spec),
            accounting=ACCOUNTS[names["accounting"]](),
            load=LOADS[names["load"]],
            victims=VICTIMS[names["victims"]](),
            step_budget_name=names["step_budget"],
            discipline=Discipline.from_spec(spec),
        )

    def step_budget(self) -> StepBudget:
        """A fresh step-budget policy (it learns from the steps it is shown: one per engine)."""
        return STEP_BUDGETS[self.step_budget_name]()
