"""The tightest TTFT class the engine served lately (engine/src/slaq/engine/ttft_class.py)."""

from __future__ import annotations

import pytest

from slaq.engine.ttft_class import MAX_CLASSES, PROMPT_WEIGHT, TightestTtft


def test_the_tightest_objective_seen_within_the_window_with_its_mean_prompt() -> None:
    classes = TightestTtft(window_s=60.0)
    assert classes.tightest(0.0) is None
    classes.arrived(None, 9_000, 0.0)  # no objective: no class
    classes.arrived(2.0, 500, 0.0)
    assert classes.tightest(1.0) == (2.0, 500)
    classes.arrived(0.5, 4_000, 10.0)
    classes.arrived(0.5, 2_000, 20.0)
    assert classes.tightest(21.0) == (0.5, round(4_000 + PROMPT_WEIGHT * (2_000 - 4_000)))
    classes.arrived(2.0, 500, 70.0)
    assert classes.tightest(75.0) == (0.5, 3_800)  # seen 55 s ago: still bounds the steps
    assert classes.tightest(81.0) == (2.0, 500)  # not seen for the window: the next tightest
    assert classes.tightest(131.0) is None


def test_many_objectives_keep_the_tight_ones() -> None:
    classes = TightestTtft(window_s=60.0)
    for i in range(MAX_CLASSES):
        classes.arrived(1.0 + i, 100, 0.0)
    classes.arrived(0.25, 100, 1.0)  # one too many: the loosest goes, not the new tight one
    assert classes.tightest(2.0) == (0.25, 100)
    assert len(classes._classes) == MAX_CLASSES and float(MAX_CLASSES) not in classes._classes
    with pytest.raises(ValueError, match="window_s"):
        TightestTtft(window_s=0.0)
