"""A rotated API key: from the key Secret's change to a real `slaq sidecar` process accepting it.

The operator runs against the API emulator and watches the key Secret (operator/src/slaq/operator/keys.py);
a stand-in for the kubelet copies the pool's table Secret into the sidecar's table file as soon
as it changes (a real kubelet adds its own Secret-volume sync delay, see operator/README.md); the
sidecar is the real process, in front of the fake engine.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from slaq.api.runtime import READY_PATH, TENANT_TABLE_KEY
from slaq.local.processes import free_port, slaq_command, start_child, wait_ready
from slaq.operator.names import table_secret_name
from tests.operator.test_operator_kmock import create, docs, entries, merge_patch, operator
from slaq.testing.fake_engine import FakeEngine
from slaq.testing.kube import KubeEmulator
from tests.support.polling import eventually

OLD_KEY = "sk-demo-vip-0123456789abcdef"
NEW_KEY = "sk-rotated-vip-fedcba9876543210"
ROTATION_DEADLINE_S = 5.0  # issue 16: the rotated key is accepted within 5 s of the Secret change
POOL = ("default", "tiny-cpu")


@asynccontextmanager
async def kubelet(kube: KubeEmulator, table_file: Path) -> AsyncIterator[None]:
    """Copies the table Secret's sidecar key into `table_file` whenever it changes (atomic rename)."""

    async def sync() -> None:
        last = None
        while True:
            secret = kube.read("v1/secrets", POOL[0], table_secret_name(POOL[1]))
            data = ((secret or {}).get("data") or {}).get(TENANT_TABLE_KEY)
            if data is not None and data != last:
                staged = table_file.with_suffix(".new")
                staged.write_bytes(base64.b64decode(data))
                staged.replace(table_file)
                last = data
            await asyncio.sleep(0.05)

    task = asyncio.create_task(sync())
    try:
        yield
    finally:
        task.cancel()


async def status(http: httpx.AsyncClient, key: str) -> int:
    response = await http.post("/v1/completions", headers={"authorization": f"Bearer {key}"},
                               json={"model": "fake-model", "prompt": "hi", "max_tokens": 1})
    return response.status_code


async def test_a_rotated_key_is_accepted_by_the_sidecar_within_five_seconds(
        kube: KubeEmulator, fake_upstream: tuple[FakeEngine, str], tmp_path: Path) -> None:
    table_file = tmp_path / "tenants" / TENANT_TABLE_KEY
    table_file.parent.mkdir()
    port, metrics_port = free_port(), free_port()
    async with operator(kube), kubelet(kube, table_file):
        for doc in docs("tenant-keys.yaml") + docs("tenants.yaml") + docs("pool-cpu.yaml"):
            await create(kube, doc)
        await eventually(lambda: table_file.is_file() and len(entries(kube, *POOL)) == 3, what="the pool's table on disk")
        sidecar = start_child("sidecar", slaq_command(
            "sidecar", "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
            "--engine-url", fake_upstream[1], "--tenant-table", str(table_file), "--served-model-name", "fake-model",
            # the poll below tries the new key every 0.1 s until it is accepted: dozens of failed
            # authentications from one address, which the throttle (tests/sidecar/test_edge.py) would answer with 429
            "--auth-failure-limit", "0"),
            tmp_path / "sidecar.log", f"http://127.0.0.1:{port}{READY_PATH}")
        try:
            await asyncio.to_thread(wait_ready, [sidecar], 120.0)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as http:
                assert (await status(http, OLD_KEY), await status(http, NEW_KEY)) == (200, 401)
                await merge_patch(kube, "/api/v1/namespaces/slaq-system/secrets/tenant-vip-keys",
                                  {"data": {"demo": base64.b64encode(NEW_KEY.encode()).decode()}})
                changed = time.monotonic()
                deadline = changed + ROTATION_DEADLINE_S
                while (got := await status(http, NEW_KEY)) != 200:
                    assert got == 401, f"the new key got {got}"
                    assert time.monotonic() < deadline, f"the rotated key was not accepted within {ROTATION_DEADLINE_S} s"
                    await asyncio.sleep(0.1)
                print(f"rotated key accepted {time.monotonic() - changed:.2f} s after the Secret change")
                assert await status(http, OLD_KEY) == 401  # the replaced key no longer works
        finally:
            sidecar.stop()
