"""Snapshots: a host's sysfs and netlink answers saved to one file, and replayed as a Host
somewhere else. A snapshot is untrusted input: checked as a whole before anything is read from it.

    save    save a snapshot, and SnapshotHost: a Host that answers from one
    tree    the checked, bounded tree of a snapshot's files
    memory  that tree read as files, from memory (a replay writes nothing)
    limits  the bounds of a snapshot (size, entries, depth, path) and --snapshot-limit
    replay  the recorded calls of the sources, and their replay
    diff    the events between two snapshots

May import ibtool.host, ibtool.sources (a snapshot is a Host of its own: it saves and replays
what the sources read), ibtool.model, ibtool.errors and ibtool.argtypes; never ibtool.plugin,
ibtool.health, ibtool.live, ibtool.tui or ibtool.api.
"""

from __future__ import annotations

from collections.abc import Callable

# What save.py hands the CLI when it is first imported: what an answer it replayed that a
# command could not use means (the file's damage, exit 7). A run that read no snapshot never
# imports save.py, and this stays empty.
CLASSIFIERS: list[Callable[[Exception], Exception | None]] = []


def replayed_damage(e: Exception) -> Exception | None:
    """`e`, raised by a command on an answer a replayed snapshot gave, as the error it is (a
    SnapshotError, exit 7); None when no snapshot was replayed, or `e` is not such."""
    for classify in CLASSIFIERS:
        damaged = classify(e)
        if damaged is not None:
            return damaged
    return None
