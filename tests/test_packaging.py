"""Every source folder is a subpackage of `slaq`, importable under its mapped name."""

from __future__ import annotations

import importlib
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
