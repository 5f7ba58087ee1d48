"""Every source folder is a subpackage of `slaq`, importable under its mapped name."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_mapped_folder_is_listed_and_importable() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages, mapping = set(config["packages"]), config["package-dir"]
    folders = {p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("*/__init__.py")}
    folders |= {p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("slaq/*/__init__.py")}
    mapped = {folder: name for name, folder in mapping.items()}
    for folder in folders:
        top, _, rest = folder.partition("/")
        name = mapped[top] + (f".{rest.replace('/', '.')}" if rest else "")
        assert name in packages, f"{folder} is not listed in pyproject's packages as {name}"
        module = importlib.import_module(name)
        assert Path(module.__file__).resolve().parent == (ROOT / folder).resolve()
