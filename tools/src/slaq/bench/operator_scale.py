"""The real operator (kopf) against the API emulator at scale: cold-start convergence, one quota
change, and the API calls that change cost.

    python tools/src/slaq/bench/operator_scale.py --tenants 10000 --pools 50 [--models 10]

The emulator (tools/src/slaq/testing/kube.py) runs in a child process, so it and the operator each have
a core; the cluster (tools/src/slaq/bench/scale_objects.py) is stored in it before the operator starts. The
operator runs as it ships (OperatorThread: kopf, the informer's view, lightkube), with one difference: its
usage timer is set beyond the run (`--observe-interval`), so the calls counted are the change's
own (a pool's usage tick costs a pod list, a Deployment read and, when something moved, writes).

Measured:
- converge_s: operator start until every pool's table (all its Secrets) holds every tenant it
  serves, with every tenant's key hash;
- statuses_s: operator start until every TenantSLA's status is written for its generation, polled
  once the tables have converged (so never below converge_s; the operator writes the statuses
  after the tables);
- change_s: one tenant's `requestsPerMinute` patched (as kubectl would) until every table of the
  pools that tenant selects shows the new share;
- calls_per_change: requests the operator made from that patch until the API went quiet (its
  table writes, the tenant's status, kopf's own bookkeeping patch), watch streams not counted;
- rotate_s: that tenant's key Secret patched with a new key (as kubectl would) until every table of
  the pools it selects holds the new key's hash instead of the old one (the operator's part of a
  key rotation: a sidecar then reads the table file the kubelet updates); calls_per_rotation, its
  requests counted as for the change.
Target at 10,000 tenants x 50 pools: converge_s <= 120, change_s <= 2,
calls_per_change <= 2 x affected pools + 2. The last line printed is the JSON result; `--out FILE`
also writes it as a report (schema slaq.bench.operator_scale/v1, with the run's envelope: command
line, date, commit) for docs/results.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

from slaq.bench.scale_objects import (
    KEY_NAMESPACE, OPEN_NAMESPACES, POOL_NAMESPACE, key_secret, pool_body, pool_name, pools_of_tenant, tenant_body, tenant_name,
)

REPO_ROOT = Path(__file__).resolve().parents[4]  # the CRDs the emulator serves are the checkout's crds/

CHANGED_TENANT = 0
NEW_RPM = 300  # from 600
POLL_S = 0.02
MAX_PARTS = 16  # table Secrets looked for per pool
QUIET_S = 1.5  # no request for this long: the change is done


@dataclass
class TableWatch:
    """What the tables in the emulator hold, each part parsed only when its resourceVersion moved."""

    # Secret name -> (resourceVersion, parts it says the table has, tenant -> (key hashes, rpm share))
    seen: dict[str, tuple[str, int, dict[str, tuple[tuple[str, ...], float | None]]]] = field(default_factory=dict)

    def parts(self, emulator: Any, pool: str) -> list[dict[str, tuple[tuple[str, ...], float | None]]] | None:
        """Every part of the pool's table, or None while they disagree on how many there are."""
        import kmock

        from slaq.api.runtime import TENANT_TABLE_KEY
        found, counts = [], set()
        for index in range(MAX_PARTS):
            name = f"{pool}-tenants" + (f"-{index}" if index else "")
            key = (kmock.resource("v1/secrets"), POOL_NAMESPACE, name)
            obj = emulator.objects[key] if key in emulator.objects else None
            if obj is None or obj.deleted:
                continue
            rv = obj.raw["metadata"]["resourceVersion"]
            if name not in self.seen or self.seen[name][0] != rv:
                # Plain JSON, not the model: this process also serves the API whose writes are timed
                # (the sidecar's reader, core/src/slaq/table_file.py, is tested on split tables elsewhere).
                table = json.loads(base64.b64decode(obj.raw["data"][TENANT_TABLE_KEY]))
                self.seen[name] = (rv, table.get("parts") or 1, {t["name"]: (tuple(t.get("keyHashes") or ()), (t.get("share") or {}).get("requestsPerMinute"))
                                                                for t in table["tenants"]})
            counts.add(self.seen[name][1])
            found.append(self.seen[name][2])
        return found if len(counts) <= 1 and len(found) == (counts.pop() if counts else 0) else None

    def share(self, emulator: Any, pool: str, tenant: str) -> float | None:
        for part in self.parts(emulator, pool) or []:
            if tenant in part:
                return part[tenant][1]
        return None

    def key_hashes(self, emulator: Any, pool: str, tenant: str) -> tuple[str, ...] | None:
        for part in self.parts(emulator, pool) or []:
            if tenant in part:
                return part[tenant][0]
        return None

    def holds(self, emulator: Any, pool: str, tenants: set[str]) -> bool:
        """Whether the pool's table holds exactly `tenants`, each with one key hash."""
        parts = self.parts(emulator, pool)
        if parts is None or sum(len(part) for part in parts) != len(tenants):
            return False
        return all(name in tenants and len(hashes) == 1 for part in parts for name, (hashes, _) in part.items())


async def _emulator_main(pipe: Pipe, tenants: int, pools: int, models: int) -> None:
    import kmock

    from slaq.testing.kube import KubeEmulator

    async with KubeEmulator() as emulator, kmock.Server(emulator):
        emulator.keep_requests = False
        emulator.resources.load_bundled()
        emulator.install_crds(sorted((REPO_ROOT / "crds").glob("*.yaml")))
        for name in (KEY_NAMESPACE, POOL_NAMESPACE, "slaq-system"):
            emulator.objects["v1/namespaces", None, name] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        for j in range(tenants):
            emulator.preload("v1/secrets", key_secret(j))
            emulator.preload("slaq.dev/v1alpha1/tenantslas", tenant_body(j, models))
        for p in range(pools):
            emulator.preload("slaq.dev/v1alpha1/inferencepools", pool_body(p, models))
        pipe.send(str(emulator.url).rstrip("/"))
        watch = TableWatch()
        expected = {pool_name(p): set() for p in range(pools)}
        for j in range(tenants):
            for pool in pools_of_tenant(j, pools, models):
                expected[pool].add(tenant_name(j))
        affected = pools_of_tenant(CHANGED_TENANT, pools, models)

        def converged() -> bool:
            return all(watch.holds(emulator, pool, names) for pool, names in expected.items())

        unstatused = {tenant_name(j) for j in range(tenants)}

        def statuses_written() -> bool:
            """Every TenantSLA's status written for its generation (each tenant checked until it has one)."""
            for name in list(unstatused):
                key = (kmock.resource("slaq.dev/v1alpha1/tenantslas"), None, name)
                obj = emulator.objects[key] if key in emulator.objects else None
                raw = {} if obj is None else obj.raw
                if (raw.get("status") or {}).get("observedGeneration") == raw["metadata"].get("generation") is not None:
                    unstatused.discard(name)
            return not unstatused

        before: dict[str, float | None] = {}

        def share(pool: str) -> float | None:
            return watch.share(emulator, pool, tenant_name(CHANGED_TENANT))

        keys_before: dict[str, tuple[str, ...] | None] = {}

        def rotated() -> bool:
            """Every affected table holds one key hash for the tenant, and not the one it held before."""
            now = {pool: watch.key_hashes(emulator, pool, tenant_name(CHANGED_TENANT)) for pool in affected}
            return all(value is not None and len(value) == 1 and value != keys_before[pool] for pool, value in now.items())

        def changed() -> bool:
            """Every affected table shows a new share, and together they fit the new quota."""
            now = {pool: share(pool) for pool in affected}
            if any(value is None or value == before[pool] for pool, value in now.items()):
                return False
            return sum(v for v in now.values() if v is not None) <= NEW_RPM

        async def until(check: Any, deadline_s: float, poll_s: float = POLL_S) -> float:
            end = time.monotonic() + deadline_s
            while not check():
                if time.monotonic() > end:
                    raise TimeoutError(f"not reached within {deadline_s} s")
                await asyncio.sleep(poll_s)
            return time.monotonic()

        async def quiet() -> int:
            while True:
                before = len(emulator.calls)
                await asyncio.sleep(QUIET_S)
                if len(emulator.calls) == before:
                    return before

        while True:
            command, arg = await asyncio.to_thread(pipe.recv)
            try:
                if command == "converge":
                    pipe.send(("ok", await until(converged, arg, 0.2)))
                elif command == "statuses":
                    pipe.send(("ok", await until(statuses_written, arg, 0.2)))
                elif command == "census":
                    pipe.send(("ok", dict(Counter(f"{c.verb} {c.resource}{'/' + c.subresource if c.subresource else ''}"
                                                  for c in emulator.calls if c.verb != "WATCH"))))
                elif command == "quiet":
                    pipe.send(("ok", await quiet()))
                elif command == "change":
                    before.update({pool: share(pool) for pool in affected})
                    mark = len(emulator.calls)
                    started = time.monotonic()
                    resp = await emulator.patch(f"/apis/slaq.dev/v1alpha1/tenantslas/{tenant_name(CHANGED_TENANT)}",
                                                json={"spec": {"quotas": {"requestsPerMinute": NEW_RPM}}},
                                                headers={"Content-Type": "application/merge-patch+json"})
                    assert resp.status == 200, await resp.text()
                    done = await until(changed, arg)
                    end = await quiet()
                    calls = [c for c in emulator.calls[mark + 1:end] if c.verb != "WATCH"]
                    kinds = Counter(f"{c.verb} {c.resource}{'/' + c.subresource if c.subresource else ''}" for c in calls)
                    pipe.send(("ok", {"change_s": done - started, "calls": len(calls), "kinds": dict(kinds),
                                      "affected": len(affected)}))
                elif command == "rotate":
                    keys_before.update({pool: watch.key_hashes(emulator, pool, tenant_name(CHANGED_TENANT)) for pool in affected})
                    mark = len(emulator.calls)
                    started = time.monotonic()
                    new_key = base64.b64encode(f"sk-{tenant_name(CHANGED_TENANT)}-rotated-fedcba9876543210".encode()).decode()
                    resp = await emulator.patch(f"/api/v1/namespaces/{KEY_NAMESPACE}/secrets/{tenant_name(CHANGED_TENANT)}-keys",
                                                json={"data": {"key": new_key}},
                                                headers={"Content-Type": "application/merge-patch+json"})
                    assert resp.status == 200, await resp.text()
                    done = await until(rotated, arg)
                    end = await quiet()
                    calls = [c for c in emulator.calls[mark + 1:end] if c.verb != "WATCH"]
                    pipe.send(("ok", {"rotate_s": done - started, "calls": len(calls)}))
                elif command == "secrets":
                    sizes = [sum(len(base64.b64decode(v)) for v in (obj.raw.get("data") or {}).values())
                             for (res, ns, name), obj in emulator.objects.items()
                             if res.plural == "secrets" and ns == POOL_NAMESPACE and not obj.deleted and "-tenants" in name]
                    pipe.send(("ok", {"count": len(sizes), "largest_bytes": max(sizes, default=0)}))
                elif command == "stop":
                    pipe.send(("ok", None))
                    return
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which stops
                pipe.send(("error", f"{type(exc).__name__}: {exc}"))


def _emulator_process(pipe: Pipe, tenants: int, pools: int, models: int) -> None:
    asyncio.run(_emulator_main(pipe, tenants, pools, models))


def _ask(pipe: Pipe, command: str, arg: Any = None) -> Any:
    pipe.send((command, arg))
    status, value = pipe.recv()
    if status != "ok":
        raise RuntimeError(f"emulator: {command}: {value}")
    return value


def run(tenants: int, pools: int, models: int, *, observe_interval_s: float, deadline_s: float) -> dict[str, Any]:
    from slaq.operator.client import Connection
    from slaq.operator.images import PoolImages
    from slaq.operator.runner import OperatorOptions, OperatorThread

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_emulator_process, args=(child, tenants, pools, models), daemon=True)
    process.start()
    op = None
    try:
        url = parent.recv()
        # The emulator pulls no image: the defaults only let pools that name none be rendered.
        images = PoolImages(gpu="slaq-engine:bench", cpu="slaq-engine:bench-cpu")
        options = OperatorOptions(namespace="slaq-system", observe_interval_s=observe_interval_s, key_secret_namespaces=(KEY_NAMESPACE,),
                                  images=images, open_namespaces=OPEN_NAMESPACES)
        op = OperatorThread(Connection(server=url), options)
        started = time.monotonic()
        op.start()
        converged = _ask(parent, "converge", deadline_s)
        statuses = _ask(parent, "statuses", deadline_s)
        _ask(parent, "quiet")
        cold_calls = _ask(parent, "census")
        change = _ask(parent, "change", deadline_s)
        rotation = _ask(parent, "rotate", deadline_s)
        secrets = _ask(parent, "secrets")
        affected = change["affected"]
        return {
            "tenants": tenants, "pools": pools, "models": models, "affected_pools": affected,
            "table_secrets": secrets["count"], "largest_table_secret_bytes": secrets["largest_bytes"],
            "cold_start_calls": cold_calls, "calls_by_kind": change["kinds"], "calls_bound": 2 * affected + 2,
            "converge_s": round(converged - started, 2), "statuses_s": round(statuses - started, 2),
            "change_s": round(change["change_s"], 3),
            "calls_per_change": change["calls"], "rotate_s": round(rotation["rotate_s"], 3),
            "calls_per_rotation": rotation["calls"],
        }
    finally:
        if op is not None:
            op.stop(60.0)
        try:
            _ask(parent, "stop")
        except (OSError, EOFError, RuntimeError):
            pass
        process.join(10)
        if process.is_alive():
            process.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--pools", type=int, default=10)
    parser.add_argument("--models", type=int, default=10,
                        help="pools and tenants are spread over this many model labels; a tenant selects its model's pools")
    parser.add_argument("--observe-interval", type=float, default=3600.0, help="the operator's usage timer (s)")
    parser.add_argument("--deadline", type=float, default=600.0, help="give up waiting for a state after this long (s)")
    parser.add_argument("--out", type=Path, default=None, help="also write the result as a JSON report here")
    args = parser.parse_args(argv)
    if args.tenants < 1 or args.pools < 1 or not 1 <= args.models <= args.pools:
        parser.error("--tenants and --pools must be >= 1, and --models between 1 and --pools")
    from slaq.bench.envelope import envelope
    from slaq.bench.report import write_report

    started = envelope(None if argv is None else [__file__, *argv])
    result = run(args.tenants, args.pools, args.models, observe_interval_s=args.observe_interval, deadline_s=args.deadline)
    if args.out:
        write_report({"schema": "slaq.bench.operator_scale/v1", **result}, args.out, started)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
