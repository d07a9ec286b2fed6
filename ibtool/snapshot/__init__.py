"""Snapshots: a host's sysfs and netlink answers saved to one file, and replayed as a Host
somewhere else. A snapshot is untrusted input: checked as a whole before anything is written.

    save    save a snapshot, and SnapshotHost: a Host that answers from one
    tree    the checked, bounded tree a snapshot's files are rebuilt into
    limits  the bounds of a snapshot (size, entries, depth, path) and --snapshot-limit
    replay  the recorded calls of the sources, and their replay
    diff    the events between two snapshots

May import ibtool.host, ibtool.sources (a snapshot is a Host of its own: it saves and replays
what the sources read), ibtool.model, ibtool.errors and ibtool.argtypes; never ibtool.plugin,
ibtool.health, ibtool.live, ibtool.tui or ibtool.api.
"""
