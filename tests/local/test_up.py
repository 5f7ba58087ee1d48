"""`slaq up` without an engine: the access-log pass-through and the banner's metrics line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from slaq.local.stack import LocalStack, StackOptions
from slaq.local.up import AccessLines, is_access_line

ACCESS = '{"time":"2026-12-01T00:00:00.000Z","event":"request","tenant":"vip","status":200}'


def test_access_lines_hands_back_whole_access_lines_once(tmp_path: Path) -> None:
    log = tmp_path / "sidecar.log"
    follower = AccessLines(log)
    assert follower.read() == []  # no file yet
    log.write_text("2026-12-01 INFO uvicorn: started\n" + ACCESS + "\n" + ACCESS[:20])
    assert follower.read() == [ACCESS]
    with open(log, "a") as out:
        out.write(ACCESS[20:] + "\n{not json\n" + '{"event":"other"}\n')
    assert follower.read() == [ACCESS]  # the half line, completed; the rest is not an access line
    assert follower.read() == []


def test_is_access_line() -> None:
    assert is_access_line(ACCESS)
    assert not is_access_line('{"event": "startup"}') and not is_access_line("[1, 2]") and not is_access_line("INFO {")


def test_metrics_url_is_the_sidecars_metrics_port_when_there_is_a_sidecar(tmp_path: Path) -> None:
    stack = LocalStack(StackOptions(host="0.0.0.0", port=8000, metrics_port=9555), tmp_path)
    stack.engine_port, stack.port, stack.metrics_port = 8001, 8000, 9555
    assert stack.metrics_url == "http://127.0.0.1:8001"  # no sidecar: the engine serves its own metrics
    stack.sidecar = object()  # type: ignore[assignment]
    assert stack.metrics_url == "http://127.0.0.1:9555" and stack.url == "http://127.0.0.1:8000"


def test_up_accepts_metrics_port() -> None:
    from slaq.local import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["up", "--metrics-port", "9100"]).metrics_port == 9100
    assert parser.parse_args(["up"]).metrics_port == 0


def test_engine_and_sidecar_get_the_same_scheduler_config(tmp_path: Path) -> None:
    config = '{"agingBoundSeconds":30.0}'
    stack = LocalStack(StackOptions(tenant_table=tmp_path / "tenants.json", scheduler_config=config), tmp_path)
    stack.engine_port, stack.port, stack.metrics_port = 8001, 8000, 9555
    for command in (stack.engine_command(), stack.sidecar_command()):
        at = command.index("--scheduler-config")
        assert command[at + 1] == config
    plain = LocalStack(StackOptions(tenant_table=tmp_path / "tenants.json"), tmp_path)
    assert "--scheduler-config" not in plain.engine_command() + plain.sidecar_command()


def test_up_validates_the_scheduler_config_and_hands_it_on(monkeypatch, capsys, tmp_path: Path) -> None:
    from slaq.cli import main as slaq_main
    from slaq.local import up

    seen: list[up.UpOptions] = []
    monkeypatch.setattr(up, "main", lambda options: seen.append(options) or 0)
    spec = tmp_path / "scheduler.json"
    spec.write_text('{"agingBoundSeconds": 45}')
    assert slaq_main(["up", "--tenants", str(tmp_path), "--scheduler-config", str(spec)]) == 0
    assert json.loads(seen[0].scheduler_config)["agingBoundSeconds"] == 45.0
    assert slaq_main(["up", "--scheduler-config", '{"agingBoundSeconds": -1}']) == 2
    assert "agingBoundSeconds" in capsys.readouterr().err


def test_the_demos_sidecar_gets_the_free_tiers_handover_bound(tmp_path: Path) -> None:
    """The demo's slaq stack runs its sidecar with `SIDECAR_ARGS` (decision 0023's bound), which the
    sidecar's own command line reads; a stack without them runs the pool's default (no bound)."""
    from slaq.local.demo import SIDECAR_ARGS
    from slaq.sidecar.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    for sidecar_args, bound in ((SIDECAR_ARGS, 4), ((), 0)):
        stack = LocalStack(StackOptions(tenant_table=tmp_path / "tenants.json", sidecar_args=sidecar_args), tmp_path)
        stack.engine_port, stack.port, stack.metrics_port = 8001, 8000, 9555
        command = stack.sidecar_command()
        assert parser.parse_args(command[command.index("sidecar"):]).batch_handover_target == bound
