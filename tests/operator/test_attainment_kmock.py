"""TenantSLA.status.attainment and the AtRisk condition follow the sidecars' SLO counters (operator on kmock)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from slaq.api.runtime import UsageReport
from slaq.operator.attainment import OutcomeCounter
from slaq.operator.usage import PodObservation, StaticUsageSource
from tests.operator.test_operator_kmock import TENANTS, operator, seed
from slaq.testing.kube import KubeEmulator
from tests.support.polling import eventually

POOL = "inference/llama3-8b"
KUBECTL = shutil.which("kubectl")
TENANT_CRD = Path(__file__).resolve().parents[2] / "crds" / "slaq.dev_tenantslas.yaml"


async def kubectl_columns(kube: KubeEmulator, *names: str) -> list[list[str]]:
    """`kubectl get tenantslas` with the CRD's own printer-column JSONPaths (client-side, so the
    emulator needs no Table support): proves the columns point at what the operator writes."""
    columns = {c["name"]: c["jsonPath"] for c in yaml.safe_load(TENANT_CRD.read_text())["spec"]["versions"][0]["additionalPrinterColumns"]}
    spec = ",".join(["NAME:.metadata.name", *(f"{n.upper()}:{columns[n]}" for n in names)])
    process = await asyncio.create_subprocess_exec(
        KUBECTL or "kubectl", "--kubeconfig", str(kube.kubeconfig), "get", "tenantslas", "-o", f"custom-columns={spec}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "HOME": str(kube.kubeconfig.parent)})
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    return [line.split() for line in out.decode().splitlines()]


class CountingUsage(StaticUsageSource):
    """The static source, counting the operator's polls: a change made before the first poll
    would become the operator's baseline and never count."""

    def __init__(self, observations: dict[str, list[PodObservation]]) -> None:
        super().__init__(observations)
        self.polls = 0

    async def observe(self, pool: Any) -> list[PodObservation]:
        seen = list(await super().observe(pool))
        self.polls += 1
        return seen


def pod_reports(met: float, missed: float, created: dict[str, float]) -> list[PodObservation]:
    """One pod's counters for tenant vip (target 0.99); `created` holds each series' start time."""
    outcomes = {("vip", "critical", "met"): OutcomeCounter(met, created["met"])}
    if missed:
        outcomes[("vip", "critical", "ttft_missed")] = OutcomeCounter(missed, created.setdefault("missed", time.time()))
    return [PodObservation("llama3-8b-0", UsageReport(pool=POOL), sla_risk=0.1, outcomes=outcomes)]


def at_risk(kube: KubeEmulator) -> dict[str, Any] | None:
    status = kube.read(TENANTS, None, "vip").get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "AtRisk"), None)


def vip_events(kube: KubeEmulator) -> list[tuple[str, str]]:
    events = [e for e in kube.live("v1/events", "default") if e["involvedObject"]["name"] == "vip"
              and e["involvedObject"]["kind"] == "TenantSLA"]
    return [(e["type"], e["reason"]) for e in sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))]


async def test_attainment_and_at_risk_follow_the_sidecars_counters(kube: KubeEmulator) -> None:
    created = {"met": time.time() - 3600}  # an hour of history before the operator watched: the baseline
    usage = CountingUsage({POOL: pod_reports(5000, 0, created)})
    async with operator(kube, usage, interval=0.2):
        await seed(kube)
        unknown = await eventually(lambda: (c := at_risk(kube)) and c, what="an AtRisk condition")
        assert (unknown["status"], unknown["reason"]) == ("Unknown", "TooFewRequests")
        assert "attainment" not in kube.read(TENANTS, None, "vip")["status"]
        await eventually(lambda: usage.polls >= 1, what="the operator's first usage poll (the baseline)")

        usage.observations[POOL] = pod_reports(5100, 0, created)  # 100 met since the baseline
        met = await eventually(lambda: (c := at_risk(kube)) and c["status"] == "False" and c, what="AtRisk False")
        assert met["reason"] == "AttainmentMet" and "100.00% of 100 request(s)" in met["message"]
        assert kube.read(TENANTS, None, "vip")["status"]["attainment"] == 1.0
        assert vip_events(kube) == []  # Unknown -> False is no change of risk

        usage.observations[POOL] = pod_reports(5100, 100, created)  # a new series: 100 missed TTFT
        risky = await eventually(lambda: (c := at_risk(kube)) and c["status"] == "True" and c, what="AtRisk True")
        assert risky["reason"] == "AttainmentBelowTarget" and "target 99.00%" in risky["message"]
        assert kube.read(TENANTS, None, "vip")["status"]["attainment"] == 0.5
        await eventually(lambda: vip_events(kube) == [("Warning", "AttainmentBelowTarget")], what="a Warning event")
        if KUBECTL is not None:
            rows = await kubectl_columns(kube, "Attainment", "At-Risk")
            assert rows[0] == ["NAME", "ATTAINMENT", "AT-RISK"] and ["vip", "0.5", "True"] in rows

        usage.observations[POOL] = pod_reports(25100, 100, created)  # 20,100 of 20,200 met: 99.5 %
        await eventually(lambda: (c := at_risk(kube)) and c["status"] == "False", what="AtRisk False again")
        assert kube.read(TENANTS, None, "vip")["status"]["attainment"] == 0.995
        await eventually(lambda: vip_events(kube) == [("Warning", "AttainmentBelowTarget"), ("Normal", "AttainmentMet")],
                         what="a Normal event on recovery")
        # Tenants the pod reports nothing for are not judged.
        standard = next(c for c in kube.read(TENANTS, None, "standard")["status"]["conditions"] if c["type"] == "AtRisk")
        assert standard["status"] == "Unknown"


class SlowUsage(CountingUsage):
    """A read that takes time after its snapshot, as an HTTP scrape does; `during` runs once, at
    the given poll, between the snapshot and the read's return."""

    def __init__(self, observations: dict[str, list[PodObservation]], at_poll: int, during: Any) -> None:
        super().__init__(observations)
        self.at_poll, self.during = at_poll, during

    async def observe(self, pool: Any) -> list[PodObservation]:
        seen = list(self.observations.get(f"{pool.metadata.namespace}/{pool.metadata.name}", []))
        if self.polls + 1 == self.at_poll:
            await asyncio.sleep(0.1)
            self.during()
        await asyncio.sleep(0.2)
        self.polls += 1
        return seen


async def test_a_series_created_while_a_read_is_under_way_counts(kube: KubeEmulator) -> None:
    """The race e2e met once: vip's first request missed its TTFT while the operator's read was
    under way, so the `ttft_missed` series was created after the read but before the tick's stamp.
    The tick is stamped when its read begins, so the next tick sees the series as new and counts it."""
    created = {"met": time.time() - 3600}
    usage = SlowUsage({POOL: pod_reports(5000, 0, created)}, at_poll=2, during=lambda: None)
    usage.during = lambda: usage.observations.__setitem__(POOL, pod_reports(5100, 100, created))  # created now: mid-read
    async with operator(kube, usage, interval=0.2):
        await seed(kube)
        await eventually(lambda: usage.polls >= 3, what="the read after the one the series was created during")
        await eventually(lambda: (kube.read(TENANTS, None, "vip").get("status") or {}).get("attainment") == 0.5,
                         what="status.attainment 0.5 (100 met, 100 missed since the baseline)")


async def test_a_verdict_is_judged_again_when_its_window_empties_with_no_pod_reporting_the_tenant(kube: KubeEmulator) -> None:
    """vip's pod restarted and vip sent nothing since: no pod reports its series. Its misses still
    age out of the window, and AtRisk follows (TooFewRequests) instead of standing forever."""
    created = {"met": time.time() - 3600}
    usage = CountingUsage({POOL: pod_reports(5000, 0, created)})
    async with operator(kube, usage, interval=0.2, attainment_window_s=3.0):
        await seed(kube)
        await eventually(lambda: usage.polls >= 1, what="the operator's first usage poll (the baseline)")
        usage.observations[POOL] = pod_reports(5100, 100, created)
        await eventually(lambda: (c := at_risk(kube)) and c["status"] == "True", what="AtRisk True")
        usage.observations[POOL] = [PodObservation("llama3-8b-0", UsageReport(pool=POOL), sla_risk=0.0, outcomes={})]  # restarted, idle
        cleared = await eventually(lambda: (c := at_risk(kube)) and c["status"] != "True" and c, what="AtRisk judged on an empty window")
        assert (cleared["status"], cleared["reason"]) == ("Unknown", "TooFewRequests") and "0 request(s)" in cleared["message"]
