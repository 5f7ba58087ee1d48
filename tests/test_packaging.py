"""The package's layout: one import package, `slaq`, whose every module is the file of its name under
slaq/, so that it has one name (nothing else at the repository root imports as a component) and
anything that resolves imports by path (an editor, a type checker) finds it."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "slaq"
# The only Python packages at the repository root besides slaq: the tests, never installed.
ROOT_PACKAGES = {"slaq", "tests", "e2e"}
# Names the components had, or could be imported by, when they were folders at the root.
FORMER_NAMES = ("sidecar", "engine", "kernels", "bench", "src", "api", "policy", "local", "testing")


def _listed_packages() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def _module_name(source: Path) -> str:
    parts = source.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_package_folder_is_listed_and_importable() -> None:
    packages = _listed_packages()
    for init in PACKAGE.rglob("__init__.py"):
        name = _module_name(init)
        assert name in packages, f"{init.parent.relative_to(ROOT)} is not listed in pyproject's packages as {name}"
        module = importlib.import_module(name)
        assert Path(module.__file__).resolve().parent == init.parent.resolve()
    for name in packages:
        assert (ROOT.joinpath(*name.split(".")) / "__init__.py").is_file(), f"{name} is listed but is no folder with an __init__.py"


def test_every_folder_with_modules_is_a_package() -> None:
    # A folder of modules without __init__.py would be a namespace package: a wheel leaves it out.
    loose = sorted(str(f.relative_to(ROOT)) for f in {p.parent for p in PACKAGE.rglob("*.py")} if not (f / "__init__.py").is_file())
    assert not loose, f"folders of modules under slaq/ without an __init__.py: {loose}"


def test_nothing_at_the_root_imports_but_slaq_and_the_tests() -> None:
    importable = {p.parent.name for p in ROOT.glob("*/__init__.py")} | {p.stem for p in ROOT.glob("*.py")} - {"conftest"}
    assert importable <= ROOT_PACKAGES, f"importable from the repository root besides {sorted(ROOT_PACKAGES)}: {sorted(importable - ROOT_PACKAGES)}"


PROBE = """
import importlib.util, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except ImportError as error:
        spec = None
    found[name] = spec.origin if spec is not None else None
print(json.dumps(found))
"""


def _found_from(cwd: Path, *names: str) -> dict[str, str | None]:
    """What `import NAME` would load for each name, in a Python started in `cwd` (first on sys.path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    done = subprocess.run([sys.executable, "-c", PROBE, *names], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_no_module_has_a_second_name_from_the_repository_root() -> None:
    # From the root, and from each folder a script may run in (its folder is then first on sys.path).
    for cwd in (ROOT, ROOT / "scripts"):
        found = _found_from(cwd, *FORMER_NAMES, "slaq.sidecar")
        assert Path(found.pop("slaq.sidecar")) == PACKAGE / "sidecar" / "__init__.py"  # the probe sees the package
        second = {name: origin for name, origin in found.items() if origin is not None and Path(origin).resolve().is_relative_to(ROOT)}
        assert not second, f"from {cwd.relative_to(ROOT) if cwd != ROOT else 'the root'}, importable under a second name: {second}"


def test_no_module_of_this_run_was_loaded_under_a_second_name() -> None:
    seconds = {}
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and Path(origin).resolve().is_relative_to(PACKAGE) and _module_name(Path(origin).resolve()) != name:
            seconds[name] = origin
    assert not seconds, f"modules of slaq/ loaded under another name: {seconds}"


def resolve_by_path(name: str, search_path: list[str]) -> Path | None:
    """The file `name` resolves to by looking only at folders, package by package, as an editor or a
    type checker does: no import hooks (setuptools' default editable finder is one), nothing imported."""
    path: list[str] | None = search_path
    spec = None
    for index in range(len(parts := name.split("."))):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:index + 1]), path)
        if spec is None or spec.origin is None:
            return None
        path = list(spec.submodule_search_locations or [])
    return Path(spec.origin) if spec is not None else None


def test_every_module_resolves_by_its_path_to_the_file_python_imports() -> None:
    modules = sorted(_module_name(source) for source in PACKAGE.rglob("*.py"))
    unresolved = {name: str(found) for name in modules
                  if (found := resolve_by_path(name, [str(ROOT)])) != ROOT.joinpath(*name.split(".")).with_suffix(".py")
                  and found != ROOT.joinpath(*name.split(".")) / "__init__.py"}
    assert not unresolved, f"modules that do not resolve by path from the repository root: {unresolved}"
    # Python itself, from anywhere, loads the same files (an installed copy would differ only in place).
    for name in ("slaq", "slaq.sidecar", "slaq.operator", "slaq.kernels", "slaq.bench"):
        origin = _found_from(Path("/"), name)[name]
        assert origin is not None and Path(origin).resolve().is_relative_to(PACKAGE), f"{name} imports from {origin}"


def test_resolution_by_path_sees_a_package_only_an_import_hook_provides(tmp_path: Path) -> None:
    # The layout this replaces: slaq/ at the root, its sidecar in a folder beside it (mapped by setuptools).
    (tmp_path / "slaq").mkdir()
    (tmp_path / "slaq" / "__init__.py").write_text("")
    (tmp_path / "sidecar").mkdir()
    (tmp_path / "sidecar" / "__init__.py").write_text("")
    (tmp_path / "sidecar" / "errors.py").write_text("")
    assert resolve_by_path("slaq", [str(tmp_path)]) == tmp_path / "slaq" / "__init__.py"
    assert resolve_by_path("slaq.sidecar.errors", [str(tmp_path)]) is None
    assert resolve_by_path("sidecar.errors", [str(tmp_path)]) == tmp_path / "sidecar" / "errors.py"  # the second name


def _from_root_without_safe_path(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_no_folder_at_the_root_shadows_the_standard_library() -> None:
    # `python -S` skips site (and the .pth files that import operator early), so the repository
    # root, first on sys.path, is where `operator` would be found if a package there shadowed it.
    plain = _from_root_without_safe_path("-S", "-c", "import collections, operator; print(operator.__file__)")
    assert plain.returncode == 0, plain.stderr
    assert str(ROOT) not in plain.stdout
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
    imported = _imported_top_names(PACKAGE)
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
    offenders = []
    for source in PACKAGE.rglob("*.py"):
        text = source.read_text()
        if "tests" in _imported_top_names_of(text, source) or TESTS_IMPORT.search(text) or SYS_PATH_EDIT.search(text):
            offenders.append(str(source.relative_to(ROOT)))
    assert not offenders, f"package modules reaching into tests/ or sys.path: {sorted(offenders)}"


def test_the_import_check_sees_a_test_import() -> None:
    assert TESTS_IMPORT.search("from tests.support.kube import KubeEmulator")
    assert TESTS_IMPORT.search('CODE = "import uvicorn; from tests.support.x import y"')
    assert not TESTS_IMPORT.search("# the tests import this module")
    assert SYS_PATH_EDIT.search("sys.path.insert(0, str(ROOT))") and SYS_PATH_EDIT.search("import sys; sys.path.append('/x')")
