"""The step token budget, by name: `tpot` shapes each step to the tightest running TPOT objective
(`slaq.engine.tpot_budget`), `stock` leaves vLLM's `max_num_scheduled_tokens`. The policies live
with the engine (they are calibrated on its measured steps); this registry only names them."""

from __future__ import annotations

from typing import Callable, Mapping

from slaq.engine.step_budget import StepBudgetPolicy, StockStepBudget
from slaq.engine.tpot_budget import TpotStepBudget

STEP_BUDGETS: Mapping[str, Callable[[], StepBudgetPolicy]] = {
    "stock": StockStepBudget,
    "tpot": TpotStepBudget,
}
