"""argparse value types the components' subcommands share: a bad flag value is refused by the parser,
naming the value and what it must be."""

from __future__ import annotations

import argparse
from typing import Callable

from slaq.api.common import duration_seconds


def integer_at_least(minimum: int) -> Callable[[str], int]:
    """An integer >= `minimum` (1: a positive count; 0: a count that may be zero)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


positive_int = integer_at_least(1)
count = integer_at_least(0)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def positive_number(text: str) -> float:
    value = _number(text)
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def positive_numbers(text: str) -> list[float]:
    """Comma-separated numbers, each > 0, at least one."""
    values = [positive_number(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers > 0, got {text!r}")
    return values


def seconds(text: str) -> float:
    """Seconds >= 0, as a number or a duration such as 30s / 1m30s (the pool's drainTimeout format)."""
    try:
        value = float(text)
    except ValueError:
        try:
            value = duration_seconds(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text!r}")
    return value
