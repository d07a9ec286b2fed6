"""Text lines, tables and JSON from records plus field metadata; no colour, no TUI imports.

A command declares its fields once (JSON key, text label, how to get and show the value);
every output form is derived from that list, so text and JSON cannot drift apart. A value's
control and format characters are escaped in text (JSON escapes them itself): a name from a
capture can neither drive the terminal nor forge a line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from ibtool.model.deferred import dataclass
from ibtool.model.names import escaped

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Field:
    key: str  # JSON key, spelled as `rdma -j` spells the same fact
    get: Callable[[Any], Any]
    label: str | None = None  # text label (defaults to the key); "" prints the bare value
    text: Callable[[Any], str] = str
    header: str | None = None  # column header in tables
    details: bool = False  # only with -d
    always: bool = False  # in text, show "unknown" rather than omitting a missing value
    in_text: bool = True  # False: JSON only (e.g. numbers already inside a text field)
    description: str = ""


def selected(fields: Sequence[Field], details: bool) -> list[Field]:
    return [f for f in fields if details or not f.details]


def record_json(record: Any, fields: Sequence[Field], details: bool) -> dict[str, Any]:
    return {f.key: f.get(record) for f in selected(fields, details)}


def record_line(record: Any, fields: Sequence[Field], details: bool) -> str:
    parts = []
    for f in selected(fields, details):
        if not f.in_text:
            continue
        value = f.get(record)
        if value is None or value == () or value == []:
            if not f.always:
                continue
            shown = UNKNOWN
        else:
            shown = escaped(f.text(value))
        label = f.key if f.label is None else f.label
        parts.append(f"{label} {shown}" if label else shown)
    return " ".join(parts)


def table(records: Iterable[Any], fields: Sequence[Field], details: bool) -> list[str]:
    cols = selected(fields, details)
    rows = [
        [
            (UNKNOWN if f.always else "") if (v := f.get(r)) is None else escaped(f.text(v))
            for f in cols
        ]
        for r in records
    ]
    headers = [f.header or f.key.upper() for f in cols]
    widths = [
        max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
        for i, h in enumerate(headers)
    ]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [headers, *rows]]


def dump_json(data: Any, out: TextIO, pretty: bool) -> None:
    # dumps, not dump: one C-encoded string instead of thousands of small writes
    out.write(json.dumps(data, indent=2 if pretty else None) + "\n")


def decode_flags(value: int, names: dict[int, str]) -> list[str]:
    """Bit positions set in value, by name; unknown bits as bitN."""
    return [names.get(bit, f"bit{bit}") for bit in range(64) if value >> bit & 1]
