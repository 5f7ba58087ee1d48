"""The layout: one namespace package, `slaq`, spread over the component distributions at the root
(core, operator, sidecar, engine, kernels, tools), each with its code under `<component>/src/slaq/`.
Every module has one name (`slaq.…`); nothing at the root imports as a component, `operator` stays the
standard library's and transformers' probe for Hugging Face's `kernels` package stays false; an editor
resolves every module by path from the src folders; each component declares what it imports."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.layout import COMPONENTS, REPO_ROOT, module_name, package_dirs, pyproject, python_sources, source_roots

ROOT = REPO_ROOT
# The only Python packages at the repository root: the tests, never installed.
ROOT_PACKAGES = {"tests", "e2e"}
# Names a module of the package could be imported by if a folder at the root were a package: the
# component folders themselves, and what their code was once importable as.
FORMER_NAMES = ("sidecar.errors", "engine.scheduler", "kernels.kv_blocks", "bench.simulator", "api.pool", "policy.ranking",
                "local.up", "testing.fake_engine", "src.slaq", "slaq.__init__", "core.cli", "tools.bench", "operator.reconciler")


def test_each_component_is_a_distribution_in_its_folder() -> None:
    for component in COMPONENTS:
        folder = ROOT / component
        assert (folder / "README.md").is_file(), f"{component}/ has no README.md"
        project = pyproject(component)
        assert project["project"]["name"] == f"slaq-{component}"
        found = project["tool"]["setuptools"]["packages"]["find"]
        assert found == {"where": ["src"], "namespaces": True}, f"{component}/pyproject.toml: packages are not found under src/ as a namespace"
        assert (folder / "src" / "slaq").is_dir() and not (folder / "src" / "slaq" / "__init__.py").exists(), \
            f"{component}/src/slaq/ is not a namespace portion (no __init__.py)"


def test_no_slaq_init_anywhere_and_every_folder_of_modules_is_a_package() -> None:
    inits = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("*/src/slaq/__init__.py"))
    assert not inits, f"slaq is a namespace package across the components: {inits}"
    loose = sorted(str(folder.relative_to(ROOT)) for folder in {p.parent for p in python_sources()}
                   if folder.name != "slaq" and not (folder / "__init__.py").is_file())
    assert not loose, f"folders of modules without an __init__.py below src/slaq/: {loose}"


def test_the_root_distribution_installs_every_component() -> None:
    root = pyproject_root = __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())
    named = {re.split(r"[ @\[]", requirement, maxsplit=1)[0] for requirement in pyproject_root["project"]["dependencies"]}
    assert named == {f"slaq-{component}" for component in COMPONENTS}, named
    assert all("{root:uri}/" in requirement for requirement in root["project"]["dependencies"])


def test_nothing_at_the_root_imports_but_the_tests() -> None:
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
        found = _found_from(cwd, *FORMER_NAMES, *COMPONENTS, "slaq.sidecar")
        assert Path(found.pop("slaq.sidecar")) == ROOT / "sidecar" / "src" / "slaq" / "sidecar" / "__init__.py"  # the probe sees the package
        assert found.pop("operator") not in (None,) and str(ROOT) not in str(_found_from(cwd, "operator")["operator"])
        second = {name: origin for name, origin in found.items() if origin is not None and Path(origin).resolve().is_relative_to(ROOT)}
        assert not second, f"from {cwd.relative_to(ROOT) if cwd != ROOT else 'the root'}, importable under a second name: {second}"


def test_transformers_finds_no_kernels_package_from_the_root() -> None:
    # transformers loads Hugging Face's `kernels` when it thinks it is installed; the kernels/ folder
    # (a namespace portion from the root) must not look like it.
    code = "from transformers.utils.import_utils import is_kernels_available as k; print(k())"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_no_module_of_this_run_was_loaded_under_a_second_name() -> None:
    importlib.import_module("slaq.cli")
    seconds = {}
    roots = source_roots()
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and any(Path(origin).resolve().is_relative_to(root) for root in roots) and module_name(Path(origin)) != name:
            seconds[name] = origin
    assert not seconds, f"modules of the components loaded under another name: {seconds}"


def resolve_by_path(name: str, search_path: list[str]) -> Path | None:
    """The file `name` resolves to by looking only at folders, package by package, as an editor or a
    type checker does: no import hooks, nothing imported. A namespace package's portions are all searched."""
    path: list[str] | None = search_path
    spec = None
    for index in range(len(parts := name.split("."))):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:index + 1]), path)
        if spec is None:
            return None
        path = list(spec.submodule_search_locations or [])
    return Path(spec.origin) if spec is not None and spec.origin is not None else None


def test_every_module_resolves_by_its_path_to_the_file_python_imports() -> None:
    roots = [str(root) for root in source_roots()]
    unresolved = {}
    for source in python_sources():
        name = module_name(source)
        if resolve_by_path(name, roots) != source.resolve():
            unresolved[name] = str(resolve_by_path(name, roots))
    assert not unresolved, f"modules that do not resolve by path from the src folders: {unresolved}"
    # The development install puts exactly those folders on sys.path (no import hook), so Python, from
    # anywhere, loads the same files.
    for name in ("slaq.cli", "slaq.sidecar", "slaq.operator", "slaq.kernels", "slaq.bench", "slaq.engine"):
        origin = _found_from(Path("/"), name)[name]
        assert origin is not None and any(Path(origin).resolve().is_relative_to(Path(r)) for r in roots), f"{name} imports from {origin}"


def test_resolution_by_path_sees_a_package_only_an_import_hook_provides(tmp_path: Path) -> None:
    # A mapped layout (setuptools' package-dir): slaq/ at the root, its sidecar in a folder beside it.
    (tmp_path / "slaq").mkdir()
    (tmp_path / "slaq" / "__init__.py").write_text("")
    (tmp_path / "sidecar").mkdir()
    (tmp_path / "sidecar" / "__init__.py").write_text("")
    (tmp_path / "sidecar" / "errors.py").write_text("")
    assert resolve_by_path("slaq", [str(tmp_path)]) == tmp_path / "slaq" / "__init__.py"
    assert resolve_by_path("slaq.sidecar.errors", [str(tmp_path)]) is None
    assert resolve_by_path("sidecar.errors", [str(tmp_path)]) == tmp_path / "sidecar" / "errors.py"  # the second name


def _imported_modules_of(text: str, source: Path) -> set[str]:
    """The absolute module names a module imports (`import a.b`, `from a.b import c`: `a.b`)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(text, str(source))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
    return modules


def _imported_top_names_of(text: str, source: Path) -> set[str]:
    return {module.split(".")[0] for module in _imported_modules_of(text, source)}


def _imported_components_of(text: str, source: Path) -> set[str]:
    """The slaq packages a module imports (`slaq.sidecar`, `slaq.api`, `slaq.cli`, …)."""
    return {".".join(m.split(".")[:2]) for m in _imported_modules_of(text, source) if m.startswith("slaq.")}


def _component_of(package: str) -> str:
    """The component whose src/ holds `slaq.X` (a package or a top-level module)."""
    for component in COMPONENTS:
        base = ROOT / component / "src" / Path(*package.split("."))
        if base.is_dir() or base.with_suffix(".py").is_file():
            return component
    raise AssertionError(f"{package} is in no component")


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; @]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared(component: str) -> tuple[set[str], set[str]]:
    """(what it always installs, what any of its extras installs), as distribution names."""
    project = pyproject(component)["project"]
    always = {_requirement_name(r) for r in project.get("dependencies", [])}
    extras = {_requirement_name(r) for extra in project.get("optional-dependencies", {}).values() for r in extra}
    return always, extras


# Imported under a name its distribution does not have, or only through another distribution's module.
IMPORTED_AS = {"lightkube-models": "lightkube"}
# What a component installs without importing it itself: the engine's pinned vLLM build brings these.
INSTALLED_FOR_OTHERS = {"torch": {"engine", "kernels"}}


def test_each_component_declares_what_it_imports_and_imports_what_it_declares() -> None:
    mapping = importlib.metadata.packages_distributions()
    problems = []
    for component in COMPONENTS:
        sources = sorted((ROOT / component / "src").rglob("*.py"))
        texts = {source: source.read_text() for source in sources}
        imported = set().union(*(_imported_top_names_of(text, source) for source, text in texts.items()))
        third_party = imported - set(sys.stdlib_module_names) - {"slaq", "__future__"}
        always, extras = _declared(component)
        provided: set[str] = set()
        for name in sorted(third_party):
            distributions = {d.lower().replace("_", "-") for d in mapping.get(name, [])}
            assert distributions, f"{name} is imported by {component} but no installed distribution provides it"
            provided |= distributions
            if not distributions & (always | extras):
                problems.append(f"{component} imports {name} ({sorted(distributions)}), declared nowhere in {component}/pyproject.toml")
        components = {_component_of(p) for text_source in texts.items() for p in _imported_components_of(text_source[1], text_source[0])} - {component}
        for other in sorted(components):
            if f"slaq-{other}" not in always:
                problems.append(f"{component} imports slaq-{other}'s code without depending on it")
        for requirement in sorted(always):
            if requirement.startswith("slaq-"):
                if requirement.removeprefix("slaq-") not in components:
                    problems.append(f"{component} depends on {requirement} and imports none of it")
            elif requirement not in provided and IMPORTED_AS.get(requirement) not in imported:
                problems.append(f"{component} depends on {requirement} and imports none of it")
    assert not problems, "\n".join(problems)


# Which components may import which: the operator, the sidecar and the engine never import each other,
# and the core imports none of them (docs/decisions/0021-components-in-their-folders.md).
MAY_IMPORT = {
    "core": set(),
    "kernels": set(),
    "operator": {"core"},
    "sidecar": {"core"},
    "engine": {"core", "kernels"},
    "tools": {"core", "operator", "sidecar", "engine", "kernels"},
}


def test_components_import_only_what_the_layers_allow() -> None:
    offenders = {}
    for component in COMPONENTS:
        for source in sorted((ROOT / component / "src").rglob("*.py")):
            used = {_component_of(p) for p in _imported_components_of(source.read_text(), source)} - {component}
            if used - MAY_IMPORT[component]:
                offenders[str(source.relative_to(ROOT))] = sorted(used - MAY_IMPORT[component])
    assert not offenders, f"imports across the layers: {offenders}"


def test_the_layer_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    text = "from slaq.sidecar.errors import SidecarError\nimport slaq.engine.scheduler\nfrom slaq import cli\n"
    assert _imported_components_of(text, source) == {"slaq.sidecar", "slaq.engine"}
    assert {_component_of(p) for p in _imported_components_of(text, source)} == {"sidecar", "engine"}


def test_every_command_comes_from_an_entry_point_of_the_component_that_owns_it() -> None:
    from slaq.cli import COMMANDS_GROUP, build_parser
    for component in COMPONENTS:
        for name, target in pyproject(component)["project"].get("entry-points", {}).get(COMMANDS_GROUP, {}).items():
            module, _, function = target.partition(":")
            assert _component_of(".".join(module.split(".")[:2])) == component, f"{component} registers {target}, another component's"
            assert callable(getattr(importlib.import_module(module), function))
    installed = {entry.name for entry in importlib.metadata.entry_points(group=COMMANDS_GROUP)}
    assert installed == {name for component in COMPONENTS for name in pyproject(component)["project"].get("entry-points", {}).get(COMMANDS_GROUP, {})}
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert {"crds", "validate", "engine", "sidecar", "operator", "render", "bench", "up"} <= commands


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


def _imported_top_names(folder: Path) -> set[str]:
    return set().union(*(_imported_top_names_of(source.read_text(), source) for source in folder.rglob("*.py")))


TESTS_IMPORT = re.compile(r"^\s*(?:from|import)\s+tests(?:\.|\s|$)|[;\"']\s*(?:from|import)\s+tests\.", re.MULTILINE)
SYS_PATH_EDIT = re.compile(r"\bsys\.path\.(?:insert|append|extend)\(")


def test_no_package_module_imports_the_tests() -> None:
    # An installed slaq has no tests/; the text check also catches code run as `python -c "..."`.
    offenders = []
    for source in python_sources():
        text = source.read_text()
        if "tests" in _imported_top_names_of(text, source) or TESTS_IMPORT.search(text) or SYS_PATH_EDIT.search(text):
            offenders.append(str(source.relative_to(ROOT)))
    assert not offenders, f"package modules reaching into tests/ or sys.path: {sorted(offenders)}"


def test_the_import_check_sees_a_test_import() -> None:
    assert TESTS_IMPORT.search("from tests.support.kube import KubeEmulator")
    assert TESTS_IMPORT.search('CODE = "import uvicorn; from tests.support.x import y"')
    assert not TESTS_IMPORT.search("# the tests import this module")
    assert SYS_PATH_EDIT.search("sys.path.insert(0, str(ROOT))") and SYS_PATH_EDIT.search("import sys; sys.path.append('/x')")
