"""Step token budget policies, for the engine's importers: the policies are the pod policy's
(`slaq.policy.step_budget`, `slaq.policy.tpot_budget`: pure arithmetic on a `BatchView`, registered
by name in `STEP_BUDGETS`); the scheduler builds the view and applies the cap
(`vllm_compat.step_token_budget`), and reports each step's measured duration back.
"""

from __future__ import annotations

from slaq.policy.step_budget import BatchView, StepBudget, StockStepBudget

StepBudgetPolicy = StepBudget  # the engine's name for the protocol

__all__ = ["BatchView", "StepBudget", "StepBudgetPolicy", "StockStepBudget"]
