"""Formula 1's terms: one file each, registered here. Each is a pure function of a read-only
request view, the clock and the pool, returning a value in [0, 1] (higher runs earlier).

Adding a term: one file here, one registration line below, and a weight in `ScoreWeights` (the
CRD field); tests/policy/test_conformance.py runs it through the shared cases the day it is added.
The terms are registered here, not in their files, so that their order (formula 1's order of
summation) is the order of these lines, whatever order the files are imported in.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from slaq.policy.terms.fairness import fairness
from slaq.policy.terms.length import length
from slaq.policy.terms.tier import tier
from slaq.policy.terms.urgency import urgency
from slaq.policy.terms.waiting import waiting
from slaq.policy.registry import Registry
from slaq.policy.views import PoolView, RequestView


@runtime_checkable
class Term(Protocol):
    """A ranking term: pure, in [0, 1], higher runs earlier."""

    def __call__(self, request: RequestView, now: float, pool: PoolView) -> float: ...


TERMS: Registry[Term] = Registry("ranking term", Term)
TERMS.register("urgency", urgency)
TERMS.register("waiting", waiting)
TERMS.register("length", length)
TERMS.register("tier", tier)
TERMS.register("fairness", fairness)
