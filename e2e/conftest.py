"""Whole-system fixtures: one control plane (emulator + operator) and one pod run from its rendered
spec, shared by the tests of a module (an engine start costs 1-2 minutes on 2 cores)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import yaml

from e2e.cluster import ControlPlane
from tests.support.polling import wait_for
from e2e.pod import PodSpecRun
from slaq.local.processes import wait_ready

EXAMPLES = Path(__file__).resolve().parents[1] / "crds" / "examples"
POOL_NAMESPACE, POOL_NAME = "default", "tiny-cpu"
ENGINE_START_TIMEOUT_S = 420.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quota-skew-report", type=Path, default=None, metavar="PATH",
                     help="e2e/test_quota_skew.py writes its figures here as a JSON report with the run's envelope "
                          "(docs/results.md renders it); by default it writes none")


def example_docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


@pytest.fixture(scope="module")
def control_plane() -> Iterator[ControlPlane]:
    plane = ControlPlane().start()
    try:
        for doc in example_docs("tenant-keys.yaml") + example_docs("tenants.yaml") + example_docs("pool-cpu.yaml"):
            plane.create(doc)
        yield plane
    finally:
        plane.close()


@pytest.fixture(scope="module")
def rendered(control_plane: ControlPlane) -> tuple[dict, dict[str, str]]:
    """The Deployment's pod template and the table Secret's files, once the operator has rendered both with 3 tenants."""
    from slaq.operator.names import table_secret_name

    deployment = wait_for(lambda: control_plane.get("apps/v1", "deployments", POOL_NAMESPACE, POOL_NAME), 60,
                          "the operator to render the pool's Deployment")
    files, _ = wait_for(lambda: (t := control_plane.table(POOL_NAMESPACE, table_secret_name(POOL_NAME))) and len(t[1].tenants) == 3 and t,
                        60, "the tenant table Secret with three tenants")
    return deployment["spec"]["template"], files


@pytest.fixture(scope="module")
def pod(rendered: tuple[dict, dict[str, str]]) -> Iterator[PodSpecRun]:
    from slaq.operator.names import table_secret_name

    template, table_files = rendered
    run = PodSpecRun(template, POOL_NAMESPACE)
    run.write_secret(table_secret_name(POOL_NAME), table_files)
    try:
        engine = run.start("engine")
        sidecar = run.start("sidecar")
        try:
            wait_ready([engine, sidecar], ENGINE_START_TIMEOUT_S)
        except Exception as exc:
            from slaq.local.stack import describe_failure

            pytest.fail(describe_failure(exc) if hasattr(exc, "child") else str(exc))
        yield run
    finally:
        run.cleanup()
