"""No module in a folder whose files run as scripts shadows a standard-library module.

`python tools/src/slaq/bench/sched_overhead.py` puts tools/src/slaq/bench/ first on sys.path, so a tools/src/slaq/bench/profile.py would
replace the standard library's `profile` for everything imported after it.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_script_folders_do_not_shadow_the_standard_library() -> None:
    for folder in ("tools/src/slaq/bench", "scripts"):
        assert any((ROOT / folder).glob("*.py")), f"{folder}/ holds no scripts: the check would pass on nothing"
        clashes = sorted(p.name for p in (ROOT / folder).glob("*.py") if p.stem in sys.stdlib_module_names)
        assert not clashes, f"{folder}/ has modules named like the standard library's: {clashes}"
