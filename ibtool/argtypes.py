"""Argument types for numbers on the command line: finite, within a documented range.

`float("nan")`, `float("inf")` and `1e308` all parse; a sleep, a deadline or a timer given one
of them waits forever, overflows or spins. Every number a flag takes goes through `number()`,
whose error names the flag's range; argparse turns it into a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

# Bytes, or with a K, M or G suffix (powers of 1024, "64M", "64MiB", "64 mb"); at most 15
# digits, so no text turns into an integer too long to convert or to use.
_SIZE = re.compile(r"\s*(\d{1,15})\s*([kmg]?)(i?b?)?\s*", re.IGNORECASE)
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes, with an optional K, M or G suffix (powers of 1024: 64M is 64 MiB)."""
    found = _SIZE.fullmatch(text)
    if not found:
        raise ValueError(f"not a size: {text!r} (bytes, or with K, M or G)")
    return int(found.group(1)) * SIZE_UNITS[found.group(2).upper()]


def _show(value: float) -> str:
    # Whole bounds in full (2147483647, not 2.14748e+09: the range is to be typed back).
    if float(value).is_integer() and abs(value) < 1e16:
        return str(int(value))
    return f"{value:g}"


def number(
    kind: type,
    low: float,
    high: float,
    *,
    unit: str = "",
    low_open: bool = False,
    hint: str | None = None,
) -> Callable[[str], int | float]:
    """An argparse `type=` for an int or float in [low, high] (or (low, high] with
    `low_open`); anything else is an ArgumentTypeError naming the range, and `hint` (what to
    give instead) after it."""
    if kind not in (int, float):
        raise TypeError("number() takes int or float")
    if low_open:
        said = f"more than {_show(low)} and at most {_show(high)}"
    else:
        said = f"{_show(low)} to {_show(high)}"
    said += f" {unit}" if unit else ""
    hinted = f" (hint: {hint})" if hint else ""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            kind_name = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(
                f"must be {kind_name} {said}, not {text!r}{hinted}"
            ) from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(
                f"must be a finite number {said}, not {text!r}{hinted}"
            )
        below = value <= low if low_open else value < low
        if below or value > high:
            raise argparse.ArgumentTypeError(f"must be {said}, not {text}{hinted}")
        return value

    parse.__name__ = f"{kind.__name__} {said}"  # argparse names the type in some errors
    return parse
