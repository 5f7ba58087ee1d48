"""The queue discipline's hosts (the engine's waiting queue, the sidecar's queue) use `TieredQueue`'s
verbs only: no module of slaq.engine or slaq.sidecar reads the queue's private state (its heaps,
live map, the entry behind a `Choice`), and no module that imports the discipline (a host) indexes
an entry by position. Read from the source (an AST scan), so a host that reaches in again fails
here, not in production when the queue's layout changes. (Other modules keep tuples of their own
named `entry`: the KV vault's.)"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

import slaq.policy.discipline as discipline

QUEUE_CLASSES = ("TieredQueue", "Choice", "Entry")
HOST_PACKAGES = ("slaq.engine", "slaq.sidecar")
ENTRY_LIKE = re.compile(r"entry|entries|head", re.IGNORECASE)  # names hosts gave the queue's entries


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def queue_private_names() -> frozenset[str]:
    """Private attributes and methods of the discipline's queue classes, read from their source."""
    tree = ast.parse(Path(discipline.__file__).read_text())
    names: set[str] = set()
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in QUEUE_CLASSES):
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" and _private(node.attr):
                names.add(node.attr)
            elif isinstance(node, ast.FunctionDef) and _private(node.name):
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _private(node.target.id):
                names.add(node.target.id)
    return frozenset(names)


def _terminal_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _terminal_name(node.func)
    return None


def _is_number(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def hosts_the_queue(tree: ast.Module) -> bool:
    """Whether a module imports the discipline (only such a module can hold the queue's entries)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == discipline.__name__:
            return True
        if isinstance(node, ast.Import) and any(alias.name == discipline.__name__ for alias in node.names):
            return True
    return False


def reaching_in(source: str, filename: str, private: frozenset[str]) -> list[str]:
    """Where `source` reads a queue's private attribute (or its old public `heaps`) on anything but
    `self`, or, in a module that hosts the queue, indexes by number something named like an entry
    or a head."""
    tree = ast.parse(source, filename)
    host = hosts_the_queue(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (node.attr in private or node.attr == "heaps"):
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                found.append(f"{filename}:{node.lineno}: reads .{node.attr}")
        elif host and isinstance(node, ast.Subscript) and _is_number(node.slice):
            name = _terminal_name(node.value)
            if name is not None and ENTRY_LIKE.search(name):
                found.append(f"{filename}:{node.lineno}: indexes {name}[{ast.unparse(node.slice)}] by position")
    return found


def host_modules() -> list[Path]:
    paths: list[Path] = []
    for package in HOST_PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, package
        for location in spec.submodule_search_locations:
            paths.extend(sorted(Path(location).rglob("*.py")))
    return paths


def test_the_scan_knows_the_queues_private_state() -> None:
    private = queue_private_names()
    assert {"_heaps", "_missed", "_live", "_entry", "_heap", "_head", "_settle_missed"} <= private


def test_no_host_reads_the_queues_internals_or_indexes_its_entries() -> None:
    private = queue_private_names()
    modules = host_modules()
    hosts = {(path.parent.name, path.name) for path in modules if hosts_the_queue(ast.parse(path.read_text()))}
    assert {("engine", "queue.py"), ("sidecar", "queue.py")} <= hosts  # the hosts are scanned, as hosts
    found = [hit for path in modules for hit in reaching_in(path.read_text(), str(path), private)]
    assert found == []


@pytest.mark.parametrize("line", [
    # what the hosts did before the queue was closed
    "heap = tiers.heaps[LOWEST_RANK]",
    "entry = head[3]",
    "done = head[0] == BAND_WAITING",
    "found.append(entry[-1])",
    "heap = self._tiers._heaps[0]",
    "live = tiers._live.get(key)",
    "heapq.heappush(choice._heap, choice._entry)",
    "item = queue.tiers._head(heap)[3]",
])
def test_the_scan_catches_a_host_reaching_in(line: str) -> None:
    source = f"from slaq.policy.discipline import TieredQueue\n{line}\n"
    assert len(reaching_in(source, "host.py", queue_private_names())) >= 1


@pytest.mark.parametrize("line", [
    "due = anchor[0] + (delivered - anchor[1] + 1) * tpot",
    "self._passed.append(choice)",
    "request = choice.item",
    "first = rank[0]",
    "tiers.pass_over(choice)",
])
def test_the_scan_passes_what_is_not_the_queues(line: str) -> None:
    source = f"from slaq.policy.discipline import TieredQueue\n{line}\n"
    assert reaching_in(source, "host.py", queue_private_names()) == []


def test_a_module_that_does_not_host_the_queue_may_index_tuples_of_its_own() -> None:
    assert reaching_in("key = entry[0]\n", "vault.py", queue_private_names()) == []
    assert reaching_in("import slaq.policy.discipline\nkey = entry[0]\n", "host.py", queue_private_names()) != []
