"""slaq.table_file.TableFile: the one table watcher, behind both the sidecar's and the engine's table."""

from __future__ import annotations

import os
from pathlib import Path

from slaq.api.table import EngineTable, TenantTable
from slaq.engine.config import EngineTableWatcher
from slaq.sidecar.tenants import TenantDirectory
from slaq.table_file import TableFile


def swap_in(path: Path, text: str) -> None:
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)  # as the kubelet swaps a Secret volume's files


def test_reports_each_change_once_and_names_the_file_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    file = TableFile(path, EngineTable, what="engine table")
    first = file.poll()
    assert first is not None and first.table is None and first.error == f"engine table {path} is missing"
    assert file.poll() is None  # still missing: reported once
    swap_in(path, '{"pool": "ns/p", "revision": "r1"}')
    change = file.poll()
    assert change is not None and change.table == EngineTable(pool="ns/p", revision="r1") and change.error is None
    assert file.poll() is None
    swap_in(path, '{"pool": "ns/p", "tenants": [{"name": "x", "keyHashes": []}]}')
    change = file.poll()
    assert change is not None and change.table is None and change.error.startswith(f"invalid engine table {path}")
    swap_in(path, '{"pool": "ns/p", "revision": "r2"}')
    assert file.poll().table.revision == "r2"


def test_mark_seen_and_the_interval_limit_how_often_it_looks(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    swap_in(path, '{"pool": "ns/p", "revision": "r1"}')
    now = [0.0]
    file = TableFile(path, EngineTable, interval_s=2.0, clock=lambda: now[0])
    file.mark_seen()
    swap_in(path, '{"pool": "ns/p", "revision": "r2"}')
    assert file.poll() is None  # before the interval: not even a stat
    now[0] = 2.0
    assert file.poll().table.revision == "r2"


def test_the_sidecar_and_the_engine_watch_their_tables_with_it(tmp_path: Path) -> None:
    sidecar = TenantDirectory(tmp_path / "tenants.json")
    engine = EngineTableWatcher(tmp_path / "engine.json")
    assert isinstance(sidecar._file, TableFile) and sidecar._file.model is TenantTable
    assert isinstance(engine._file, TableFile) and engine._file.model is EngineTable
