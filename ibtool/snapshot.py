"""Snapshots: one file holding what every read-only command needs, read back as a host.

`save` captures the RDMA sysfs tree (each device's directory, its bus device's driver link
and netdevs, /proc/net/vlan/config), every RDMA netlink answer the read-only commands ask for
(devices, ports, statistics, optional-counter status, resources of every kind, system
settings and features), the verbs attributes `-d` shows, the names of the processes holding
RDMA objects, and the kernel release, ibtool version, host name and time. `SnapshotHost`
gives a Host whose sources answer from the file: every read-only command then prints what it printed
live at that moment.

The answers are recorded where the host asks its sources (ibtool.replay: method, arguments ->
value or error), so a replayed command takes the same path as the live one did; the tree is
ibtool.snaptree's. The file is JSON
(gzip-compressed when its name ends in .gz) with a format name and version: a file from a
newer ibtool, or a damaged one, is one clear error.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ibtool import errors
from ibtool.errors import IbtoolError
from ibtool.replay import SnapshotError, recording, replaying
from ibtool.snaptree import build_tree, capture_tree

FORMAT = "ibtool-snapshot"
VERSION = 1
NOT_LIVE = "a snapshot is a record of a host, not its running kernel"


# -- saving -------------------------------------------------------------------------------------


def save(
    path: str,
    warn: Callable[[str], None],
    version: str,
    *,
    root: str = "/",
    open_netlink: Callable[[], Any] | None = None,
    open_verbs: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Capture the host into `path` and return what was saved. `root`, `open_netlink` and
    `open_verbs` are the running host's unless given (tests give a tree and a fake kernel)."""
    from ibtool import host as hosts
    from ibtool.session import open_nldev
    from ibtool.sources.sysfs import SysfsSource

    netlink: dict[str, Any] = {}
    verbs: dict[str, Any] = {}
    host = hosts.Host(
        warn=warn,
        details=True,
        sysfs=SysfsSource(root, warn),
        netlink=recording(open_netlink or open_nldev, netlink),
        verbs=recording(open_verbs or hosts.open_verbs, verbs),
    )
    data: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "ibtool": version,
        "host": socket.gethostname(),
        "time": time.time(),
        "kernel": host.kernel_release(),
    }
    data["sysfs"] = capture_tree(root)
    comms: dict[str, str | None] = {}
    features = None
    try:
        _ask_everything(host, comms)
        features = _features(host)
    finally:
        host.close()
    data.update(netlink=netlink, verbs=verbs, comm=comms, features=features)
    _write(path, data)
    return data


def _ask_everything(host, comms: dict[str, str | None]) -> None:
    """Every read the read-only commands make, so that their answers are recorded."""
    try:
        names = [name for name, _ in host.select(None)]
    except IbtoolError:
        names = []
    if names:
        host.devices()
        host.ports()
        host.gids()
        host.counters()
        for name in names:
            host.device_caps(name)
    session = host.netlink_session
    for attempt in (session.system, session.poll_ports, lambda: _resources(host, comms)):
        try:
            attempt()
        except IbtoolError:
            pass  # recorded: the replay raises it where the command asks
    try:
        indexes = session.indexes()
    except IbtoolError:
        return
    for name in names:  # `counters optional` asks for the ports sysfs lists
        for port in host.sysfs.port_numbers(name):
            try:
                session.counter_status(indexes, name, port)
            except IbtoolError:
                pass


def _resources(host, comms: dict[str, str | None]) -> None:
    session = host.netlink_session
    devices = session.devices()
    session.summaries(devices)
    for details in (False, True):
        for _, o in session.every_resource(devices, details):
            if o.owner.pid is not None and str(o.owner.pid) not in comms:
                comms[str(o.owner.pid)] = host.comm(o.owner.pid)


def _features(host) -> list[dict[str, Any]] | None:
    import dataclasses

    try:
        _, features = host.netlink_session.system_features()
    except IbtoolError:
        return None
    return [dataclasses.asdict(f) for f in features]


def _write(path: str, data: dict[str, Any]) -> None:
    # Key order is kept: a replayed dict (verbs capabilities, driver attributes) is printed in
    # the order the source gave it.
    text = json.dumps(data, separators=(",", ":"))
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(tmp, "wt", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise IbtoolError(f"cannot write {path}: {e.strerror or e}", errno=e.errno) from e


# -- reading ------------------------------------------------------------------------------------


def load(path: str) -> dict[str, Any]:
    """A snapshot file's content, checked: one SnapshotError for what cannot be used."""
    hint = "give a file written by `ibtool snapshot save`"
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise errors.NotFoundError(f"no snapshot {path}", hint) from None
    except OSError as e:
        raise IbtoolError(f"cannot read {path}: {e.strerror or e}", errno=e.errno) from e
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, ValueError) as e:
        raise SnapshotError(f"{path} is not an ibtool snapshot (damaged: {e})", hint) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SnapshotError(f"{path} is not an ibtool snapshot", hint)
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise SnapshotError(
            f"{path} is a snapshot of format {version}; this ibtool reads format {VERSION} "
            "and older",
            f"read it with the ibtool that saved it ({data.get('ibtool', 'unknown')}) or newer",
        )
    for field, kind in (("sysfs", list), ("netlink", dict), ("verbs", dict), ("comm", dict)):
        if not isinstance(data.get(field), kind):
            raise SnapshotError(f"{path} is damaged: its {field!r} is missing or malformed", hint)
    return data


def _scratch() -> str | None:
    """Where to build a snapshot's tree: memory (/dev/shm) unless TMPDIR says otherwise. The
    tree of 500 SR-IOV functions is ~27,000 files: 0.4 s on tmpfs, 8 s on a loaded ext4."""
    if os.environ.get("TMPDIR") is None and os.access("/dev/shm", os.W_OK | os.X_OK):
        return "/dev/shm"
    return None


class SnapshotHost:
    """A snapshot read back: its tree built in a temporary directory, its Host."""

    def __init__(self, path: str, warn: Callable[[str], None], details: bool):
        from ibtool.host import Host
        from ibtool.model import NetlinkFeature
        from ibtool.sources.sysfs import SysfsSource

        self.data = load(path)
        self.path = path
        self.tmp = tempfile.mkdtemp(prefix="ibtool-snapshot-", dir=_scratch())
        try:
            build_tree(self.data["sysfs"], self.tmp)
        except SnapshotError:
            self.close()
            raise
        except (OSError, KeyError, TypeError, ValueError) as e:
            self.close()
            why = f"its sysfs tree cannot be built ({e})"
            raise SnapshotError(f"{path} is damaged: {why}") from None
        features = self.data.get("features")
        extra = {}
        if isinstance(features, list):
            extra["recorded_features"] = [NetlinkFeature(**f) for f in features]
        comms = self.data["comm"]
        self.host = Host(
            root=self.tmp,
            warn=warn,
            details=details,
            sysfs=SysfsSource(self.tmp, warn),
            netlink=replaying(self.data["netlink"], "RDMA netlink", path, extra),
            verbs=replaying(self.data["verbs"], "verbs", path),
            release=str(self.data.get("kernel", "")),
            live=False,
            not_live=NOT_LIVE,
            comm=lambda pid: comms.get(str(pid)),
        )

    def close(self) -> None:
        host = getattr(self, "host", None)
        if host is not None:
            host.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
