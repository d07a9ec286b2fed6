"""The health command's own files read with care: health.toml and the state file are named on
the command line or by cron, and what is at that path may be anything.

A FIFO there would make a plain open() wait for a writer forever, /dev/zero would be read until
memory runs out: each file is opened without blocking (O_NONBLOCK: open(2) on a FIFO returns at
once), fstat'ed, read only when it is a regular file, and up to a bound. The snapshot reader
(ibtool.snapshot.save) does the same with its own limits.
"""

from __future__ import annotations

import os
import stat

# health.toml is written by a person or a configuration manager: the example of
# ibtool-health(8) is 1 KB, and a [ports."DEV/PORT"] table for each of 4,000 ports (30 bytes
# each) with a threshold for every counter ibtool knows is under 200 KB. 1 MiB is five times that.
CONFIG_MAX = 1 << 20
# The state file grows with the ports: each port's counter baselines, by name. A port is about
# 1 KB of it on the fixture mlx5 (27 counters) and 5.5 KB on an mlx5 port of a recent kernel
# (about 100 counters, up to 55 bytes each with the name and a 64-bit value): 64 MiB holds
# 12,000 such ports, and is read in well under a second.
STATE_MAX = 64 << 20
_CHUNK = 1 << 16
# /dev/null is character device 1:3 (the kernel's Documentation/admin-guide/devices.txt):
# `--config /dev/null` is the usual way to say "no configuration", and reads as empty.
_NULL = os.makedev(1, 3)


class NotAFile(Exception):
    """What is at the path cannot be used as the file: `what` says why, e.g. "not a regular
    file" or "larger than 1 MiB"."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def kind(mode: int) -> str | None:
    """None for a regular file; else what it is, in words."""
    if stat.S_ISREG(mode):
        return None
    return "a directory" if stat.S_ISDIR(mode) else "not a regular file"


def size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


def read(path: str, limit: int, *, null: bool = False) -> bytes:
    """The content of the regular file at `path` (links followed), at most `limit` bytes; with
    `null`, /dev/null too, as empty. Raises NotAFile, or the OSError of the open or read
    (FileNotFoundError for a missing file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if null and stat.S_ISCHR(st.st_mode) and st.st_rdev == _NULL:
            return b""
        what = kind(st.st_mode)
        if what is not None:
            raise NotAFile(what)
        if st.st_size > limit:
            raise NotAFile(f"larger than {size(limit)}")
        chunks, total = [], 0
        while True:  # the size may have changed since fstat: the bound holds on what is read
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > limit:
                raise NotAFile(f"larger than {size(limit)}")
            chunks.append(chunk)
    finally:
        os.close(fd)
