"""One contract over every registered policy: a new term, ranking, account, load, victim or
step-budget policy is tested here the day its registration line is added."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slaq.api.common import Tier
from slaq.api.pool import SchedulerSpec
from slaq.policy import REGISTRIES, PodPolicy, policy_names
from slaq.policy.accounting import ACCOUNTS
from slaq.policy.load import LOADS
from slaq.policy.ranking import MISSED_CLASS, RANKINGS, STARVING_CLASS
from slaq.policy.registry import DuplicateRegistration, Registry
from slaq.policy.step_budget import STEP_BUDGETS, BatchView
from slaq.policy.terms import TERMS
from slaq.policy.victims import VICTIMS
from slaq.policy.views import PoolView, RequestView

requests = st.builds(
    RequestView,
    tier=st.sampled_from(list(Tier)),
    arrival=st.floats(0, 1e6),
    ttft_ms=st.one_of(st.none(), st.floats(1, 1e6)),
    prompt_tokens=st.integers(0, 1_000_000),
    predicted_output=st.integers(0, 100_000),
    tenant_service_share=st.floats(0, 1),
    tenant=st.sampled_from(["a", "b", "c"]),
)
pools = st.builds(PoolView, load=st.floats(0, 1), max_length_tokens=st.integers(1, 1_000_000), aging_bound_s=st.floats(0.001, 1e5))


@pytest.mark.parametrize("name", sorted(TERMS))
@given(request=requests, elapsed=st.floats(-10, 1e6), pool=pools)
def test_every_term_is_pure_and_in_unit_interval(name: str, request: RequestView, elapsed: float, pool: PoolView) -> None:
    now = request.arrival + elapsed
    value = TERMS[name](request, now, pool)
    assert 0.0 <= value <= 1.0
    assert TERMS[name](request, now, pool) == value


@pytest.mark.parametrize("name", sorted(RANKINGS))
@settings(max_examples=60)
@given(batch=st.lists(requests, min_size=2, max_size=12), elapsed=st.floats(0, 1e5), pool=pools)
def test_every_ranking_is_a_total_order_with_starving_first(name: str, batch: list[RequestView], elapsed: float, pool: PoolView) -> None:
    ranking = RANKINGS[name].from_spec(SchedulerSpec())
    now = max(r.arrival for r in batch) + elapsed
    ranks = [ranking.rank(r, now, pool) for r in batch]
    assert ranks == [ranking.rank(r, now, pool) for r in batch]  # pure
    for request, rank in zip(batch, ranks):
        assert rank[0] == ranking.rank_class(request, now, pool)
        assert STARVING_CLASS <= rank[0] <= MISSED_CLASS
        assert (rank[0] == STARVING_CLASS) == (now - request.arrival >= pool.aging_bound_s)
    starving = [rank for rank in ranks if rank[0] == STARVING_CLASS]
    others = [rank for rank in ranks if rank[0] != STARVING_CLASS]
    assert all(s < o for s in starving for o in others)


@pytest.mark.parametrize("name", sorted(RANKINGS))
def test_every_ranking_serves_an_attainable_higher_tier_first_and_keeps_arrival_order_within_a_tier(name: str) -> None:
    ranking = RANKINGS[name].from_spec(SchedulerSpec())
    pool = PoolView(load=1.0, max_length_tokens=8192, aging_bound_s=60.0)
    critical = RequestView(Tier.CRITICAL, 10.0, 500.0, 100, 100)
    standard = RequestView(Tier.STANDARD, 9.0, 2000.0, 100, 100)
    batch = RequestView(Tier.BATCH, 0.0, 60_000.0, 100, 100)
    assert ranking.rank(critical, 10.1, pool) < ranking.rank(standard, 10.1, pool) < ranking.rank(batch, 10.1, pool)
    later = dataclasses.replace(standard, arrival=9.5)
    assert ranking.within_tier_key(standard, 60.0) < ranking.within_tier_key(later, 60.0)


@pytest.mark.parametrize("name", sorted(ACCOUNTS))
def test_every_account_shares_lie_in_the_unit_interval_and_newcomers_start_at_the_minimum(name: str) -> None:
    account = ACCOUNTS[name]()
    assert account.service_share("batch", "nobody") == 0.0
    account.charge("batch", "a", 100)
    account.charge("batch", "b", 300)  # joins at a's 100: 400
    account.charge("batch", "c", 0)  # joins at the minimum, 100, not at 0
    account.charge("critical", "a", 10_000)  # other tiers do not count
    assert account.service_share("batch", "c") == pytest.approx(100 / 600)
    assert account.service_share("batch", "b") == pytest.approx(400 / 600)
    assert all(0.0 <= account.service_share(t, x) <= 1.0 for t in ("batch", "critical") for x in "abc")
    account.forget("batch", "b")
    assert account.service_share("batch", "a") == pytest.approx(0.5)


@pytest.mark.parametrize("name", sorted(LOADS))
@given(busy=st.integers(0, 10_000), limit=st.integers(0, 4096), kv=st.one_of(st.none(), st.floats(0, 1.5)))
def test_every_load_lies_in_the_unit_interval_and_grows_with_either_signal(name: str, busy: int, limit: int, kv: float | None) -> None:
    load = LOADS[name]
    value = load(busy, limit, kv)
    assert 0.0 <= value <= 1.0
    assert load(busy + 1, limit, kv) >= value
    assert load(busy, limit, min(1.0, (kv or 0.0) + 0.1)) >= value


@dataclasses.dataclass(frozen=True)
class _Running:
    tier_rank: int
    computed_tokens: int
    arrival: float


@pytest.mark.parametrize("name", sorted(VICTIMS))
def test_every_victim_policy_orders_all_candidates_lowest_tier_first(name: str) -> None:
    chooser = VICTIMS[name]()
    candidates = [_Running(0, 10, 1.0), _Running(2, 500, 2.0), _Running(1, 5, 3.0), _Running(2, 50, 4.0)]
    order = chooser.order(candidates)
    assert sorted(order, key=id) == sorted(candidates, key=id)  # a permutation: nothing lost, nothing added
    assert [c.tier_rank for c in order] == sorted((c.tier_rank for c in candidates), reverse=True)


@pytest.mark.parametrize("name", sorted(STEP_BUDGETS))
@pytest.mark.parametrize("tpot_s", [None, 0.005, 0.05, 1.0])
def test_every_step_budget_stays_within_the_engine_limit(name: str, tpot_s: float | None) -> None:
    budget = STEP_BUDGETS[name]()
    for _ in range(3):
        cap = budget.budget(BatchView(tpot_s, 32, 100_000), 8192, 0.0)
        assert cap is None or 32 < cap <= 8192
        budget.observe(cap or 8192, 0.02, 100_000)
    if tpot_s is None:
        assert budget.budget(BatchView(None, 32, 0), 8192, 0.0) is None  # no objective: vLLM's own limit


def test_a_spec_selects_one_registered_entry_of_each_part() -> None:
    for spec in (SchedulerSpec(), SchedulerSpec(tpot_budget_shaping=False)):
        names = policy_names(spec)
        for part, registry in REGISTRIES.items():
            assert names[part] in registry
        assert names["step_budget"] in STEP_BUDGETS
        policy = PodPolicy.from_spec(spec)
        assert type(policy.step_budget()) is STEP_BUDGETS[names["step_budget"]]
    assert policy_names(SchedulerSpec(tpot_budget_shaping=False))["step_budget"] == "stock"


def test_every_registered_term_has_a_weight_and_is_weighted() -> None:
    """`effective_weights` derives the weights from TERMS: a sixth term without a ScoreWeights field fails here."""
    from slaq.api.pool import ScoreWeights
    from slaq.policy.ranking import effective_weights

    weights = ScoreWeights()
    assert set(TERMS) <= set(ScoreWeights.model_fields)
    assert set(effective_weights(weights, 0.5)) == set(TERMS)


def test_a_term_without_a_weight_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from slaq.api.pool import ScoreWeights
    from slaq.policy import ranking

    monkeypatch.setattr(ranking, "TERMS", {**TERMS, "novelty": lambda request, now, pool: 1.0})
    with pytest.raises(TypeError, match="novelty"):
        ranking.effective_weights(ScoreWeights(), 0.5)


def test_the_spec_names_exactly_the_registered_policies() -> None:
    """Each part's names in the CRD (PolicyNames' enums) are the entries of its registry."""
    import typing

    from slaq.api.pool import PolicyNames

    def literals(annotation: object) -> set[str]:
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) is typing.Literal:
            return set(args)
        return set().union(*(literals(arg) for arg in args)) if args else set()

    def choices(field: str) -> set[str]:
        return literals(PolicyNames.model_fields[field].annotation)

    for part, registry in REGISTRIES.items():
        assert choices(part) == set(registry), part
    assert choices("step_budget") == set(STEP_BUDGETS)
    spec = SchedulerSpec.model_validate({"policies": {"stepBudget": "stock"}})
    assert policy_names(spec)["step_budget"] == "stock" and type(PodPolicy.from_spec(spec).step_budget()) is STEP_BUDGETS["stock"]
    with pytest.raises(ValueError, match="ranking"):
        SchedulerSpec.model_validate({"policies": {"ranking": "fifo"}})


def test_the_policy_package_imports_no_vllm() -> None:
    import subprocess
    import sys

    code = "import sys, slaq.policy, slaq.policy.discipline, slaq.policy.step_budget, slaq.sidecar.queue; print('vllm' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


ALL_REGISTRIES: dict[str, Registry] = {**REGISTRIES, "terms": TERMS}
REGISTERED = [(part, name) for part, registry in ALL_REGISTRIES.items() for name in registry]


def _instance(part: str, name: str) -> object:
    implementation = ALL_REGISTRIES[part][name]
    if part == "ranking":
        return implementation.from_spec(SchedulerSpec())
    return implementation() if isinstance(implementation, type) else implementation


@pytest.mark.parametrize("part,name", REGISTERED)
def test_every_registered_policy_provides_its_parts_contract(part: str, name: str) -> None:
    contract = ALL_REGISTRIES[part].contract
    assert isinstance(_instance(part, name), contract)


@pytest.mark.parametrize("part,name", REGISTERED)
def test_a_second_registration_under_a_taken_name_is_refused_and_names_it(part: str, name: str) -> None:
    registry = ALL_REGISTRIES[part]
    original = registry[name]
    with pytest.raises(DuplicateRegistration, match=f"{registry.part} '{name}' is already registered"):
        registry.register(name, original)  # even the same implementation again
    assert registry[name] is original and list(registry).count(name) == 1


def test_a_registry_refuses_an_implementation_without_its_contracts_methods() -> None:
    from slaq.policy.accounting import Accounting, VirtualTokenCounters

    class ChargesOnly:
        def charge(self, tier: str, tenant: str, tokens: float) -> None: ...

    registry: Registry = Registry("accounting", Accounting)
    with pytest.raises(TypeError, match="'partial'.*no service_share, forget"):
        registry.register("partial", ChargesOnly)
    assert "partial" not in registry
    registry.register("vtc", VirtualTokenCounters)  # the control: a complete one is taken
    assert list(registry) == ["vtc"]


def test_a_registry_is_read_only_and_an_unknown_name_says_what_is_registered() -> None:
    with pytest.raises(TypeError):
        VICTIMS["other"] = VICTIMS["lowest-tier-cheapest"]  # type: ignore[index]
    with pytest.raises(KeyError, match="no step budget named 'fifo' \\(registered: stock, tpot\\)"):
        STEP_BUDGETS["fifo"]


def test_the_terms_keep_their_registration_order() -> None:
    """Formula 1 sums its terms in registration order: the order is part of the decisions."""
    assert list(TERMS) == ["urgency", "waiting", "length", "tier", "fairness"]


ENGINE_MODULE_PATH = re.compile(r"slaq\.engine(\.\w+)*(:\w+)?")


def engine_names(source: str) -> list[str]:
    """The engine modules `source` imports or names as a string for importlib, and importlib itself."""
    named: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            named.append(node.module or "")
        elif isinstance(node, ast.Import):
            named += [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and ENGINE_MODULE_PATH.fullmatch(node.value):
            named.append(node.value)
    return [name for name in named if name.startswith(("slaq.engine", "importlib"))]


def test_the_policy_package_names_no_engine_module() -> None:
    """Implementations register from the module that defines them: the policy package imports no
    engine module, nor names one for importlib."""
    import slaq.policy

    offenders = {path.name: engine_names(path.read_text()) for path in Path(slaq.policy.__file__).parent.rglob("*.py")}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_engine_name_scan_catches_a_registry_of_module_paths() -> None:
    old_registry = 'import importlib\nSTEP_BUDGETS = {"stock": "slaq.engine.step_budget:StockStepBudget"}\n'
    assert engine_names(old_registry) == ["importlib", "slaq.engine.step_budget:StockStepBudget"]
    assert engine_names('"""Budgets: see slaq.engine.scheduler for the caller."""\nfrom slaq.policy.registry import Registry\n') == []
