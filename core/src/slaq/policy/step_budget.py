"""The step token budget, by name: `tpot` shapes each step to the tightest running TPOT objective
(`slaq.engine.tpot_budget`), `stock` leaves vLLM's `max_num_scheduled_tokens`. The policies live
with the engine (they are calibrated on its measured steps and read vLLM's requests); this registry
only names them, as `module:class` paths imported when the engine builds one, so `slaq.policy`
itself never imports vLLM (the sidecar imports it)."""

from __future__ import annotations

import importlib
from typing import Mapping

STEP_BUDGETS: Mapping[str, str] = {
    "stock": "slaq.engine.step_budget:StockStepBudget",
    "tpot": "slaq.engine.tpot_budget:TpotStepBudget",
}


def step_budget_class(name: str) -> type:
    """The registered step-budget policy class of `name` (imports its engine module)."""
    module, _, attribute = STEP_BUDGETS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)
