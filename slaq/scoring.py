"""Formula 1's names, where earlier code imports them from; the policy lives in `slaq.policy`."""

from slaq.policy.ranking import DeadlineClassRanking, effective_weights
from slaq.policy.terms import TERMS, Term
from slaq.policy.views import PoolView, RequestView

__all__ = ["TERMS", "DeadlineClassRanking", "PoolView", "RequestView", "Term", "effective_weights"]
