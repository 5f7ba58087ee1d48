"""A tenant's rpm quota across two replicas behind a real load balancer (issue 35, item 4).

What runs, all of it real: two pods of one InferencePool, each its own `slaq engine` (the tiny CPU
model) and `slaq sidecar`, started from the Deployment the operator rendered (e2e/pod.py), each
pod on its own loopback address (127.0.0.1, 127.0.0.2) as pods have their own IPs; Debian's
HAProxy in front of them (tests/support/haproxy.py) with two frontends, `skew` (roundrobin,
weights 80/20) and `least` (leastconn); the operator against the Kubernetes API emulator
(e2e/cluster.py), splitting the tenant's rpm from the usage it scrapes from both pods every
second, its table Secret copied into both pods' volumes as the kubelet would (`TableSync`); and,
for the exact mode, a redis-server the sidecars share (`--quota-store`, rendered by the operator
of an install that names a store; tests/support/redis_server.py).

Tenant `skew` has an rpm quota (QUOTA) and no other. Requests are tiny (max_tokens 1), so the
engines are not the bottleneck; a request is admitted when the sidecar did not answer 429, and
any other answer fails the test. Each mode runs, through the 80/20 frontend:

1. an overload at 4 x the quota for 50 s. The buckets hold a minute of share and start full,
   which would hide a wrong split for about 100 s of exact-rate traffic; the overload empties the
   hot pod's bucket within seconds and the cold one's in 20-40 s (its share falls as the shares
   converge, on usage ticks every 1-5 s on a busy machine, and its bucket with it; one CI run's
   machine took 49 s, so the overload goes on, up to 110 s, until the window below is 10 s long). From the moment
   both pods have refused (every bucket empty, and kept so by the overload) to the end, what is
   admitted is what refills (the sum of the shares, or the whole quota in the store): the
   cluster-wide admitted rate, against the quota's;
2. after a 5 s pause (a little slack, as a tenant has that was not refused in the last seconds;
   an empty bucket fed at exactly its rate refuses whatever the client's timing jitter bunches),
   exactly the quota for 30 s: the fraction admitted.

Then the store is killed mid-run (SIGKILL) under traffic through the leastconn frontend, and
restarted.

The test runs the module's tests in file order on one set of processes (two engine starts).
Run it with `python -m pytest e2e/test_quota_skew.py -s -p no:cacheprovider` to see the figures;
`--quota-skew-report PATH` (e2e/conftest.py) also writes them as a JSON report with the run's
envelope (command line, date, commit; slaq.bench.envelope), which docs/results.md renders
(docs/results/quota-skew-live.json; `python -m slaq.bench.results`). Without it nothing is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import math
import os
import shlex
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from e2e.cluster import ControlPlane
from e2e.conftest import ENGINE_START_TIMEOUT_S, example_docs
from e2e.pod import PodSpecRun
from e2e.traffic import Outcome, client, stream_completion
from slaq.api.common import API_VERSION
from slaq.bench.envelope import envelope, with_envelope
from slaq.local.errors import StartupError
from slaq.local.processes import free_port, wait_ready
from slaq.operator.names import pool_selector_labels, table_secret_name
from slaq.operator.pod import QuotaStoreRef
from tests.support.engine import metric_sum
from tests.support.haproxy import Frontend, HAProxy, Server
from tests.support.polling import wait_for
from tests.support.redis_server import RedisServer

# Two engine starts (up to ENGINE_START_TIMEOUT_S on a busy machine) come with the first test, then about 90 s of traffic.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

NAMESPACE, POOL = "default", "tiny-cpu"
PODS = (("tiny-cpu-0", "127.0.0.1", 80), ("tiny-cpu-1", "127.0.0.2", 20))  # name, pod IP, weight in the `skew` frontend
HOT, COLD = PODS[0][0], PODS[1][0]
TENANT, KEY = "skew", "sk-e2e-skew-0123456789abcdef"
QUOTA = 240  # requests per minute: 4/s at the exact rate, 16/s in the overload
OVERLOAD, OVERLOAD_S, MIN_WINDOW_S, MAX_OVERLOAD_S = 4, 50.0, 10.0, 110.0
PAUSE_S, EXACT_S = 5.0, 30.0
SCHEMA = "slaq.e2e.quota_skew/v1"  # the --quota-skew-report JSON; docs/results.md renders it (slaq.bench.results.render_quota_skew_live)


@dataclass
class Stage:
    """Everything the tests share: the two pods, the load balancer, the store, the control plane now serving."""

    pods: list[PodSpecRun]
    balancer: HAProxy
    store: RedisServer
    metrics_port: int
    plane: ControlPlane | None = None
    sync: "TableSync | None" = None
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)

    def url(self, frontend: str) -> str:
        return self.balancer.url(frontend)


class TableSync:
    """The kubelet's part: the pool's table Secret into every pod's volumes each time it changes
    (polled every 0.2 s; a kubelet takes up to a minute or two, which only slows convergence)."""

    def __init__(self, plane: ControlPlane, pods: list[PodSpecRun]) -> None:
        self.plane, self.pods = plane, pods
        self._last: dict[str, str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="table-sync", daemon=True)

    def sync_once(self) -> bool:
        found = self.plane.table(NAMESPACE, table_secret_name(POOL))
        if found is None:
            return False
        if found[0] != self._last:
            for pod in self.pods:
                pod.write_secret(table_secret_name(POOL), found[0])
            self._last = found[0]
        return True

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.sync_once()
            except httpx.HTTPError:
                pass

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)


def cluster_docs(metrics_port: int) -> list[dict]:
    """The example CPU pool at two replicas (its sidecars' metrics port free here), and tenant `skew` with an rpm quota."""
    pool = copy.deepcopy(next(d for d in example_docs("pool-cpu.yaml") if d["kind"] == "InferencePool"))
    pool["spec"]["replicas"] = {"min": 2, "max": 2}
    pool["spec"].setdefault("sidecar", {})["metricsPort"] = metrics_port
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "stringData": {"main": KEY},
              "metadata": {"name": f"tenant-{TENANT}-keys", "namespace": "slaq-system", "labels": {"slaq.dev/tenant": TENANT}}}
    tenant = {"apiVersion": API_VERSION, "kind": "TenantSLA", "metadata": {"name": TENANT},
              # A standard tier needs a TTFT objective; an hour (the largest) never refuses a request as
              # unreachable, which a stalled step on a busy machine can predict for a minute's objective.
              "spec": {"tier": "standard", "objectives": {"ttftMs": 3_600_000},
                       "apiKeySecretRef": {"name": f"tenant-{TENANT}-keys", "namespace": "slaq-system"},
                       "poolSelector": {"matchLabels": pool["metadata"]["labels"]}, "quotas": {"requestsPerMinute": QUOTA}}}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "slaq-system"}}
    return [namespace, secret, tenant, pool]


def start_plane(stage: Stage, store: QuotaStoreRef | None) -> dict:
    """A fresh control plane (the operator with or without a shared store) with the pool and the
    tenant, the pods registered at their IPs and the table syncing; returns the rendered pod template."""
    plane = ControlPlane(quota_store=store).start()
    for doc in cluster_docs(stage.metrics_port):
        plane.create(doc)
    deployment = wait_for(lambda: plane.get("apps/v1", "deployments", NAMESPACE, POOL), 60, "the pool's Deployment")
    wait_for(lambda: (t := plane.table(NAMESPACE, table_secret_name(POOL))) and TENANT in {e.name for e in t[1].tenants}, 60,
             f"tenant {TENANT} in the pool's table")
    for name, ip, _ in PODS:
        plane.register_pod(NAMESPACE, name, pool_selector_labels(POOL), ip=ip)
    for pod in stage.pods:
        pod.template = pod.template or deployment["spec"]["template"]  # a running pod keeps its own until its sidecar restarts
    stage.plane, stage.sync = plane, TableSync(plane, stage.pods)
    stage.sync.sync_once()
    stage.sync.start()
    return deployment["spec"]["template"]


def stop_plane(stage: Stage) -> None:
    if stage.sync is not None:
        stage.sync.stop()
    if stage.plane is not None:
        stage.plane.close()
    stage.plane = stage.sync = None


def start_children(pods: list[PodSpecRun], names: tuple[str, ...]) -> None:
    children = [pod.start(name) for name in names for pod in pods]
    try:
        wait_ready(children, ENGINE_START_TIMEOUT_S)
    except StartupError as exc:
        from slaq.local.stack import describe_failure

        pytest.fail(describe_failure(exc))


def restart_sidecars(stage: Stage, template: dict) -> None:
    """The sidecars of a newly rendered template, in front of the running engines (whose rendering did not change)."""
    for pod in stage.pods:
        assert pod.container("engine") == next(c for c in template["spec"]["containers"] if c["name"] == "engine")
        if "sidecar" in pod.children:
            pod.children.pop("sidecar").stop()
        pod.template = template
    start_children(stage.pods, ("sidecar",))


def write_report(path: Path, run: dict[str, Any], stage: Stage, started: float, failed: int) -> None:
    """The figures the tests recorded, the set-up and thresholds they ran under, and how many of them failed."""
    try:
        load_average_end: float | None = round(os.getloadavg()[0], 2)
    except OSError:
        load_average_end = None
    report = {
        "schema": SCHEMA, "failed": failed, "duration_s": round(time.monotonic() - started),
        "load_average_end": load_average_end,
        "setup": {"quota_rpm": QUOTA, "pods": [{"name": name, "ip": ip, "weight": weight} for name, ip, weight in PODS],
                  "overload": OVERLOAD, "overload_s": OVERLOAD_S, "max_overload_s": MAX_OVERLOAD_S, "min_window_s": MIN_WINDOW_S,
                  "pause_s": PAUSE_S, "exact_s": EXACT_S},
        "thresholds": {"local_admitted": LOCAL_ADMITTED, "store_admitted": STORE_ADMITTED, "epsilon": EPSILON,
                       "split_tolerance": SPLIT_TOLERANCE},
        "figures": stage.figures,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(with_envelope(report, run), indent=2) + "\n", encoding="utf-8")
    print(f"quota skew report: {path}")


@pytest.fixture(scope="module")
def stage(request: pytest.FixtureRequest) -> Iterator[Stage]:
    if shutil.which("haproxy") is None or shutil.which("redis-server") is None:
        pytest.skip("haproxy and redis-server are not installed (scripts/setup.sh installs Debian's)")
    workdir = Path(tempfile.mkdtemp(prefix="slaq-e2e-skew-"))
    metrics_port = free_port()
    pods = [PodSpecRun({}, NAMESPACE, pod_name=name, pod_ip=ip, metrics_port=metrics_port,
                       image_env={"VLLM_CPU_KVCACHE_SPACE": "1"}) for name, ip, _ in PODS]
    balancer = HAProxy(workdir, [
        Frontend("skew", free_port(), "roundrobin", tuple(Server(p.pod_name, p.pod_ip, p.sidecar_port, w) for p, (_, _, w) in zip(pods, PODS))),
        Frontend("least", free_port(), "leastconn", tuple(Server(p.pod_name, p.pod_ip, p.sidecar_port) for p in pods)),
    ])
    stage = Stage(pods, balancer, RedisServer(workdir, shutil.which("redis-server") or ""), metrics_port)
    failed_before = request.session.testsfailed
    # default: the option is e2e/conftest.py's, unknown when pytest started from a folder that did not load it
    report_path: Path | None = request.config.getoption("--quota-skew-report", default=None)
    if report_path is not None:
        report_path = report_path.resolve()  # against the directory pytest was started in
        run = envelope()  # started now: the load average at the start
        run["command"] = shlex.join(["python", "-m", "pytest", *request.config.invocation_params.args])
        started = time.monotonic()

    def failed() -> bool:  # a failure keeps the logs (the processes' and HAProxy's)
        return request.session.testsfailed > failed_before

    def leave_workdir() -> None:
        if failed():
            print("logs kept:", workdir, *(pod.root for pod in pods))
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    with contextlib.ExitStack() as teardown:  # every step runs, whatever an earlier one raised
        teardown.callback(leave_workdir)
        teardown.callback(stage.store.stop)
        for pod in pods:
            teardown.callback(lambda pod=pod: pod.stop() if failed() else pod.cleanup())
        teardown.callback(stop_plane, stage)
        teardown.callback(balancer.stop)
        teardown.callback(lambda: print("\nquota skew figures:", stage.figures))
        stage.store.start()
        start_plane(stage, store=None)
        start_children(pods, ("engine",))  # both engines load at once
        start_children(pods, ("sidecar",))
        balancer.start()
        if report_path is not None:  # written once the tests have run, before the processes stop
            teardown.callback(lambda: write_report(report_path, run, stage, started, request.session.testsfailed - failed_before))
        yield stage


# -- traffic ---------------------------------------------------------------------------------

async def paced(http: httpx.AsyncClient, url: str, per_minute: float, duration_s: float, *, max_tokens: int = 1,
                seed: int = 0, longer: Callable[[list[Outcome]], bool] | None = None, max_duration_s: float | None = None) -> list[Outcome]:
    """Requests of the tenant at exactly `per_minute`, evenly spaced, each awaited to its end: for
    `duration_s`, then on while `longer(the outcomes so far)` says so, up to `max_duration_s`."""
    rate = per_minute / 60.0
    start = time.monotonic()
    count, most = round(rate * duration_s), round(rate * (max_duration_s or duration_s))
    tasks: list[asyncio.Task[Outcome]] = []
    for i in itertools.count():
        if i >= most or (i >= count and (longer is None or not longer([t.result() for t in tasks if t.done()]))):
            break
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(stream_completion(http, url, KEY, prompt_tokens=4, max_tokens=max_tokens, seed=seed + i)))
    return list(await asyncio.gather(*tasks))


def window_opened(overload: list[Outcome], ended: float) -> float:
    """When both pods had refused (each bucket empty): the latest of each pod's first refusal; `ended` if one never refused."""
    return max(min((o.started_at for o in overload if o.status == 429 and o.served_by == name), default=ended) for name, _, _ in PODS)


def check_answers(outcomes: list[Outcome], max_tokens: int = 1) -> None:
    """Every request was admitted or refused for quota, and every admitted one completed."""
    others = [o for o in outcomes if o.status not in (200, 429)]
    assert not others, f"{len(others)} of {len(outcomes)} answers neither admitted nor refused for quota, the first " \
        f"{others[0].started_at - outcomes[0].started_at:.1f} s into the phase: {Counter((o.status, (o.error or '')[:60]) for o in others)}"
    lost = [(o.served_by, o.tokens, o.error) for o in outcomes if o.status == 200 and not (o.done and o.tokens == max_tokens)]
    assert not lost, f"{len(lost)} admitted requests did not complete: {lost[:5]}"


def admitted(outcomes: list[Outcome], pod: str | None = None) -> int:
    return sum(1 for o in outcomes if o.status == 200 and pod in (None, o.served_by))


def refused(outcomes: list[Outcome], pod: str | None = None) -> int:
    return sum(1 for o in outcomes if o.status == 429 and pod in (None, o.served_by))


def sidecar_metric(pod: PodSpecRun, name: str, **labels: str) -> float:
    """A series' value on the pod's metrics port; 0 when the sidecar has not created it."""
    text = httpx.get(pod.metrics_url + "/metrics", timeout=10).text
    try:
        return metric_sum(text, name, **labels)
    except AssertionError:
        return 0.0


def pod_shares(stage: Stage) -> dict[str, float]:
    """Each pod's rpm share in the table the operator wrote last."""
    assert stage.plane is not None
    found = stage.plane.table(NAMESPACE, table_secret_name(POOL))
    assert found is not None
    entry = next(e for e in found[1].tenants if e.name == TENANT)
    return {name: entry.share_for(name).requests_per_minute or 0.0 for name, _, _ in PODS}


async def skewed_run(stage: Stage, mode: str) -> tuple[list[Outcome], list[Outcome]]:
    """The two phases through the 80/20 frontend (the module docstring); records and prints the figures."""
    async with client(120.0) as http:
        t0 = time.monotonic()
        # A machine that ticks the operator slowly converges the shares later, and the cold pod's
        # bucket empties later (one CI run: 49 s in); the overload goes on until the window is MIN_WINDOW_S long.
        overload = await paced(http, stage.url("skew"), OVERLOAD * QUOTA, OVERLOAD_S, max_duration_s=MAX_OVERLOAD_S,
                               longer=lambda done: time.monotonic() - window_opened(done, math.inf) < MIN_WINDOW_S)
        ended = t0 + len(overload) / (OVERLOAD * QUOTA / 60.0)
        await asyncio.sleep(PAUSE_S)  # no traffic for a moment: part of the load pattern, not a wait for a state
        shares = await asyncio.to_thread(pod_shares, stage)
        exact = await paced(http, stage.url("skew"), QUOTA, EXACT_S, seed=100_000)
    check_answers(overload)
    check_answers(exact)
    # The window opens when both pods have refused: each bucket is then empty and stays so under the
    # overload (each pod gets more than any share it can hold), so what is admitted after is what refills.
    opened = window_opened(overload, ended)
    window = [o for o in overload if o.started_at >= opened]
    window_s = max(ended - opened, 1e-3)
    figures = {
        "overload_s": round(ended - t0, 1),
        "window_s": round(window_s, 1),
        "window_admitted": admitted(window),
        "window_quota": round(QUOTA * window_s / 60.0, 1),
        "epsilon": round(admitted(window) / (QUOTA * window_s / 60.0) - 1.0, 4),
        "exact_sent": len(exact),
        "exact_admitted_fraction": round(admitted(exact) / len(exact), 4),
        **{f"exact_{name}_sent": sum(1 for o in exact if o.served_by == name) for name, _, _ in PODS},
        **{f"exact_{name}_refused": refused(exact, name) for name, _, _ in PODS},
        **{f"share_{name}": shares[name] for name, _, _ in PODS},
    }
    stage.figures[mode] = figures
    print(f"\n{mode}: {figures}")
    assert window_s >= MIN_WINDOW_S, f"{mode}: a bucket was still not empty {MAX_OVERLOAD_S - MIN_WINDOW_S:.0f} s into the overload: {figures}"
    return overload, exact


# -- the tests -------------------------------------------------------------------------------

# Thresholds and their margins. The exact phase: 120 requests. What can refuse one there is a
# share below its pod's demand, once the 5 s of slack is spent: with one pool-wide share (120 rpm
# on the hot pod, which gets 192) about 26 are refused (0.78 admitted); with shares within 1 % of the quota of
# 80/20 none are, whatever the client's timing jitter (the slack is 16 requests on the hot pod). So
# 0.95 and 0.99, the issue's figures, hold with a margin of the whole slack, and fail for a split
# that does not follow the skew. The window (at least 10 s at 240 rpm: 40 requests refilled or
# more): each empty bucket can add under one request, and a request's transit time can move one
# across the window's opening edge; EPSILON = 0.1 leaves 4 for those 2-3. The print says what it was.
LOCAL_ADMITTED, STORE_ADMITTED, EPSILON = 0.95, 0.99, 0.10
# The split's precision. Demand is counted per second over the sidecar's 60 s window and the shares
# step toward it on usage ticks (quotas.py smoothing), so the split lands within a request or two a
# minute of 80/20, not on it (one CI run: 193.1/46.9 for 192/48). 1 % of the quota is 2.4 rpm: a cold
# pod that far short for the 30 s phase is 1.2 requests short, inside its 4 requests of slack, while a
# split that ignores the skew (120/120) is 72 rpm off.
SPLIT_TOLERANCE = 0.01


async def test_local_shares_follow_the_skew(stage: Stage) -> None:
    """Without a store each sidecar enforces its own share of the tenant's rpm; the operator moves
    the shares to each pod's demand, so a tenant sending exactly its quota through an 80/20 skew is
    admitted (>= 95 %), and the cluster admits at most its quota's rate when every bucket is empty."""
    _, exact = await skewed_run(stage, "local")
    figures = stage.figures["local"]
    # The split followed the skew (what the admission rests on): each pod's share is its 80/20 part
    # within SPLIT_TOLERANCE of the quota.
    for name, part in ((HOT, 0.8), (COLD, 0.2)):
        assert figures[f"share_{name}"] == pytest.approx(part * QUOTA, abs=SPLIT_TOLERANCE * QUOTA), (name, figures)
    assert figures[f"share_{HOT}"] + figures[f"share_{COLD}"] <= QUOTA
    assert abs(figures[f"exact_{HOT}_sent"] - 0.8 * figures["exact_sent"]) <= 4, figures  # HAProxy's weights: 4 of every 5 to the hot pod
    assert figures["exact_admitted_fraction"] >= LOCAL_ADMITTED, figures
    assert figures["epsilon"] <= EPSILON, figures


async def test_a_shared_store_admits_the_whole_quota_wherever_it_lands(stage: Stage) -> None:
    """With --quota-store every sidecar decides on the tenant's whole quota in one Redis: >= 99 %
    admitted through the skew, and the cluster's admitted rate is the quota's when it is exhausted."""
    stop_plane(stage)
    template = start_plane(stage, QuotaStoreRef(url=stage.store.url))
    sidecar = next(c for c in template["spec"]["containers"] if c["name"] == "sidecar")
    assert sidecar["args"][sidecar["args"].index("--quota-store") + 1] == stage.store.url
    restart_sidecars(stage, template)
    await skewed_run(stage, "store")
    figures = stage.figures["store"]
    assert figures["exact_admitted_fraction"] >= STORE_ADMITTED, figures
    assert figures["epsilon"] <= EPSILON, figures
    # The store decided the requests: both pods asked it. A call that times out (0.25 s: a busy machine
    # stalls some: 0 to 95 of about 1,450 over five runs, 0 % to 6.6 %, the most on a quiet machine as
    # on a loaded one) is decided on the local shares, as designed, so the bound is loose (20 %); with
    # the store not in use it would be every one (the reserve counts and the mode gauge below too).
    operations = ("precheck", "reserve", "settle", "heartbeat", "probe")
    answered = {op: sum(sidecar_metric(pod, "slaq_quota_store_seconds_count", operation=op) for pod in stage.pods) for op in operations}
    missed = {op: sum(sidecar_metric(pod, "slaq_quota_store_fallbacks_total", operation=op) for pod in stage.pods) for op in operations}
    print(f"store calls answered {answered}, fallen back {missed}")
    stage.figures["store_calls"] = {"answered": answered, "fallen_back": missed}
    decisions = answered["precheck"] + answered["reserve"]
    assert missed["precheck"] + missed["reserve"] <= 0.2 * decisions, (answered, missed)
    for pod in stage.pods:
        assert sidecar_metric(pod, "slaq_quota_store_seconds_count", operation="reserve") > 0, pod.pod_name
        assert sidecar_metric(pod, "slaq_quota_mode", mode="store") == 1.0, pod.pod_name


async def test_a_killed_store_falls_back_to_local_shares_and_loses_nothing(stage: Stage) -> None:
    """SIGKILL the store under traffic (through the leastconn frontend): requests keep being admitted
    on the local shares from the first second on, streams the store admitted before finish, and
    when a store comes back on the same address both sidecars count in it again."""
    assert stage.figures.get("store"), "runs after the shared-store test (the sidecars count in the store)"
    long_tokens = 256
    async with client(120.0) as http:
        # Tiny requests at the quota's rate, and streams the store admits; the store is killed as soon
        # as the first of them streams (its first token seen: it was admitted by the store and has
        # most of its tokens to come; the others may be admitted before the kill or after it, on
        # the local shares), then the tiny requests go on for 4 s. Waiting for all four to stream
        # let the first ones finish before the kill on a busy engine (CI: all four ended 0.05-2.7 s
        # before it).
        t0 = time.monotonic()
        before = asyncio.create_task(paced(http, stage.url("least"), QUOTA, 2.0, seed=200_000))
        started = asyncio.Event()
        streams = [asyncio.create_task(stream_completion(http, stage.url("least"), KEY, prompt_tokens=4, max_tokens=long_tokens,
                                                         seed=300_000 + i, first_token=started)) for i in range(4)]
        await asyncio.wait_for(started.wait(), 120)
        stage.store.kill()
        killed_at = time.monotonic()
        outcomes = await paced(http, stage.url("least"), QUOTA, 4.0, seed=250_000) + await before
        long = await asyncio.gather(*streams)
    check_answers(outcomes)
    check_answers(long, max_tokens=long_tokens)
    # Admitted by the store before it died, finished after: nothing admitted was lost.
    assert [o.status for o in long] == [200] * 4 and any(o.ended_at > killed_at for o in long), [(o.status, o.ended_at - killed_at) for o in long]
    after = [o for o in outcomes if o.started_at >= killed_at]
    first_second = [o for o in after if o.started_at < killed_at + 1.0]
    assert first_second and admitted(first_second) == len(first_second), [(o.status, o.error) for o in first_second]
    assert admitted(after) == len(after), [(o.status, o.error) for o in after if o.status != 200]
    fallbacks = sum(sidecar_metric(pod, "slaq_quota_store_fallbacks_total") for pod in stage.pods)
    assert fallbacks > 0  # the store was really gone for these requests (a negative control on the kill)
    first_answer = min((o.started_at + (o.ttft_s or o.elapsed_s) for o in after), default=float("nan")) - killed_at
    stage.figures["kill"] = {"requests_after_kill": len(after), "admitted_after_kill": admitted(after),
                             "first_token_after_kill_s": round(first_answer, 3), "fallbacks": fallbacks,
                             "long_streams_ended_after_kill": sum(1 for o in long if o.ended_at > killed_at),
                             "kill_at_s": round(killed_at - t0, 2)}
    print(f"\nkill: {stage.figures['kill']}")

    # A store back on the same address (empty, as a Redis without persistence): both sidecars' breakers close, and they count there.
    stage.store.restart()

    def counting_in_store() -> bool:
        return all(sidecar_metric(pod, "slaq_quota_mode", mode="store") == 1.0 for pod in stage.pods)

    await asyncio.to_thread(wait_for, counting_in_store, 30, "both sidecars deciding in the store again", 0.2)
    reserves = [sidecar_metric(pod, "slaq_quota_store_seconds_count", operation="reserve") for pod in stage.pods]
    fallbacks = [sidecar_metric(pod, "slaq_quota_store_fallbacks_total") for pod in stage.pods]
    async with client(60.0) as http:
        again = await paced(http, stage.url("least"), QUOTA, 2.0, seed=400_000)
    check_answers(again)
    assert admitted(again) == len(again)
    for pod, reserved_before, fallbacks_before in zip(stage.pods, reserves, fallbacks):
        served = admitted(again, pod.pod_name)
        assert served and sidecar_metric(pod, "slaq_quota_store_seconds_count", operation="reserve") == reserved_before + served, pod.pod_name
        assert sidecar_metric(pod, "slaq_quota_store_fallbacks_total") == fallbacks_before, pod.pod_name
