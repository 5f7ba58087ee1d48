"""The repository's layout as tests read it: the component distributions, each a folder at the root
with its pyproject.toml and its code under src/slaq/<package>/, one namespace package `slaq` across them."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Iterator

REPO_ROOT = Path(__file__).resolve().parents[2]
# The component folders, each one distribution (docs/decisions/0021-components-in-their-folders.md).
COMPONENTS = ("core", "operator", "sidecar", "engine", "kernels", "tools")


def source_roots() -> list[Path]:
    """Each component's src/ folder: the folders that make up the `slaq` namespace package."""
    return [REPO_ROOT / component / "src" for component in COMPONENTS]


def python_sources() -> Iterator[Path]:
    """Every module of the package, component by component."""
    for root in source_roots():
        yield from sorted(root.rglob("*.py"))


def module_name(source: Path) -> str:
    """The import name of a module file under one of the src/ folders."""
    root = next(root for root in source_roots() if source.resolve().is_relative_to(root))
    parts = source.resolve().relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_dirs() -> dict[str, Path]:
    """Every package's import name and its folder (the namespace `slaq` excluded: it has many)."""
    found = {}
    for root in source_roots():
        for init in root.rglob("__init__.py"):
            found[module_name(init)] = init.parent
    return found


def module_path(dotted: str) -> Path | None:
    """The file (module or package __init__.py) a dotted `slaq.…` name is, or None."""
    parts = dotted.split(".")
    for root in source_roots():
        candidate = root.joinpath(*parts)
        if (candidate / "__init__.py").is_file():
            return candidate / "__init__.py"
        if candidate.with_suffix(".py").is_file():
            return candidate.with_suffix(".py")
    return None


def pyproject(component: str) -> dict:
    return tomllib.loads((REPO_ROOT / component / "pyproject.toml").read_text())
