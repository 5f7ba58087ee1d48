"""SLO attainment per tenant over a rolling window, and the `AtRisk` verdict drawn from it.

Source: every sidecar's cumulative counter `slaq_slo_outcomes_total{tenant, tier, outcome}` (and
its `_created` timestamp), read from the metrics port on each usage tick (usage.py). Counters,
not the usage report's per-minute figures, because ticks overlap those minutes: a counter's
increase between two ticks counts each finished request exactly once.

How an increase is taken, per series on one pod (`increase`):
- seen at the previous tick: `value - previous`; a counter that went down or whose `_created`
  changed was restarted (sidecar restart), so its whole value is new;
- first seen: its whole value when the series began since the pod's previous reading (its
  `_created`; a pod first seen: since the pool's previous tick; without `_created`: the pod was
  already known), else nothing: its history is of unknown age (an operator restart, a pod first
  seen, a tenant just bound to the pool) and becomes the baseline. Since the pod's own reading,
  not the pool's last tick: a series created just before a tick the pod missed is still new.

`_created` is the sidecar's clock, the tick's time the operator's: a series counts as new when
it began at most `CLOCK_MARGIN_S` before that time, so a sidecar's node whose clock runs a little
behind the operator's (more than the read takes to reach it) does not lose a series created just
after a read. Counted whole then is at most what a series of that age holds.

A pod whose metrics could not be read at a tick (its usage answered, `/metrics` did not: outcomes
None) keeps its last reading, as a pod that missed the tick does: read as empty, every series
would be first seen at its next reading and what it counted in between would become baseline.

The ledger sums increases over all pods of all pools per tenant, stamped with the tick's time;
attainment is met / (met + missed) over the last `window_s` seconds (default 10 minutes).
Pure functions below; `AttainmentLedger` only keeps the last readings and the window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from slaq.api.tenant import TenantSLA

WINDOW_S = 600.0
CLOCK_MARGIN_S = 5.0  # how far a sidecar's clock may lag the operator's (module doc)
MIN_REQUESTS = 20  # fewer finished requests with objectives in the window: no verdict (Unknown)
MET = "met"  # every other outcome label (ttft_missed, tpot_missed, e2e_missed) is a miss


@dataclass(frozen=True)
class OutcomeCounter:
    """One `slaq_slo_outcomes_total` series on one pod."""

    value: float
    created: float | None = None  # the series' `_created` (Unix seconds), when exported


SeriesKey = tuple[str, str, str]  # (tenant, tier, outcome)


@dataclass(frozen=True)
class Outcomes:
    met: float = 0.0
    missed: float = 0.0

    @property
    def total(self) -> float:
        return self.met + self.missed

    @property
    def attainment(self) -> float | None:
        return round(self.met / self.total, 4) if self.total > 0 else None

    def __add__(self, other: "Outcomes") -> "Outcomes":
        return Outcomes(self.met + other.met, self.missed + other.missed)


def increase(previous: OutcomeCounter | None, current: OutcomeCounter, *, new_since: float | None, pod_known: bool) -> float:
    """What one counter grew by since the previous tick (rules in the module docstring)."""
    if previous is not None:
        restarted = current.value < previous.value or (
            current.created is not None and previous.created is not None and current.created != previous.created)
        return current.value if restarted else current.value - previous.value
    if current.created is not None:
        return current.value if new_since is not None and current.created >= new_since else 0.0
    return current.value if pod_known else 0.0


def pod_increases(previous: Mapping[SeriesKey, OutcomeCounter] | None, current: Mapping[SeriesKey, OutcomeCounter],
                  new_since: float | None) -> dict[str, Outcomes]:
    """Per tenant, the outcomes one pod finished since the previous tick (`previous` None: pod first seen)."""
    per_tenant: dict[str, Outcomes] = {}
    for key, counter in current.items():
        tenant, _tier, outcome = key
        grown = increase((previous or {}).get(key), counter, new_since=new_since, pod_known=previous is not None)
        if grown > 0:
            delta = Outcomes(met=grown) if outcome == MET else Outcomes(missed=grown)
            per_tenant[tenant] = per_tenant.get(tenant, Outcomes()) + delta
    return per_tenant


@dataclass(frozen=True)
class Verdict:
    """The `AtRisk` condition's status, reason and message; status None: keep the recorded
    condition (the caller falls back to Unknown when there is none)."""

    status: str | None
    reason: str
    message: str

    @property
    def at_risk(self) -> bool:
        return self.status == "True"


def _window_words(window_s: float) -> str:
    minutes, seconds = divmod(int(window_s), 60)
    return f"{minutes}m" if seconds == 0 else f"{minutes}m{seconds}s"


def judge(tenant: TenantSLA, outcomes: Outcomes, *, window_s: float, min_requests: int, warming: bool) -> Verdict:
    """Whether the tenant's attainment over the window is below its `attainmentTarget`.

    `warming`: the ledger has not yet watched a whole window (the operator just started), so too
    few requests says nothing new: status None, keep the recorded condition."""
    objectives = tenant.spec.objectives
    if objectives.ttft_ms is None and objectives.tpot_ms is None:
        return Verdict("False", "NoObjectives", "the tenant has no latency objectives to attain")
    target, window = objectives.attainment_target, _window_words(window_s)
    total = int(outcomes.total)
    if total < min_requests:
        return Verdict(None if warming else "Unknown", "TooFewRequests",
                       f"{total} request(s) with objectives finished in the last {window}; "
                       f"at least {min_requests} are needed to judge attainment")
    attainment = outcomes.attainment or 0.0
    words = (f"{attainment:.2%} of {total} request(s) in the last {window} met the objectives "
             f"(target {target:.2%}; {int(outcomes.missed)} missed)")
    if attainment < target:
        return Verdict("True", "AttainmentBelowTarget", words)
    return Verdict("False", "AttainmentMet", words)


@dataclass
class _PodReading:
    series: dict[SeriesKey, OutcomeCounter]
    seen_at: float


@dataclass
class AttainmentLedger:
    """Last counter readings per pool and pod, and each tenant's increases over the window."""

    window_s: float = WINDOW_S
    started_at: float | None = None
    _pods: dict[str, dict[str, _PodReading]] = field(default_factory=dict)
    _ticks: dict[str, float] = field(default_factory=dict)
    _log: dict[str, deque[tuple[float, Outcomes]]] = field(default_factory=dict)

    def record(self, pool: str, readings: Iterable[tuple[str, Mapping[SeriesKey, OutcomeCounter] | None]], now: float) -> set[str]:
        """One tick of a pool: (pod name, its outcome counters, None when they could not be read)
        for every pod that answered; `now` is when the tick's read began, no later: a series is
        new at the pod's next reading when its `_created` is at or after this, so a stamp taken
        after the read would lose a series created between the read and the stamp.

        Returns the tenants whose window lost increases as it moved on: their attainment changed
        though no pod may report them any more (their traffic stopped, their pods restarted), so
        the caller judges them again rather than leave a verdict of an empty window standing."""
        if self.started_at is None:
            self.started_at = now
        pods = self._pods.setdefault(pool, {})
        pool_tick = self._ticks.get(pool)
        for pod, series in readings:
            if series is None:
                continue  # not read: the pod keeps its last reading (module doc)
            before = pods.get(pod)
            new_since = before.seen_at if before is not None else pool_tick
            if new_since is not None:
                new_since -= CLOCK_MARGIN_S
            for tenant, grown in pod_increases(before.series if before else None, series, new_since).items():
                self._log.setdefault(tenant, deque()).append((now, grown))
            pods[pod] = _PodReading(dict(series), now)
        # A pod silent for a whole window is gone; one that missed a tick keeps its last reading.
        for pod in [p for p, r in pods.items() if now - r.seen_at > self.window_s]:
            del pods[pod]
        self._ticks[pool] = now
        aged: set[str] = set()
        for tenant in list(self._log):  # deleted tenants are asked no more: their increases age out here
            before = len(self._log[tenant])
            if len(self._prune(tenant, now)) < before:
                aged.add(tenant)
        return aged

    def _prune(self, tenant: str, now: float) -> deque[tuple[float, Outcomes]]:
        log = self._log.get(tenant, deque())
        while log and now - log[0][0] > self.window_s:
            log.popleft()
        if not log:
            self._log.pop(tenant, None)
        return log

    def forget_pool(self, pool: str) -> None:
        """A deleted pool's readings go; what its pods finished stays in the window."""
        self._pods.pop(pool, None)
        self._ticks.pop(pool, None)

    def outcomes(self, tenant: str, now: float) -> Outcomes:
        total = Outcomes()
        for _, grown in self._prune(tenant, now):
            total = total + grown
        return total

    def warming(self, now: float) -> bool:
        return self.started_at is None or now - self.started_at < self.window_s
