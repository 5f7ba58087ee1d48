"""Per-tenant demand and SLO outcomes over the last minute, for `GET /slaq/usage` on the metrics port
(the operator splits quotas with the demand). `TenantSLA.status.attainment` does not come from
here: the operator computes it from the `slaq_slo_outcomes` counters on /metrics
(operator/src/slaq/operator/attainment.py), which count since the sidecar started, not over a minute."""

from __future__ import annotations

from dataclasses import dataclass, field

from slaq.api.runtime import TenantUsage, UsageReport

WINDOW_S = 60


@dataclass(slots=True)
class _Window:
    """Per-second slots of a one-minute ring; a slot is cleared when its second comes round again."""

    seconds: list[int] = field(default_factory=lambda: [-1] * WINDOW_S)
    requests: list[float] = field(default_factory=lambda: [0.0] * WINDOW_S)
    tokens: list[float] = field(default_factory=lambda: [0.0] * WINDOW_S)
    refused: list[float] = field(default_factory=lambda: [0.0] * WINDOW_S)
    met: list[float] = field(default_factory=lambda: [0.0] * WINDOW_S)
    missed: list[float] = field(default_factory=lambda: [0.0] * WINDOW_S)

    def slot(self, now: float) -> int:
        second = int(now)
        i = second % WINDOW_S
        if self.seconds[i] != second:
            self.seconds[i] = second
            self.requests[i] = self.tokens[i] = self.refused[i] = self.met[i] = self.missed[i] = 0.0
        return i

    def totals(self, now: float) -> tuple[float, ...]:
        """Sums over the live slots of (requests, tokens, refused, met, missed)."""
        oldest = int(now) - WINDOW_S + 1
        live = [i for i, s in enumerate(self.seconds) if s >= oldest]
        return tuple(sum(series[i] for i in live) for series in (self.requests, self.tokens, self.refused, self.met, self.missed))


class UsageLog:
    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}

    def _window(self, tenant: str) -> _Window:
        window = self._windows.get(tenant)
        if window is None:
            window = self._windows[tenant] = _Window()
        return window

    def admitted(self, tenant: str, now: float) -> None:
        w = self._window(tenant)
        w.requests[w.slot(now)] += 1

    def refused(self, tenant: str, now: float) -> None:
        w = self._window(tenant)
        w.refused[w.slot(now)] += 1

    def tokens(self, tenant: str, count: int, now: float) -> None:
        w = self._window(tenant)
        w.tokens[w.slot(now)] += count

    def outcome(self, tenant: str, met: bool, now: float) -> None:
        """One finished request with objectives: it met them all, or missed one."""
        w = self._window(tenant)
        (w.met if met else w.missed)[w.slot(now)] += 1

    def report(self, pool: str, revision: str, concurrency: dict[str, int], now: float) -> UsageReport:
        tenants = {}
        for name, window in self._windows.items():
            requests, tokens, refused, met, missed = window.totals(now)
            tenants[name] = TenantUsage(
                requests_per_minute=requests, tokens_per_minute=tokens, refused_per_minute=refused,
                concurrency=concurrency.get(name, 0), slo_met_per_minute=met, slo_missed_per_minute=missed,
            )
        for name, count in concurrency.items():
            tenants.setdefault(name, TenantUsage(concurrency=count))
        return UsageReport(pool=pool, table_revision=revision, window_seconds=float(WINDOW_S), tenants=tenants)
