"""At least 30 malformed requests each get a 4xx with a machine-readable reason; the sidecar keeps serving."""

from __future__ import annotations

import json

import pytest

from tests.sidecar.tables import bearer

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def chat(**fields: object) -> bytes:
    return json.dumps({"model": "fake-model", "messages": MSG, **fields}).encode()


def comp(**fields: object) -> bytes:
    return json.dumps({"model": "fake-model", "prompt": "hi", **fields}).encode()


CASES: list[tuple[str, str, bytes, int, str]] = [
    ("truncated json", CHAT, b'{"messages": [', 400, "malformed_json"),
    ("not json", CHAT, b"hello", 400, "malformed_json"),
    ("empty body", CHAT, b"", 400, "malformed_json"),
    ("NaN literal", COMP, b'{"prompt": "x", "temperature": NaN}', 400, "malformed_json"),
    ("not utf-8", CHAT, b'{"messages": "\xff"}', 400, "malformed_json"),
    ("deep nesting", CHAT, b"[" * 100_000 + b"]" * 100_000, 400, "malformed_json"),
    ("array body", CHAT, b"[]", 400, "invalid_field"),
    ("string body", COMP, b'"prompt"', 400, "invalid_field"),
    ("missing messages", CHAT, json.dumps({"model": "fake-model"}).encode(), 400, "invalid_field"),
    ("empty messages", CHAT, chat(messages=[]), 400, "invalid_field"),
    ("messages not list", CHAT, chat(messages="hi"), 400, "invalid_field"),
    ("message not object", CHAT, chat(messages=["hi"]), 400, "invalid_field"),
    ("unknown role", CHAT, chat(messages=[{"role": "root", "content": "x"}]), 400, "invalid_field"),
    ("missing user content", CHAT, chat(messages=[{"role": "user"}]), 400, "invalid_field"),
    ("content wrong type", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "invalid_field"),
    ("content part without type", CHAT, chat(messages=[{"role": "user", "content": [{"text": "x"}]}]), 400, "invalid_field"),
    ("missing prompt", COMP, json.dumps({"model": "fake-model"}).encode(), 400, "invalid_field"),
    ("empty prompt", COMP, comp(prompt=""), 400, "invalid_field"),
    ("prompt wrong type", COMP, comp(prompt={"text": "x"}), 400, "invalid_field"),
    ("negative token id", COMP, comp(prompt=[1, -2]), 400, "invalid_field"),
    ("mixed prompt list", COMP, comp(prompt=["a", 1]), 400, "invalid_field"),
    ("negative max_tokens", CHAT, chat(max_tokens=-1), 400, "invalid_field"),
    ("zero max_tokens", COMP, comp(max_tokens=0), 400, "invalid_field"),
    ("huge max_tokens", COMP, comp(max_tokens=10**12), 400, "invalid_field"),
    ("string max_tokens", CHAT, chat(max_tokens="10"), 400, "invalid_field"),
    ("float max_tokens", CHAT, chat(max_tokens=1.5), 400, "invalid_field"),
    ("bool max_completion_tokens", CHAT, chat(max_completion_tokens=True), 400, "invalid_field"),
    ("stream not bool", CHAT, chat(stream="yes"), 400, "invalid_field"),
    ("negative temperature", CHAT, chat(temperature=-1), 400, "invalid_field"),
    ("top_p above one", COMP, comp(top_p=1.5), 400, "invalid_field"),
    ("n zero", COMP, comp(n=0), 400, "invalid_field"),
    ("n huge", COMP, comp(n=10_000), 400, "invalid_field"),
    ("stop wrong type", CHAT, chat(stop=[1, 2]), 400, "invalid_field"),
    ("model wrong type", CHAT, chat(model=7), 400, "invalid_field"),
    ("unknown model", CHAT, chat(model="gpt-4"), 404, "unknown_model"),
    ("unknown model completions", COMP, comp(model="other"), 404, "unknown_model"),
    ("stream_options not object", CHAT, chat(stream=True, stream_options=True), 400, "invalid_field"),
    ("seed not int", COMP, comp(seed="x"), 400, "invalid_field"),
]


@pytest.fixture(scope="module")
def shared_sidecar(tmp_path_factory, _fake_upstream_server):
    """One sidecar for all cases: it must survive every one of them in turn."""
    from slaq.sidecar.server import SidecarOptions, build_app
    from tests.sidecar.conftest import RunningSidecar, write_table
    from tests.support.polling import wait_for
    from tests.sidecar.tables import abc_table

    path = tmp_path_factory.mktemp("malformed") / "tenants.json"
    write_table(path, abc_table())
    options = SidecarOptions(host="127.0.0.1", port=0, engine_url=_fake_upstream_server[1].url, tenant_table=path, served_model_name="fake-model")
    app = build_app(options)
    running = RunningSidecar(app, path)
    wait_for(lambda: running.client.get("/ready").status_code == 200, what="ready")
    yield running
    running.stop()


def test_there_are_at_least_thirty_cases() -> None:
    assert len(CASES) + len(OTHER_CASES) >= 30


@pytest.mark.parametrize("name,path,raw,status,reason", CASES, ids=[c[0] for c in CASES])
def test_malformed_body(shared_sidecar, name: str, path: str, raw: bytes, status: int, reason: str) -> None:
    response = shared_sidecar.client.post(path, content=raw, headers={**bearer("std"), "content-type": "application/json"})
    assert response.status_code == status, response.text
    body = response.json()
    assert body["reason"] == reason
    assert body["error"]["message"]
    good = shared_sidecar.client.post(CHAT, content=chat(max_tokens=2), headers={**bearer("std"), "content-type": "application/json"})
    assert good.status_code == 200


OTHER_CASES = ["oversized body", "wrong content type", "form body", "get on completions"]


def test_oversized_body_is_413(shared_sidecar) -> None:
    big = chat(messages=[{"role": "user", "content": "x" * (17 * 1024 * 1024)}])
    response = shared_sidecar.client.post(CHAT, content=big, headers={**bearer("std"), "content-type": "application/json"})
    assert response.status_code == 413 and response.json()["reason"] == "body_too_large"
    assert shared_sidecar.client.post(CHAT, content=chat(), headers=bearer("std")).status_code == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_wrong_content_type_is_415(shared_sidecar, content_type: str) -> None:
    response = shared_sidecar.client.post(CHAT, content=chat(), headers={**bearer("std"), "content-type": content_type})
    assert response.status_code == 415 and response.json()["reason"] == "unsupported_media_type"


def test_get_on_completions_is_405(shared_sidecar) -> None:
    response = shared_sidecar.client.get(COMP, headers=bearer("std"))
    assert response.status_code == 405 and response.json()["reason"] == "method_not_allowed"


def test_refusals_are_counted_and_the_sidecar_still_serves(shared_sidecar) -> None:
    metrics = shared_sidecar.metrics.get("/metrics").text
    assert 'slaq_rejections_total{reason="invalid_field",tier="standard"}' in metrics
    assert shared_sidecar.client.get("/health").status_code == 200
    assert shared_sidecar.app.core.quotas.in_flight("std") == 0 and len(shared_sidecar.app.core.queue) == 0
