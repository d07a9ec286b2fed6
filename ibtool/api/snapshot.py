"""Snapshots: save one of this host, load one (bounded: see ibtool-snapshot(8)), its summary,
a Host replaying it (SnapshotHost) and the comparison of two (compare)."""

from __future__ import annotations

from ibtool.snapshot.diff import compare
from ibtool.snapshot.save import SnapshotHost, load, save, summary

__all__ = ["SnapshotHost", "compare", "load", "save", "summary"]
