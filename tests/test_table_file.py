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


def entry(name: str) -> dict[str, object]:
    return {"name": name, "tier": "standard", "cacheSalt": "s" * 64}


def test_a_table_split_over_several_files_is_read_as_one(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    file = TableFile(path, TenantTable)
    swap_in(path, TenantTable.model_validate({"pool": "ns/p", "revision": "a", "part": 0, "parts": 2, "tenants": [entry("b")]}).model_dump_json(by_alias=True))
    change = file.poll()
    assert change is not None and change.table is None and "tenants-1.json" in change.error  # part 1 not synced yet
    swap_in(tmp_path / "tenants-1.json",
            TenantTable.model_validate({"pool": "ns/p", "revision": "c", "part": 1, "parts": 2, "tenants": [entry("a")]}).model_dump_json(by_alias=True))
    change = file.poll()  # a change of part 1 alone is seen: the signature covers every part
    assert change is not None and change.error is None
    assert [t.name for t in change.table.tenants] == ["a", "b"] and change.table.revision == "a+c" and change.table.parts is None
    # A part from another split (the kubelet synced part 0 of a 4-way split first) keeps the old table.
    swap_in(path, TenantTable.model_validate({"pool": "ns/p", "part": 0, "parts": 4}).model_dump_json(by_alias=True))
    change = file.poll()
    assert change is not None and change.table is None and change.error is not None


def test_engine_table_parts_join_too(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    fingerprint = "0" * 16
    for part, name in enumerate(("x", "y")):
        swap_in(tmp_path / ("engine.json" if part == 0 else "engine-1.json"), EngineTable.model_validate(
            {"pool": "ns/p", "part": part, "parts": 2, "tenants": [{"name": name, "saltFingerprint": fingerprint}]}).model_dump_json(by_alias=True))
    table = TableFile(path, EngineTable).read()
    assert table.kv_shares() == {"x": 1.0, "y": 1.0}
