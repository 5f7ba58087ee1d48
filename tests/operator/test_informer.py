"""The informer (operator/src/slaq/operator/informer.py) against the API emulator: list, watch from the list's
version, and a periodic relist that drops what a restarted watch would not report as deleted."""

from __future__ import annotations

import asyncio

from slaq.operator.client import Connection, KubeClient
from slaq.operator.informer import Informer
from slaq.testing.kube import KubeEmulator
from tests.support.polling import eventually

CM = "/api/v1/namespaces/ns/configmaps"


async def test_lists_then_follows_and_a_relist_drops_what_the_watch_missed(kube: KubeEmulator) -> None:
    await kube.post(CM, json={"metadata": {"name": "a"}, "data": {"v": "1"}})
    api = KubeClient(Connection(server=str(kube.url).rstrip("/")))
    changes: list[tuple[str, str | None]] = []

    async def changed(key: str, new: dict | None, old: dict | None) -> None:
        changes.append((key, None if new is None else new.get("v")))

    informer = Informer(api, "configmaps", lambda body: dict(body.get("data") or {}), namespace="ns", on_change=changed)
    informer.relist_s = 0.5  # (the operator's: half an hour)
    try:
        informer.start()
        await asyncio.wait_for(informer.synced.wait(), 20)
        assert informer.store == {"ns/a": {"v": "1"}} and changes == []  # the listing is not a change
        await kube.post(CM, json={"metadata": {"name": "b"}, "data": {"v": "2"}})
        await eventually(lambda: changes == [("ns/b", "2")], what="b from the watch")
        # An object gone without a DELETED event (as after a watch restarted past a 410): the next
        # relist finds it missing.
        kube.objects["v1/configmaps", "ns", "a"].delete()
        await eventually(lambda: "ns/a" not in informer.store and ("ns/a", None) in changes, what="a dropped by a relist")
    finally:
        await informer.close()
        await api.close()


async def test_a_failing_listing_calls_on_error_once_per_new_reason_and_on_synced_when_it_lists(
        kube: KubeEmulator, monkeypatch) -> None:
    from slaq.operator import informer as module
    monkeypatch.setattr(module, "RETRY_S", 0.05)
    await kube.post(CM, json={"metadata": {"name": "a"}, "data": {"v": "1"}})
    kube.fail("GET", "v1/configmaps", 403, times=5, namespace="ns")
    api = KubeClient(Connection(server=str(kube.url).rstrip("/")))
    calls: list[tuple[str, str | None]] = []

    async def failed(namespace: str | None) -> None:
        calls.append(("error", informer.last_error))

    async def synced(namespace: str | None) -> None:
        calls.append(("synced", namespace))

    informer = Informer(api, "configmaps", lambda body: dict(body.get("data") or {}), namespace="ns",
                        on_synced=synced, on_error=failed)
    try:
        informer.start()
        await asyncio.wait_for(informer.synced.wait(), 20)
        # five failures of one reason: one call, made after last_error names it (what a status reads)
        assert [kind for kind, _ in calls] == ["error", "synced"] and "403" in calls[0][1]
        assert informer.last_error is None and informer.store == {"ns/a": {"v": "1"}}
    finally:
        await informer.close()
        await api.close()
