"""The argparse value types the subcommands share (slaq.arguments)."""

from __future__ import annotations

import argparse

import pytest

from slaq.arguments import count, integer_at_least, positive_int, positive_number, positive_numbers, seconds


@pytest.mark.parametrize(("parse", "text", "value"), [
    (positive_int, "1", 1), (count, "0", 0), (integer_at_least(5), "5", 5),
    (positive_number, "0.5", 0.5), (positive_numbers, "0.5, 1,2", [0.5, 1.0, 2.0]),
    (seconds, "0", 0.0), (seconds, "1.5", 1.5), (seconds, "1m30s", 90.0), (seconds, "500ms", 0.5),
])
def test_good_values_parse(parse, text: str, value) -> None:
    assert parse(text) == value


@pytest.mark.parametrize(("parse", "text", "reason"), [
    (positive_int, "0", "must be >= 1, got 0"), (positive_int, "1.5", "not an integer: '1.5'"),
    (count, "-1", "must be >= 0, got -1"),
    (positive_number, "0", "must be > 0, got '0'"), (positive_number, "nan", "must be > 0, got 'nan'"),
    (positive_number, "x", "not a number: 'x'"),
    (positive_numbers, "1,-2", "must be > 0, got '-2'"), (positive_numbers, " , ", "expected comma-separated numbers > 0"),
    (seconds, "-1", "must be >= 0 seconds, got '-1'"), (seconds, "soon", "not a duration: 'soon'"),
])
def test_bad_values_are_refused_naming_the_value(parse, text: str, reason: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=reason.replace("(", r"\(").replace(".", r"\.")):
        parse(text)
