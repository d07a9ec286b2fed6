"""How much of a snapshot ibtool reads: a snapshot comes from another host, so its size, its
entries and its paths are bounded before anything is built from it. The defaults are far above
the largest host measured (an mlx5 PF with 500 RoCE VFs: 116 KB compressed, 3.4 MB of JSON,
28,348 sysfs entries, paths of 115 bytes and 12 levels); `--snapshot-limit NAME=VALUE` raises
one."""

from __future__ import annotations

import dataclasses

from ibtool.argtypes import parse_size
from ibtool.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Limits:
    size: int = 32 << 20  # bytes of the file as stored (compressed or not)
    expanded: int = 64 << 20  # bytes of JSON once decompressed
    entries: int = 1_000_000  # JSON objects: each sysfs entry, recorded answer and record is one
    path: int = 4096  # bytes of an entry's path or link target (PATH_MAX, linux/limits.h)
    depth: int = 32  # directory levels of an entry's path


DEFAULT = Limits()
NAMES = tuple(f.name for f in dataclasses.fields(Limits))
_BYTES = {"size", "expanded", "path"}

EXPLAIN = {
    "size": "bytes of the file",
    "expanded": "bytes once decompressed",
    "entries": "JSON objects",
    "path": "bytes of a path or link target",
    "depth": "directory levels of a path",
}


def shown(name: str, value: int) -> str:
    """A limit as the error and the man page say it: 64 MiB, 1,000,000 JSON objects."""
    if name in _BYTES and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{value >> 20} MiB"
    unit = "bytes" if name in _BYTES else EXPLAIN[name]
    return f"{value:,} {unit}"


def hint(name: str) -> str:
    return f"if the file is trusted, --snapshot-limit {name}=N raises the limit"


def parse(settings: list[str] | None) -> Limits:
    """`NAME=VALUE` settings (VALUE an integer, sizes with K, M or G) over the defaults."""
    values = {}
    for setting in settings or []:
        name, sep, text = setting.partition("=")
        name = name.strip().lower()
        try:
            value = parse_size(text)
        except ValueError:
            value = None
        if not sep or name not in NAMES or value is None:
            raise UsageError(
                f"--snapshot-limit {setting!r}: give NAME=VALUE",
                f"NAME is one of {', '.join(NAMES)}; a size may end in K, M or G",
            )
        if value < 1:
            raise UsageError(f"--snapshot-limit {setting!r}: the limit must be 1 or more")
        values[name] = value
    return dataclasses.replace(DEFAULT, **values)
