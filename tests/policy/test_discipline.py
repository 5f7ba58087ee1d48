"""The queue discipline and its two hosts: where the release gate, KV and batch slots do not bind,
the sidecar releases in exactly the order the engine admits. The batch requests here have no TTFT
objective: one whose objective has passed the sidecar sheds (tests/sidecar/test_queue.py) where
the engine would admit it to miss, and that is the one intended difference."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from slaq.api.common import Tier
from slaq.api.pool import SchedulerSpec
from slaq.policy import PodPolicy
from slaq.policy.discipline import Discipline, TieredQueue, first_token_lead
from slaq.policy.views import PoolView, RequestView
from slaq.sidecar.queue import Dispatcher, QueuedRequest, RequestQueue
from slaq.sidecar.release import ReleaseGate

from tests.engine.harness import make_request, waiting_queue

NOW = 1_000_000.0
MAX_LENGTH = 4096

waiting_request = st.tuples(
    st.sampled_from(list(Tier)),
    st.floats(0.0, 90.0),  # seconds waited: past the 60 s aging bound for some
    st.sampled_from([None, 500.0, 2000.0, 60_000.0]),
    st.integers(1, 6000),  # prompt tokens
    st.integers(1, 600),  # predicted output
    st.sampled_from(["t0", "t1", "t2"]),
)


@settings(max_examples=120, deadline=None)
@given(
    waiting=st.lists(waiting_request, min_size=1, max_size=40),
    load=st.floats(0.0, 1.0),
    lead_s=st.sampled_from([None, 0.05, 0.8]),
    charges=st.lists(st.tuples(st.sampled_from(list(Tier)), st.sampled_from(["t0", "t1", "t2"]), st.integers(1, 5000)), max_size=8),
    aged_share=st.sampled_from([0.0, 0.25, 1.0]),
)
def test_the_sidecar_releases_in_the_engines_admission_order(waiting, load, lead_s, charges, aged_share) -> None:
    spec = SchedulerSpec.model_validate({"queue": {"agedShare": aged_share}})
    engine_policy, sidecar_policy = PodPolicy.from_spec(spec), PodPolicy.from_spec(spec)
    for tier, tenant, tokens in charges:  # both containers counted the same service
        engine_policy.accounting.charge(tier.value, tenant, tokens)
        sidecar_policy.accounting.charge(tier.value, tenant, tokens)
    lead = None if lead_s is None else (lambda view: first_token_lead(lead_s, view.prompt_tokens, 2048))

    engine = waiting_queue(spec, engine_policy, max_length_tokens=MAX_LENGTH, load=load)
    engine.lead = lead
    by_id: dict[str, int] = {}
    waiting = [(tier, waited, None if tier is Tier.BATCH else ttft_ms, prompt, output, tenant)
               for tier, waited, ttft_ms, prompt, output, tenant in waiting]
    for index, (tier, waited, ttft_ms, prompt, output, tenant) in enumerate(waiting):
        request = make_request(tier, tenant=tenant, prompt_tokens=prompt, max_tokens=output, ttft_ms=ttft_ms, arrival=NOW - waited)
        engine.add_request(request)
        by_id[request.request_id] = index
    engine.begin_step(NOW)
    admitted = [by_id[engine.pop_request().request_id] for _ in range(len(waiting))]

    accounting = sidecar_policy.accounting

    def current_view(entry: QueuedRequest) -> RequestView:
        return dataclasses.replace(entry.view, tenant_service_share=accounting.service_share(entry.view.tier.value, entry.view.tenant))

    queue = RequestQueue(sidecar_policy.ranking, sidecar_policy.discipline, current_view)
    queue.tiers.lead = lead
    pool = PoolView(load=load, max_length_tokens=MAX_LENGTH, aging_bound_s=spec.aging_bound_seconds)
    dispatcher = Dispatcher(queue, ReleaseGate(engine_queue_target=10**9), lambda: pool, lambda: NOW)
    entries: dict[int, int] = {}
    for index, (tier, waited, ttft_ms, prompt, output, tenant) in enumerate(waiting):
        if ttft_ms is None and tier is Tier.CRITICAL:
            ttft_ms = 500.0  # as make_request (and a critical tenant's table entry) gives it
        entry = QueuedRequest(RequestView(tier=tier, arrival=NOW - waited, ttft_ms=ttft_ms, prompt_tokens=prompt, predicted_output=output, tenant=tenant))
        entries[id(entry)] = index
        dispatcher.enqueue(entry)
    released: list[int] = []

    def started_at_once(entry: QueuedRequest) -> None:  # slots and KV do not bind: the engine starts what it gets
        released.append(entries[id(entry)])
        dispatcher.gate.on_first_byte(entry.view.tier.rank)

    dispatcher.on_release = started_at_once
    assert dispatcher.pump() == len(waiting)

    assert released == admitted


def test_a_starving_backlog_gets_its_share_and_no_more() -> None:
    """40 requests past the aging bound against 40 attainable higher-tier ones: the first choice is
    starving (no share taken yet), and over 40 choices the starving ones get about `agedShare`."""
    spec = SchedulerSpec.model_validate({"agingBoundSeconds": 10.0, "queue": {"agedShare": 0.4, "agedShareAlpha": 0.2}})
    policy = PodPolicy.from_spec(spec)
    queue: TieredQueue[RequestView] = TieredQueue(policy.ranking, policy.discipline, lambda view: view, id)
    starving = [RequestView(Tier.BATCH, NOW - 11 - i * 0.01, None, 100, 100) for i in range(40)]
    fresh = [RequestView(Tier.STANDARD, NOW - i * 0.001, 2000.0, 100, 100) for i in range(40)]
    for view in starving + fresh:
        queue.push(view)
    queue.begin(NOW, PoolView(load=1.0, max_length_tokens=MAX_LENGTH, aging_bound_s=10.0))
    chosen = [queue.take(queue.choose()) for _ in range(40)]
    share = sum(view in starving for view in chosen) / len(chosen)
    assert chosen[0] in starving
    assert 0.3 <= share <= 0.5


def test_the_discipline_reads_its_constants_from_the_pool_spec() -> None:
    spec = SchedulerSpec.model_validate({"queue": {"agedShare": 0.1, "agedShareAlpha": 0.2, "rekeyHead": 9, "leadExemptTiers": 0}})
    assert Discipline.from_spec(spec) == Discipline(aged_share=0.1, aged_share_alpha=0.2, rekey_head=9, lead_exempt_tiers=0)
    assert PodPolicy.from_spec(spec).discipline == Discipline.from_spec(spec)
    assert Discipline.from_spec(SchedulerSpec()) == Discipline()  # today's values are the defaults


def test_a_critical_request_nearer_its_deadline_than_its_lead_stays_attainable_unless_no_tier_is_exempt() -> None:
    for exempt, expected_missed in ((1, 0), (0, 1)):
        spec = SchedulerSpec.model_validate({"queue": {"leadExemptTiers": exempt}})
        policy = PodPolicy.from_spec(spec)
        queue: TieredQueue[RequestView] = TieredQueue(policy.ranking, policy.discipline, lambda view: view, id)
        queue.lead = lambda view: 0.2
        queue.push(RequestView(Tier.CRITICAL, NOW - 0.4, 500.0, 100, 100))  # 0.1 s to its deadline
        queue.begin(NOW, PoolView(load=0.5, max_length_tokens=MAX_LENGTH, aging_bound_s=60.0))
        choice = queue.choose()
        assert choice is not None and choice.missed == bool(expected_missed)
        assert queue.missed_depth(Tier.CRITICAL.rank) == expected_missed


def _views_queue(spec: SchedulerSpec | None = None) -> TieredQueue[RequestView]:
    policy = PodPolicy.from_spec(spec or SchedulerSpec())
    return TieredQueue(policy.ranking, policy.discipline, lambda view: view, id)


POOL = PoolView(load=0.5, max_length_tokens=MAX_LENGTH, aging_bound_s=60.0)


def test_a_passed_over_item_stays_queued_out_of_the_choice_until_restored() -> None:
    queue = _views_queue()
    first, second = RequestView(Tier.STANDARD, NOW - 1.0, 2000.0, 100, 100), RequestView(Tier.STANDARD, NOW - 0.5, 2000.0, 100, 100)
    queue.push(first)
    queue.push(second)
    queue.begin(NOW, POOL)
    choice = queue.choose()
    assert choice is not None and choice.item is first
    queue.pass_over(choice)
    assert (len(queue), queue.depth(Tier.STANDARD.rank), queue.passed_over, queue.passes) == (2, 2, 1, 1)
    assert list(queue.items()) == [first, second]  # a snapshot still lists it, in its place
    assert queue.choose().item is second  # type: ignore[union-attr]
    queue.restore_passed()
    assert (queue.passed_over, queue.passes) == (0, 0)
    assert queue.choose().item is first  # type: ignore[union-attr]


def test_a_passed_over_item_pushed_again_or_removed_no_longer_counts_as_passed_over() -> None:
    queue = _views_queue()
    views = [RequestView(Tier.BATCH, NOW - i, None, 100, 100) for i in (3.0, 2.0, 1.0)]
    for view in views:
        queue.push(view)
    queue.begin(NOW, POOL)
    for _ in range(2):
        queue.pass_over(queue.choose())  # type: ignore[arg-type]
    queue.put_back_ahead(views[0])  # the engine re-adds a request it preempted
    assert queue.discard(views[1])
    assert (len(queue), queue.passed_over, queue.passes) == (2, 0, 2)
    assert queue.choose().item is views[0]  # type: ignore[union-attr]
    queue.restore_passed()  # the lapsed entries stay out
    assert list(queue.items()) == [views[0], views[2]]


def test_peek_heads_reads_the_protected_tiers_without_taking_anything() -> None:
    queue = _views_queue()
    critical = RequestView(Tier.CRITICAL, NOW - 0.1, 500.0, 100, 100)
    late = RequestView(Tier.STANDARD, NOW - 5.0, 2000.0, 100, 100)  # its deadline has passed: missed
    soon = RequestView(Tier.STANDARD, NOW - 0.2, 2000.0, 100, 100)
    batch = RequestView(Tier.BATCH, NOW - 30.0, 60_000.0, 100, 100)
    for view in (batch, late, soon, critical):
        queue.push(view)
    queue.begin(NOW, POOL)
    assert queue.peek_heads(5, lambda view: True) == [critical, soon, late]  # attainable tier by tier, then missed
    assert queue.peek_heads(1, lambda view: view.tier is Tier.STANDARD) == [soon]
    assert (len(queue), queue.missed_depth(Tier.STANDARD.rank)) == (4, 1)
    assert [queue.take(queue.choose()) for _ in range(4)] == [critical, soon, late, batch]  # type: ignore[arg-type]


def test_expired_head_is_the_waiting_head_past_its_deadline_and_never_one_put_back_ahead() -> None:
    queue = _views_queue()
    expired = RequestView(Tier.BATCH, NOW - 70.0, 60_000.0, 100, 100)
    fresh = RequestView(Tier.BATCH, NOW - 1.0, 60_000.0, 100, 100)
    queue.push(fresh)
    queue.begin(NOW, POOL)
    assert queue.expired_head(Tier.BATCH.rank, NOW) is None
    queue.push(expired)
    assert queue.expired_head(Tier.BATCH.rank, NOW) is expired
    assert queue.expired_head(Tier.BATCH.rank, NOW - 11.0) is None  # at that time its deadline was ahead
    queue.put_back_ahead(fresh)
    assert queue.expired_head(Tier.BATCH.rank, NOW) is None  # the head is ahead of its tier: not shed


@settings(max_examples=150, deadline=None)
@given(
    arrivals=st.lists(st.tuples(st.sampled_from(list(Tier)), st.floats(0.0, 90.0), st.sampled_from([None, 500.0, 2000.0]),
                                st.sampled_from(["t0", "t1", "t2"])), min_size=1, max_size=30),
    steps=st.lists(st.tuples(st.sampled_from(["take", "pass", "charge", "discard", "ahead", "push"]),
                             st.integers(0, 29), st.sampled_from(list(Tier)), st.integers(1, 500)), max_size=40),
    rekey_head=st.sampled_from([1, 2, 4]),
)
def test_a_head_refreshed_only_when_its_tiers_shares_moved_chooses_as_one_refreshed_every_step(arrivals, steps, rekey_head) -> None:
    """Two queues over the same requests and the same service counts, stepped alike: one refreshes every
    head at every `begin`, the other only where its host's key token (`Accounting.version`) moved or a
    live entry left the heap. Every choice is the same."""
    spec = SchedulerSpec.model_validate({"queue": {"rekeyHead": rekey_head}})
    policy = PodPolicy.from_spec(spec)
    accounting = policy.accounting
    base = [RequestView(tier, NOW - waited, ttft, 100, 100, tenant=tenant) for tier, waited, ttft, tenant in arrivals]

    def view_of(index: int) -> RequestView:
        view = base[index]
        return dataclasses.replace(view, tenant_service_share=accounting.service_share(view.tier.value, view.tenant))

    refreshed = {"always": 0, "tokens": 0}

    def counted(name: str):
        def view(index: int) -> RequestView:
            refreshed[name] += 1
            return view_of(index)
        return view

    always: TieredQueue[int] = TieredQueue(policy.ranking, policy.discipline, counted("always"), lambda index: index)
    tokens: TieredQueue[int] = TieredQueue(policy.ranking, policy.discipline, counted("tokens"), lambda index: index)
    queues = (always, tokens)
    for index in range(len(base)):
        for queue in queues:
            queue.push(index)
    clock = NOW

    def begin() -> None:
        always.begin(clock, POOL)
        tokens.begin(clock, POOL, [accounting.version(tier.value) for tier in Tier])

    begin()
    for verb, index, tier, tokens_served in steps:
        index %= len(base)
        if verb == "charge":
            accounting.charge(tier.value, base[index].tenant, tokens_served)
            clock += 0.01
            for queue in queues:
                queue.restore_passed()
            begin()
        elif verb in ("take", "pass"):
            choices = [queue.choose() for queue in queues]
            assert (choices[0] is None) == (choices[1] is None)
            if choices[0] is None:
                continue
            assert choices[0].item == choices[1].item
            for queue, choice in zip(queues, choices):
                queue.take(choice) if verb == "take" else queue.pass_over(choice)
        elif verb == "discard":
            assert always.discard(index) == tokens.discard(index)
        else:
            for queue in queues:
                queue.put_back_ahead(index) if verb == "ahead" else queue.push(index)
        if verb in ("take", "discard", "ahead", "push"):
            clock += 0.01
            for queue in queues:
                queue.restore_passed()
            begin()
    orders = []
    for queue in queues:
        queue.restore_passed()
        order = []
        while (choice := queue.choose()) is not None:
            order.append(queue.take(choice))
        orders.append(order)
    assert orders[0] == orders[1]
    assert refreshed["tokens"] <= refreshed["always"]


def test_a_heap_whose_shares_did_not_move_is_not_refreshed_again() -> None:
    policy = PodPolicy.from_spec(SchedulerSpec())
    calls: list[RequestView] = []
    queue: TieredQueue[RequestView] = TieredQueue(policy.ranking, policy.discipline, lambda view: calls.append(view) or view, id)
    views = [RequestView(Tier.BATCH, NOW - i, None, 100, 100, tenant="t0") for i in range(6)]
    for view in views:
        queue.push(view)
    versions = lambda: [policy.accounting.version(tier.value) for tier in Tier]  # noqa: E731
    queue.begin(NOW, POOL, versions())
    calls.clear()
    queue.begin(NOW + 1, POOL, versions())
    assert calls == []  # nothing moved
    policy.accounting.charge(Tier.STANDARD.value, "t0", 10)
    queue.begin(NOW + 2, POOL, versions())
    assert calls == []  # another tier's shares moved
    policy.accounting.charge(Tier.BATCH.value, "t0", 10)
    queue.begin(NOW + 3, POOL, versions())
    assert len(calls) == policy.discipline.rekey_head  # its head is refreshed
    queue.take(queue.choose())  # type: ignore[arg-type]
    calls.clear()
    queue.begin(NOW + 4, POOL, versions())
    assert len(calls) == policy.discipline.rekey_head  # an entry left: the next ones are refreshed


@given(
    arrivals=st.lists(st.tuples(st.sampled_from(list(Tier)), st.floats(0.0, 90.0), st.sampled_from([None, 500.0, 2000.0]),
                                st.integers(1, 6000)), min_size=1, max_size=30),
    verbs=st.lists(st.sampled_from(["take", "take", "pass", "push", "ahead"]), max_size=40),
    lead_s=st.sampled_from([None, 0.05, 0.8]),
)
def test_heads_ranked_once_between_begins_choose_as_heads_ranked_afresh(arrivals, verbs, lead_s) -> None:
    """Between two `begin` calls a head's Choice (its rank class) is built once: a queue that begins
    once chooses, takes, passes over and pushes exactly as one that begins again (same clock,
    nothing to refresh) before every choice, and reads fewer views."""
    views = [RequestView(tier, NOW - waited, None if tier is Tier.BATCH else ttft, prompt, 100) for tier, waited, ttft, prompt in arrivals]
    read = {"once": 0, "afresh": 0}

    def counted(name: str):
        def view_of(view: RequestView) -> RequestView:
            read[name] += 1
            return view
        return view_of

    policy = PodPolicy.from_spec(SchedulerSpec())
    once: TieredQueue[RequestView] = TieredQueue(policy.ranking, policy.discipline, counted("once"), id)
    afresh: TieredQueue[RequestView] = TieredQueue(policy.ranking, policy.discipline, counted("afresh"), id)
    tokens = [0] * len(Tier)  # nothing a key is computed from moves
    for queue in (once, afresh):
        queue.lead = None if lead_s is None else (lambda view: first_token_lead(lead_s, view.prompt_tokens, 2048))
        for view in views:
            queue.push(view)
        queue.begin(NOW, POOL, tokens)
    pushed = 0
    for verb in [*verbs, *["take"] * (len(views) + len(verbs))]:
        afresh.begin(NOW, POOL, tokens)
        if verb in ("push", "ahead"):
            view = views[pushed % len(views)]
            pushed += 1
            for queue in (once, afresh):
                queue.push(view) if verb == "push" else queue.put_back_ahead(view)
            continue
        choices = [queue.choose() for queue in (once, afresh)]
        assert (choices[0] is None) == (choices[1] is None)
        if choices[0] is None:
            break
        assert (choices[0].item, choices[0].rank_class, choices[0].missed) == (choices[1].item, choices[1].rank_class, choices[1].missed)
        for queue, choice in zip((once, afresh), choices):
            queue.take(choice) if verb == "take" else queue.pass_over(choice)
    assert len(once) == len(afresh) and read["once"] <= read["afresh"]
