"""A sidecar served on 127.0.0.1 in front of the fake upstream (or any engine URL)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from slaq.api.table import TenantTable
from slaq.sidecar.app import SidecarApp
from slaq.sidecar.server import PortRouter, SidecarOptions, bind, build_app, connection_settings
from tests.sidecar.tables import abc_table
from slaq.testing.fake_engine import FakeEngine, ServerThread
from tests.support.polling import wait_for


def write_table(path: Path, table: TenantTable) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(table.model_dump_json(by_alias=True))
    os.replace(tmp, path)


class SidecarThread(ServerThread):
    """A sidecar app served as `slaq sidecar` serves it: one server, the tenant and metrics ports."""

    def __init__(self, app: SidecarApp) -> None:
        sockets = [bind("127.0.0.1", 0), bind("127.0.0.1", 0)]
        self.metrics_port = sockets[1].getsockname()[1]
        super().__init__(PortRouter(app, self.metrics_port), port=sockets[0].getsockname()[1], **connection_settings(app.connection_limits, self.metrics_port))
        self.thread = threading.Thread(target=self.server.run, args=(sockets,), name=f"sidecar-{self.port}", daemon=True)


class RunningSidecar:
    """The tenant port (`client`) and the metrics port (`metrics`) of one sidecar app."""

    def __init__(self, app: SidecarApp, table_path: Path) -> None:
        self.server, self.table_path, self.app = SidecarThread(app).start(), table_path, app
        self.url = self.server.url
        self.metrics_url = f"http://127.0.0.1:{self.server.metrics_port}"
        self.client = httpx.Client(base_url=self.url, timeout=30.0)
        self.metrics = httpx.Client(base_url=self.metrics_url, timeout=30.0)

    def stop(self) -> None:
        self.client.close()
        self.metrics.close()
        self.server.stop()


@pytest.fixture
def start_sidecar(tmp_path: Path) -> Iterator[Callable[..., RunningSidecar]]:
    started: list[RunningSidecar] = []

    def start(engine_url: str, table: TenantTable | None = None, **options) -> RunningSidecar:
        path = tmp_path / f"tenants-{len(started)}.json"
        write_table(path, table or abc_table())
        opts = SidecarOptions(host="127.0.0.1", port=0, engine_url=engine_url, tenant_table=path, **options)
        sidecar = RunningSidecar(build_app(opts), path)
        started.append(sidecar)
        wait_for(lambda: sidecar.client.get("/ready").status_code == 200, what="sidecar ready")
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop()


@pytest.fixture
def sidecar(start_sidecar, fake_upstream: tuple[FakeEngine, str]) -> RunningSidecar:
    """A sidecar for model `fake-model` in front of the fake upstream, A/B/C tenants."""
    return start_sidecar(fake_upstream[1], served_model_name="fake-model")
