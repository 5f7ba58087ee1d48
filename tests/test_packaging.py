"""Every source folder is a subpackage of `slaq`, importable under its mapped name."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_mapped_folder_is_listed_and_importable() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages, mapping = set(config["packages"]), config["package-dir"]
    for top_name, top_folder in mapping.items():
        for init in (ROOT / top_folder).rglob("__init__.py"):
            rest = init.parent.relative_to(ROOT / top_folder).parts
            name = ".".join((top_name, *rest))
            assert name in packages, f"{init.parent} is not listed in pyproject's packages as {name}"
            module = importlib.import_module(name)
            assert Path(module.__file__).resolve().parent == init.parent.resolve()


def _from_root_without_safe_path(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_no_folder_at_the_root_shadows_the_standard_library() -> None:
    # `python -S` skips site (and the .pth files that import operator early), so the repository
    # root, first on sys.path, is where `operator` would be found if a package there shadowed it.
    plain = _from_root_without_safe_path("-S", "-c", "import collections, operator; print(operator.__file__)")
    assert plain.returncode == 0, plain.stderr
    assert str(ROOT / "operator") not in plain.stdout
    collected = _from_root_without_safe_path("-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "tests/test_packaging.py")
    assert collected.returncode == 0, collected.stdout + collected.stderr


def test_scripts_need_no_safe_path() -> None:
    for script in ("setup.sh", "test.sh"):
        assert "PYTHONSAFEPATH" not in (ROOT / "scripts" / script).read_text()


def _imported_top_names_of(text: str, source: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(text, str(source))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _imported_top_names(folder: Path) -> set[str]:
    return set().union(*(_imported_top_names_of(source.read_text(), source) for source in folder.rglob("*.py")))


def test_every_third_party_import_of_the_package_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    declared = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}
    mapping = {k: v for k, v in importlib.metadata.packages_distributions().items()}
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    imported = set().union(*(_imported_top_names(ROOT / folder) for folder in folders))
    third_party = imported - set(sys.stdlib_module_names) - {"slaq", "__future__"}
    undeclared = {}
    for name in sorted(third_party):
        distributions = {d.lower().replace("_", "-") for d in mapping.get(name, [])}
        assert distributions, f"{name} is imported by the package but no installed distribution provides it"
        if not distributions & declared:
            undeclared[name] = sorted(distributions)
    assert not undeclared, f"imported by the package, declared nowhere in pyproject.toml: {undeclared}"


TESTS_IMPORT = re.compile(r"^\s*(?:from|import)\s+tests(?:\.|\s|$)|[;\"']\s*(?:from|import)\s+tests\.", re.MULTILINE)
SYS_PATH_EDIT = re.compile(r"\bsys\.path\.(?:insert|append|extend)\(")


def test_no_package_module_imports_the_tests() -> None:
    # An installed slaq has no tests/; the text check also catches code run as `python -c "..."`.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    offenders = []
    for folder in {*config["package-dir"].values()}:
        for source in (ROOT / folder).rglob("*.py"):
            text = source.read_text()
            if "tests" in _imported_top_names_of(text, source) or TESTS_IMPORT.search(text) or SYS_PATH_EDIT.search(text):
                offenders.append(str(source.relative_to(ROOT)))
    assert not offenders, f"package modules reaching into tests/ or sys.path: {sorted(offenders)}"


def test_the_import_check_sees_a_test_import() -> None:
    assert TESTS_IMPORT.search("from tests.support.kube import KubeEmulator")
    assert TESTS_IMPORT.search('CODE = "import uvicorn; from tests.support.x import y"')
    assert not TESTS_IMPORT.search("# the tests import this module")
    assert SYS_PATH_EDIT.search("sys.path.insert(0, str(ROOT))") and SYS_PATH_EDIT.search("import sys; sys.path.append('/x')")
