"""The pod's scheduling policy, one implementation hosted by the sidecar queue and the engine queue.

Each part is a small named registry; `PodPolicy.from_spec` picks one of each from the pool's
`SchedulerSpec`, so both containers, given the same spec, decide alike:

- ranking (`ranking.py`, terms in `terms/`): class order, then formula 1;
- tenant service accounting (`accounting.py`): virtual token counters;
- load (`load.py`): the fuller of the batch and the KV cache;
- preemption victims (`victims.py`): lowest tier, cheapest to recompute;
- step token budget (`step_budget.py`): shaped to the tightest TPOT objective, or stock;
- the queue discipline (`discipline.py`): per-tier heaps, missed requests, the starving share.

tests/policy/test_conformance.py runs every registered policy through the same cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from slaq.api.pool import SchedulerSpec
from slaq.policy.accounting import ACCOUNTS, VirtualTokenCounters
from slaq.policy.discipline import Discipline
from slaq.policy.step_budget import step_budget_class
from slaq.policy.load import LOADS
from slaq.policy.ranking import RANKINGS, DeadlineClassRanking
from slaq.policy.victims import VICTIMS, LowestTierCheapest

REGISTRIES: Mapping[str, Mapping[str, object]] = {
    "ranking": RANKINGS,
    "accounting": ACCOUNTS,
    "load": LOADS,
    "victims": VICTIMS,
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
    accounting: VirtualTokenCounters
    load: Callable[[int, int, float | None], float]
    victims: LowestTierCheapest
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

    def step_budget(self):  # -> StepBudgetPolicy: only the engine builds one (it imports vLLM)
        return step_budget_class(self.step_budget_name)()
