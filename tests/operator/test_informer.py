"""The informer (operator/src/informer.py) against the API emulator: list, watch from the list's
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
