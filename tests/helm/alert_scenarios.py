"""`promtool test rules` files generated from the alerts the chart renders.

Each alert gets synthetic series (a sample a minute; every ten minutes for the day-long windows, to
keep promtool's run short) that should make it fire, and twins that
should not: a burn just below its rate, a burn that stopped before its short window, a tenant or
pool that is fine, and the moment just before its `for` has passed. Thresholds, windows and `for`
durations are read from the rendered rules, so the tests follow the chart's values.

What each scenario expects is worked out here from the series alone (errors and requests per
minute over each window, see `ErrorBudgetBurn.ratio`), not by evaluating PromQL, so promtool checks
the rules against an independent account of what they should say.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Iterable

BURN_ALERT = "SlaqErrorBudgetBurn"
REQUESTS_PER_MINUTE = 1000.0
NAMESPACE, POOL, POD = "team-a", "llama", "llama-0"
BURNING, CALM = ("acme", "standard", 0.99), ("calm", "critical", 0.999)  # (tenant, tier, attainment target)
FIRES, JUST_BELOW = 1.25, 0.8  # burn factors relative to an alert's rate

_UNITS = {"s": 1 / 60, "m": 1, "h": 60, "d": 1440}


def minutes(duration: str) -> int:
    match = re.fullmatch(r"(\d+)([smhd])", duration)
    if match is None:
        raise ValueError(f"not a Prometheus duration this generator reads: {duration!r}")
    return round(int(match[1]) * _UNITS[match[2]])


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def _counter(per_sample: Iterable[tuple[float, int]]) -> str:
    """promtool's expanding notation for a counter at 0 at the first sample that then grows by `rate`
    a sample for `n` samples, segment after segment (`a+bxn` is the n+1 values a, a+b, ... a+nb)."""
    segments: list[str] = []
    value = 0.0
    for rate, n in per_sample:
        if n <= 0:
            continue
        if not segments:
            segments.append(f"0+{rate:.12g}x{n}")  # samples 0..n
        else:
            segments.append(f"{value + rate:.12g}+{rate:.12g}x{n - 1}")  # the next n samples
        value += rate * n
    return " ".join(segments)


def _constant(value: float, n: int) -> str:
    return f"{value:.12g}x{n}"


@dataclass(frozen=True)
class ErrorBudgetBurn:
    """One rendered SlaqErrorBudgetBurn rule: long and short window (minutes), rate, severity."""

    long: int
    short: int
    rate: float
    labels: dict[str, str]

    def step(self) -> int:
        """Minutes between samples in this rule's cases: 10 once the long window is a day or more."""
        return 10 if self.long >= 1440 else 1

    @staticmethod
    def ratio(window: int, now: int, errors_per_minute: float, stop: int, step: int) -> float | None:
        """Errors over requests in [now - window, now] when errors ran from minute 0 to `stop`, with
        a sample every `step` minutes; None when the window holds fewer than two samples (rate() has
        nothing). A window longer than the series covers the series (rate() does not extrapolate a
        counter from 0 below zero)."""
        if window < step:
            return None
        assert window % step == 0 and now % step == 0 and stop % step == 0, (window, now, stop, step)
        start = max(0, now - window)
        burning = max(0, min(stop, now) - start)
        return errors_per_minute * burning / (REQUESTS_PER_MINUTE * (now - start))

    def fires(self, now: int, errors_per_minute: float, stop: int, budget: float, step: int) -> bool:
        threshold = self.rate * budget
        ratios = [self.ratio(w, now, errors_per_minute, stop, step) for w in (self.long, self.short)]
        return all(r is not None and r > threshold for r in ratios)


@dataclass(frozen=True)
class RatioAlert:
    """A rendered `... / (...) > ratio` alert held `for` a while (shedding, quota saturation)."""

    name: str
    ratio: float
    hold: int  # its `for`, minutes
    window: int  # the rate() window, minutes
    labels: dict[str, str]


def _ratio_alert(rule: dict[str, Any]) -> RatioAlert:
    (threshold,) = re.findall(r">\s*([0-9.]+)\s*$", rule["expr"].strip())
    windows = {minutes(w) for w in re.findall(r"\[(\w+)\]", rule["expr"])}
    assert len(windows) == 1, rule["expr"]
    return RatioAlert(rule["alert"], float(threshold), minutes(rule["for"]), windows.pop(), rule["labels"])


def burn_rules(rules: list[dict[str, Any]]) -> list[ErrorBudgetBurn]:
    burns = []
    for rule in rules:
        if rule.get("alert") == BURN_ALERT:
            (rate,) = set(re.findall(r"\(([0-9.]+) \* slaq:slo_error_budget\)", rule["expr"]))
            burns.append(ErrorBudgetBurn(minutes(rule["labels"]["long_window"]), minutes(rule["labels"]["short_window"]), float(rate), rule["labels"]))
    return burns


def without_annotations(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rules with their annotations left out: promtool compares an alert's annotations too, and
    these templates print the query's value; `promtool check rules` checks the templates."""
    stripped = copy.deepcopy(groups)
    for group in stripped:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return stripped


# The tests ---------------------------------------------------------------------------------------

def _burn_case(burns: list[ErrorBudgetBurn], rule: ErrorBudgetBurn, factor: float, stopped: bool, what: str) -> tuple[dict, set[str]]:
    """Tenant acme misses `factor` x `rule.rate` x its budget of its requests, evaluated at the rule's
    long window; `stopped`: the misses ended two samples before its short window."""
    tenant, tier, target = BURNING
    budget = 1 - target
    step, now = rule.step(), rule.long
    stop = now - rule.short - 2 * step if stopped else now
    errors = REQUESTS_PER_MINUTE * budget * rule.rate * factor
    firing = [b for b in burns if b.fires(now, errors, stop, budget, step)]
    base = {"namespace": NAMESPACE, "pool": POOL, "pod": POD}
    burning, after = stop // step, (now - stop) // step
    series = [
        _series("slaq_slo_outcomes_total", {**base, "tenant": tenant, "tier": tier, "outcome": "ttft_missed"}, _counter([(errors * step, burning), (0, after)])),
        _series("slaq_slo_outcomes_total", {**base, "tenant": tenant, "tier": tier, "outcome": "met"},
                _counter([((REQUESTS_PER_MINUTE - errors) * step, burning), (REQUESTS_PER_MINUTE * step, after)])),
        _series("slaq_attainment_target", {**base, "tenant": tenant, "tier": tier}, _constant(target, now // step)),
    ]
    calm_tenant, calm_tier, calm_target = CALM  # the negative control inside every case
    series += [
        _series("slaq_slo_outcomes_total", {**base, "tenant": calm_tenant, "tier": calm_tier, "outcome": "ttft_missed"}, _constant(0, now // step)),
        _series("slaq_slo_outcomes_total", {**base, "tenant": calm_tenant, "tier": calm_tier, "outcome": "met"},
                _counter([(REQUESTS_PER_MINUTE * step, now // step)])),
        _series("slaq_attainment_target", {**base, "tenant": calm_tenant, "tier": calm_tier}, _constant(calm_target, now // step)),
    ]
    expected = [{"exp_labels": {"namespace": NAMESPACE, "tenant": tenant, "tier": tier, **b.labels}} for b in firing]
    test = {"name": f"{BURN_ALERT} {rule.labels['long_window']}/{rule.labels['short_window']}: {what}", "interval": f"{step}m",
            "input_series": series, "alert_rule_test": [{"eval_time": f"{now}m", "alertname": BURN_ALERT, "exp_alerts": expected}]}
    return test, {f"{b.labels['long_window']}/{b.labels['short_window']}" for b in firing}


def burn_tests(rules: list[dict[str, Any]]) -> tuple[dict[int, list[dict]], dict[str, set[str]]]:
    """Three cases per burn rule, by sample step; and, per rule and case, the rules that fire in it
    (for the test to check that each fires at its rate and is silent just below it and once the
    burn stopped)."""
    burns = burn_rules(rules)
    tests: dict[int, list[dict]] = {}
    outcome = {}
    for rule in burns:
        key = f"{rule.labels['long_window']}/{rule.labels['short_window']}"
        for factor, stopped, what in ((FIRES, False, "fires"), (JUST_BELOW, False, "just_below"), (FIRES, True, "stopped")):
            test, firing = _burn_case(burns, rule, factor, stopped, what)
            tests.setdefault(rule.step(), []).append(test)
            outcome[f"{key} {what}"] = firing
    return tests, outcome


def engine_down_test(rule: dict[str, Any]) -> dict:
    hold = minutes(rule["for"])
    up, down = 10, hold + 5
    now = up + down
    base = {"namespace": NAMESPACE, "pool": POOL}
    series = [
        _series("slaq_sidecar_engine_up", {**base, "pod": "down"}, f"1x{up - 1} 0x{down}"),
        _series("slaq_sidecar_engine_up", {**base, "pod": "up"}, _constant(1, now)),
        _series("slaq_sidecar_engine_up", {**base, "pod": "blip"}, f"1x{now - hold + 1} 0x{hold - 2}"),  # down, not for long enough
    ]
    fired = {"exp_labels": {**base, "pod": "down", **rule["labels"]}}
    return {"name": "SlaqEngineDown", "interval": "1m", "input_series": series, "alert_rule_test": [
        {"eval_time": f"{up + hold - 2}m", "alertname": "SlaqEngineDown", "exp_alerts": []},  # down, still pending
        {"eval_time": f"{now}m", "alertname": "SlaqEngineDown", "exp_alerts": [fired]},
    ]}


def shedding_test(rule: dict[str, Any]) -> dict:
    alert = _ratio_alert(rule)
    now = alert.window + alert.hold + 5
    series = []
    for pool, reason, share in (("short", "shedding", 2 * alert.ratio), ("enough", "shedding", alert.ratio / 2),
                                ("quota", "request_rate", 2 * alert.ratio)):  # 429s are not for want of capacity
        labels = {"namespace": NAMESPACE, "pool": pool, "pod": f"{pool}-0"}
        refused = REQUESTS_PER_MINUTE * share
        series.append(_series("slaq_rejections_total", {**labels, "reason": reason, "tier": "batch"}, _counter([(refused, now)])))
        series.append(_series("slaq_requests_total", {**labels, "tenant": "acme", "tier": "batch", "code": "200"},
                              _counter([(REQUESTS_PER_MINUTE - refused, now)])))
    fired = {"exp_labels": {"namespace": NAMESPACE, "pool": "short", **alert.labels}}
    return {"name": alert.name, "interval": "1m", "input_series": series, "alert_rule_test": [
        {"eval_time": f"{alert.hold}m", "alertname": alert.name, "exp_alerts": []},  # true since minute 1: still pending
        {"eval_time": f"{now}m", "alertname": alert.name, "exp_alerts": [fired]},
    ]}


def quota_saturation_test(rule: dict[str, Any]) -> dict:
    alert = _ratio_alert(rule)
    now = alert.window + alert.hold + 5
    series = []
    for tenant, share in (("greedy", 2 * alert.ratio), ("modest", alert.ratio / 2)):
        labels = {"namespace": NAMESPACE, "pool": POOL, "pod": POD, "tenant": tenant, "tier": "standard"}
        refused = REQUESTS_PER_MINUTE * share
        series.append(_series("slaq_quota_refusals_total", {**labels, "quota": "request_rate"}, _counter([(refused, now)])))
        series.append(_series("slaq_requests_total", {**labels, "code": "200"}, _counter([(REQUESTS_PER_MINUTE - refused, now)])))
    fired = {"exp_labels": {"namespace": NAMESPACE, "tenant": "greedy", "tier": "standard", **alert.labels}}
    return {"name": alert.name, "interval": "1m", "input_series": series, "alert_rule_test": [
        {"eval_time": f"{alert.hold}m", "alertname": alert.name, "exp_alerts": []},  # true since minute 1: still pending
        {"eval_time": f"{now}m", "alertname": alert.name, "exp_alerts": [fired]},
    ]}


POOL_ALERT_TESTS = {"SlaqEngineDown": engine_down_test, "SlaqSustainedShedding": shedding_test, "SlaqQuotaSaturation": quota_saturation_test}


def unit_tests(groups: list[dict[str, Any]], rule_file: str) -> tuple[dict[str, dict], dict[str, set[str]]]:
    """The promtool test files (name -> content; one per rule evaluation interval) for every alert
    in `groups`, and the burn cases' firing sets. An alert this generator has no scenario for is an
    error: a new alert needs its test written."""
    rules = [r for g in groups for r in g["rules"]]
    by_step, outcome = burn_tests(rules)
    for rule in rules:
        if "alert" not in rule or rule["alert"] == BURN_ALERT:
            continue
        if rule["alert"] not in POOL_ALERT_TESTS:
            raise KeyError(f"no promtool scenario for alert {rule['alert']}: add one to tests/helm/alert_scenarios.py")
        by_step.setdefault(1, []).append(POOL_ALERT_TESTS[rule["alert"]](rule))
    # Groups in the chart's order, recording rules first: promtool's own order is a map's, and an
    # alert evaluated before the recording it reads sees the previous step's value, which is past
    # Prometheus' 5-minute lookback at a 10-minute step.
    order = [g["name"] for g in groups]
    files = {f"tests-{step}m.yaml": {"rule_files": [rule_file], "evaluation_interval": f"{step}m", "group_eval_order": order, "tests": tests}
             for step, tests in sorted(by_step.items())}
    return files, outcome
