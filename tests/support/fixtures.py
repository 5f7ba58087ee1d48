"""Fixtures over the fakes in `slaq.testing`: `kube` (the API emulator) and `fake_upstream` (the fake engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import pytest_asyncio

from slaq.testing.fake_engine import FakeEngine, ServerThread
from slaq.testing.kube import KubeEmulator, write_kubeconfig

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest_asyncio.fixture()
async def kube(tmp_path: Path, monkeypatch: Any) -> AsyncIterator[KubeEmulator]:
    """A running emulator with the built-in resources and slaq's CRDs, and a kubeconfig for it."""
    async with KubeEmulator() as emulator, kmock.Server(emulator):
        emulator.resources.load_bundled()
        emulator.install_crds(sorted((REPO_ROOT / "crds").glob("*.yaml")))
        emulator.kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(emulator.url).rstrip("/"))
        monkeypatch.setenv("KUBECONFIG", str(emulator.kubeconfig))
        try:  # the kubernetes client reads $KUBECONFIG once, at import
            from kubernetes.config import kube_config
            monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(emulator.kubeconfig))
        except ImportError:
            pass
        yield emulator


@pytest.fixture(scope="session")
def _fake_upstream_server() -> Iterator[tuple[FakeEngine, ServerThread]]:
    engine = FakeEngine()
    with ServerThread(engine) as server:
        yield engine, server


@pytest.fixture
def fake_upstream(_fake_upstream_server: tuple[FakeEngine, ServerThread]) -> tuple[FakeEngine, str]:
    """(the fake engine, its base URL); its records are cleared for each test."""
    engine, server = _fake_upstream_server
    engine.reset()
    return engine, server.url
