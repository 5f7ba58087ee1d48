"""Formula 1's terms: one file each, registered here. Each is a pure function of a read-only
request view, the clock and the pool, returning a value in [0, 1] (higher runs earlier).

Adding a term: one file here, one line in TERMS, and a weight in `ScoreWeights` (the CRD field);
tests/policy/test_conformance.py runs it through the shared cases the day it is added.
"""

from __future__ import annotations

from typing import Callable, Mapping

from slaq.policy.terms.fairness import fairness
from slaq.policy.terms.length import length
from slaq.policy.terms.tier import tier
from slaq.policy.terms.urgency import urgency
from slaq.policy.terms.waiting import waiting
from slaq.policy.views import PoolView, RequestView

Term = Callable[[RequestView, float, PoolView], float]

TERMS: Mapping[str, Term] = {
    "urgency": urgency,
    "waiting": waiting,
    "length": length,
    "tier": tier,
    "fairness": fairness,
}
