"""The test Kubernetes API emulator (tools/src/slaq/testing/kube.py) answers like an API server."""

from __future__ import annotations

import base64

import pytest

from slaq.testing.kube import KubeEmulator, label_selector_matches

POOLS = "/apis/slaq.dev/v1alpha1/namespaces/ns/inferencepools"
CM = "/api/v1/namespaces/ns/configmaps"


async def test_create_fills_server_fields_and_answers_201(kube: KubeEmulator) -> None:
    resp = await kube.post(CM, json={"metadata": {"name": "a"}, "data": {"k": "v"}})
    assert resp.status == 201
    body = await resp.json()
    meta = body["metadata"]
    assert meta["namespace"] == "ns" and meta["uid"] and meta["generation"] == 1 and meta["creationTimestamp"]
    again = await kube.post(CM, json={"metadata": {"name": "a"}})
    assert again.status == 409


async def test_generate_name_and_list_kind(kube: KubeEmulator) -> None:
    resp = await kube.post(CM, json={"metadata": {"generateName": "x-"}})
    name = (await resp.json())["metadata"]["name"]
    assert name.startswith("x-") and len(name) > 2
    listing = await (await kube.get(CM)).json()
    assert listing["kind"] == "ConfigMapList" and [i["metadata"]["name"] for i in listing["items"]] == [name]
    assert int(listing["metadata"]["resourceVersion"]) >= 1


async def test_generation_tracks_spec_only_and_status_endpoint_writes_only_status(kube: KubeEmulator) -> None:
    await kube.post(POOLS, json={"metadata": {"name": "p"}, "spec": {"a": 1}})
    rv0 = kube.read("slaq.dev/v1alpha1/inferencepools", "ns", "p")["metadata"]["resourceVersion"]
    # The main endpoint ignores status when a status subresource exists.
    await kube.patch(f"{POOLS}/p", json={"status": {"x": 1}, "metadata": {"labels": {"l": "1"}}},
                     headers={"Content-Type": "application/merge-patch+json"})
    obj = kube.read("slaq.dev/v1alpha1/inferencepools", "ns", "p")
    assert "status" not in obj and obj["metadata"]["generation"] == 1 and obj["metadata"]["resourceVersion"] != rv0
    await kube.patch(f"{POOLS}/p/status", json={"status": {"x": 2}, "spec": {"a": 9}},
                     headers={"Content-Type": "application/merge-patch+json"})
    obj = kube.read("slaq.dev/v1alpha1/inferencepools", "ns", "p")
    assert obj["status"] == {"x": 2} and obj["spec"] == {"a": 1} and obj["metadata"]["generation"] == 1
    await kube.patch(f"{POOLS}/p", json={"spec": {"a": 2}}, headers={"Content-Type": "application/merge-patch+json"})
    assert kube.read("slaq.dev/v1alpha1/inferencepools", "ns", "p")["metadata"]["generation"] == 2


async def test_json_patch_test_failure_is_422(kube: KubeEmulator) -> None:
    await kube.post(CM, json={"metadata": {"name": "a"}})
    resp = await kube.patch(f"{CM}/a", json=[{"op": "test", "path": "/metadata/resourceVersion", "value": "nope"},
                                             {"op": "add", "path": "/data", "value": {"k": "v"}}],
                            headers={"Content-Type": "application/json-patch+json"})
    assert resp.status == 422
    assert "data" not in kube.read("v1/configmaps", "ns", "a")


async def test_server_side_apply_creates_then_replaces(kube: KubeEmulator) -> None:
    url = f"{CM}/a?fieldManager=t&force=true"
    headers = {"Content-Type": "application/apply-patch+yaml"}
    first = await kube.patch(url, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"x": "1", "y": "2"}}, headers=headers)
    assert first.status == 201
    uid = (await first.json())["metadata"]["uid"]
    await kube.patch(url, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"x": "3"}}, headers=headers)
    obj = kube.read("v1/configmaps", "ns", "a")
    assert obj["data"] == {"x": "3"} and obj["metadata"]["uid"] == uid


async def test_finalizers_hold_deletion(kube: KubeEmulator) -> None:
    await kube.post(CM, json={"metadata": {"name": "a", "finalizers": ["f"]}})
    assert (await kube.delete(f"{CM}/a")).status == 202
    assert kube.read("v1/configmaps", "ns", "a")["metadata"]["deletionTimestamp"]
    await kube.patch(f"{CM}/a", json={"metadata": {"finalizers": None}}, headers={"Content-Type": "application/merge-patch+json"})
    assert kube.read("v1/configmaps", "ns", "a") is None


async def test_faults_answer_without_changing_state(kube: KubeEmulator) -> None:
    kube.fail("POST", "v1/configmaps", 500)
    assert (await kube.post(CM, json={"metadata": {"name": "a"}})).status == 500
    assert kube.read("v1/configmaps", "ns", "a") is None
    assert (await kube.post(CM, json={"metadata": {"name": "a"}})).status == 201


async def test_scale_subresource_writes_the_declared_path(kube: KubeEmulator) -> None:
    await kube.post(POOLS, json={"metadata": {"name": "p"}, "spec": {"replicas": {"min": 1, "max": 4, "desired": 1}}})
    resp = await kube.patch(f"{POOLS}/p/scale", json={"spec": {"replicas": 3}}, headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status == 200 and (await resp.json())["kind"] == "Scale"
    assert kube.read("slaq.dev/v1alpha1/inferencepools", "ns", "p")["spec"]["replicas"]["desired"] == 3


async def test_garbage_collection_follows_owner_references(kube: KubeEmulator) -> None:
    owner = await (await kube.post(CM, json={"metadata": {"name": "owner"}})).json()
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    await kube.post(CM, json={"metadata": {"name": "child", "ownerReferences": [ref]}})
    assert kube.collect_garbage() == []
    await kube.delete(f"{CM}/owner")
    assert [key[2] for key in kube.collect_garbage()] == ["child"]
    assert kube.read("v1/configmaps", "ns", "child") is None


async def test_core_discovery_and_namespace_list(kube: KubeEmulator) -> None:
    assert (await (await kube.get("/api/v1")).json())["groupVersion"] == "v1"
    await kube.post(CM, json={"metadata": {"name": "a"}})
    names = [n["metadata"]["name"] for n in (await (await kube.get("/api/v1/namespaces")).json())["items"]]
    assert "ns" in names


async def test_label_selectors_filter_lists(kube: KubeEmulator) -> None:
    await kube.post(CM, json={"metadata": {"name": "a", "labels": {"app": "x"}}})
    await kube.post(CM, json={"metadata": {"name": "b", "labels": {"app": "y"}}})
    items = (await (await kube.get(CM, params={"labelSelector": "app in (x,z)"})).json())["items"]
    assert [i["metadata"]["name"] for i in items] == ["a"]


@pytest.mark.parametrize(("selector", "labels", "expected"), [
    ("a=b", {"a": "b"}, True), ("a==b", {"a": "c"}, False), ("a!=b", {}, True), ("a", {"a": ""}, True),
    ("!a", {"a": "1"}, False), ("a in (b, c),d", {"a": "c", "d": "1"}, True), ("a notin (b)", {"a": "b"}, False),
])
def test_label_selector_syntax(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert label_selector_matches(selector, labels) is expected


async def _next_events(resp, count: int) -> list[dict]:
    import asyncio
    import json

    events = []
    while len(events) < count:
        line = await asyncio.wait_for(resp.content.readline(), timeout=5)
        if line.strip():
            events.append(json.loads(line))
    return events


async def test_watch_resumes_from_a_resource_version_without_replays(kube: KubeEmulator) -> None:
    await kube.post(CM, json={"metadata": {"name": "a"}})
    listing = await (await kube.get(CM)).json()
    rv = listing["metadata"]["resourceVersion"]
    await kube.post(CM, json={"metadata": {"name": "b"}})  # after the list: must arrive, once
    async with kube.get(CM, params={"watch": "true", "resourceVersion": rv}) as resp:
        await kube.patch(f"{CM}/a", json={"data": {"x": "1"}}, headers={"Content-Type": "application/merge-patch+json"})
        events = await _next_events(resp, 2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b"), ("MODIFIED", "a")]


async def test_watch_without_a_version_lists_then_streams_changes_once(kube: KubeEmulator) -> None:
    await kube.post(CM, json={"metadata": {"name": "a"}})
    async with kube.get(CM, params={"watch": "true"}) as resp:
        await kube.delete(f"{CM}/a")
        events = await _next_events(resp, 2)
    assert [e["type"] for e in events] == ["ADDED", "DELETED"]
    assert int(events[1]["object"]["metadata"]["resourceVersion"]) > int(events[0]["object"]["metadata"]["resourceVersion"])


async def test_a_secret_over_one_mebibyte_is_refused_like_the_api_server_does(kube: KubeEmulator) -> None:
    secrets = "/api/v1/namespaces/ns/secrets"
    just = base64.b64encode(b"x" * (1024 * 1024)).decode()
    over = base64.b64encode(b"x" * (1024 * 1024 + 1)).decode()
    assert (await kube.post(secrets, json={"metadata": {"name": "fits"}, "data": {"k": just}})).status == 201
    refused = await kube.post(secrets, json={"metadata": {"name": "big"}, "data": {"a": over}})
    assert refused.status == 422
    message = (await refused.json())["message"]
    assert "data: Too long" in message and "1048576" in message and "1048577" in message
    assert kube.read("v1/secrets", "ns", "big") is None
    # Apply and merge patch are held to the same limit (stringData counts too).
    apply = await kube.patch(f"{secrets}/fits?fieldManager=t&force=true", headers={"Content-Type": "application/apply-patch+yaml"},
                             json={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "fits"}, "data": {"k": just}, "stringData": {"s": "y"}})
    assert apply.status == 422
    grow = await kube.patch(f"{secrets}/fits", json={"data": {"more": base64.b64encode(b"y").decode()}},
                            headers={"Content-Type": "application/merge-patch+json"})
    assert grow.status == 422 and kube.read("v1/secrets", "ns", "fits")["data"] == {"k": just}
