"""Snapshots: one file holding what every read-only command needs, read back as a host.

`save` captures the RDMA sysfs tree (each device's directory, its bus device's driver link
and netdevs, /proc/net/vlan/config), every RDMA netlink answer the read-only commands ask for
(devices, ports, statistics, optional-counter status, resources of every kind, system
settings and features), the verbs attributes `-d` shows, the names of the processes holding
RDMA objects, and the kernel release, ibtool version, host name and time. `open_host` gives a
Host whose sources answer from the file: every read-only command then prints what it printed
live at that moment.

The answers are recorded where the host asks its sources (method, arguments -> value or
error), so a replayed command takes the same path as the live one did. The file is JSON
(gzip-compressed when its name ends in .gz) with a format name and version: a file from a
newer ibtool, or a damaged one, is one clear error.
"""

from __future__ import annotations

import base64
import errno as errnos
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
from ibtool.errors import DataError, IbtoolError

FORMAT = "ibtool-snapshot"
VERSION = 1
NOT_LIVE = "a snapshot is a record of a host, not its running kernel"
OPEN = "__open__"  # the key of an error the source's opening raised
_SKIP_DIRS = {"power"}  # runtime PM attributes: not RDMA state, and reading them wakes devices


class SnapshotError(DataError):
    """A snapshot that cannot be read, or that lacks an answer a command needs."""


# -- values as JSON ------------------------------------------------------------------------------


def _enc(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, tuple):
        return {"$tuple": [_enc(v) for v in value]}
    if isinstance(value, list):
        return [_enc(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _enc(v) for k, v in value.items()}
    return value


def _dec(value: Any) -> Any:
    if isinstance(value, list):
        return [_dec(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and "$bytes" in value:
            return bytes.fromhex(value["$bytes"])
        if len(value) == 1 and "$tuple" in value:
            return tuple(_dec(v) for v in value["$tuple"])
        return {k: _dec(v) for k, v in value.items()}
    return value


def _key(name: str, args: tuple, kwargs: dict) -> str:
    return json.dumps([name, _enc(list(args)), _enc(kwargs)], sort_keys=True)


def _error_record(e: IbtoolError) -> dict[str, Any]:
    return {"class": type(e).__name__, "message": e.message, "hint": e.hint, "errno": e.errno}


def _error(record: dict[str, Any]) -> IbtoolError:
    cls = getattr(errors, record.get("class", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, IbtoolError)):
        cls = IbtoolError
    return cls(record["message"], record.get("hint"), errno=record.get("errno"))


# -- recording and replaying a source ----------------------------------------------------------


class Recorder:
    """A source (netlink client, verbs) whose every answer is written down as it is given."""

    def __init__(self, target: Any, calls: dict[str, Any]):
        self._target = target
        self._calls = calls

    def __getattr__(self, name: str):
        attr = getattr(self._target, name)
        if not callable(attr) or name == "close":
            return attr

        def call(*args, **kwargs):
            key = _key(name, args, kwargs)
            try:
                value = attr(*args, **kwargs)
            except IbtoolError as e:
                self._calls[key] = {"error": _error_record(e)}
                raise
            self._calls[key] = {"value": _enc(value)}
            return value

        return call


def recording(open_source: Callable[[], Any], calls: dict[str, Any]) -> Callable[[], Any]:
    """`open_source`, with the source's answers (or the error opening it) recorded."""

    def open_recorded():
        try:
            return Recorder(open_source(), calls)
        except IbtoolError as e:
            calls[OPEN] = {"error": _error_record(e)}
            raise

    return open_recorded


class Replay:
    """A source answering from recorded calls; a call nothing recorded is a SnapshotError."""

    recorded_features = None  # the netlink features the saving host had, as records

    def __init__(self, calls: dict[str, Any], what: str, path: str):
        self._calls = calls
        self._what = what
        self._path = path

    def close(self) -> None:
        pass

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args, **kwargs):
            found = self._calls.get(_key(name, args, kwargs))
            if found is None and name == "resource_dump" and len(args) > 2 and args[2]:
                return self._on_port(*args, **kwargs)
            if found is None:
                said = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
                raise SnapshotError(
                    f"snapshot {self._path} holds no {self._what} answer to {name}({said})",
                    "it was saved by another ibtool version, or the host changed while it was "
                    "saved: save it again",
                )
            if "error" in found:
                raise _error(found["error"])
            return _dec(found["value"])

        return call

    def _on_port(self, kind: str, index: int, port: int, **kwargs):
        """A dump asked for on one port: the kernel leaves out the objects of other ports and
        those bound to none (nldev.c res_get_common_dumpit); so does the recorded device dump."""
        replies = self.resource_dump(kind, index, None, **kwargs)
        return [r for r in replies if r.get("RDMA_NLDEV_ATTR_PORT_INDEX") == port]


def replaying(calls: dict[str, Any], what: str, path: str, extra: dict[str, Any] | None = None):
    def open_replay():
        if OPEN in calls:
            raise _error(calls[OPEN]["error"])
        replay = Replay(calls, what, path)
        for name, value in (extra or {}).items():
            setattr(replay, name, value)
        return replay

    return open_replay


# -- the sysfs tree ---------------------------------------------------------------------------


def _entry(path: str, root: str) -> dict[str, Any] | None:
    rel = os.path.relpath(path, root)
    if os.path.islink(path):
        return {"path": rel, "link": os.readlink(path)}
    if os.path.isdir(path):
        return {"path": rel, "dir": True}
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return {"path": rel, "unreadable": e.errno or errnos.EIO}
    try:
        return {"path": rel, "text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"path": rel, "bytes": base64.b64encode(data).decode()}


def _walk(top: str, root: str, out: list[dict[str, Any]]) -> None:
    """Every entry under `top`, links as links (not followed)."""
    for dirpath, dirnames, filenames in os.walk(top):
        out.append({"path": os.path.relpath(dirpath, root), "dir": True})
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and d not in links)
        for name in sorted(filenames + links):
            if name != "uevent":
                entry = _entry(os.path.join(dirpath, name), root)
                if entry is not None:
                    out.append(entry)


def capture_tree(root: str = "/") -> list[dict[str, Any]]:
    """What the sysfs source reads of the RDMA devices, as entries relative to `root`."""
    out: list[dict[str, Any]] = []
    class_dir = os.path.join(root, "sys", "class", "infiniband")
    try:
        names = sorted(os.listdir(class_dir))
    except OSError:
        names = []
    out.append({"path": os.path.relpath(class_dir, root), "dir": True})
    for name in names:
        link = os.path.join(class_dir, name)
        entry = _entry(link, root)
        out.append(entry)
        if "link" not in entry:
            continue
        device = os.path.realpath(link)
        _walk(device, root, out)
        bus = os.path.join(device, "device")
        if os.path.isdir(bus):  # a hardware device: its driver link and netdevs
            real = os.path.realpath(bus)
            out.append({"path": os.path.relpath(real, root), "dir": True})
            driver = _entry(os.path.join(real, "driver"), root)
            if driver is not None and "link" in driver:
                out.append(driver)
            net = os.path.join(real, "net")
            if os.path.isdir(net):
                for netdev in sorted(os.listdir(net)):
                    out.append(
                        {"path": os.path.relpath(os.path.join(net, netdev), root), "dir": True}
                    )
                    port = _entry(os.path.join(net, netdev, "dev_port"), root)
                    if port is not None and "dir" not in port:
                        out.append(port)
    vlan = os.path.join(root, "proc", "net", "vlan", "config")
    if os.path.exists(vlan):
        out.append(_entry(vlan, root))
    return out


def build_tree(entries: list[dict[str, Any]], dest: str) -> None:
    """The captured entries as a directory tree under `dest`; a file the kernel would not let
    be read is an empty directory (reading it fails, as it did)."""
    inside = os.path.join(dest, "")
    made = {dest}

    def directory(path: str) -> None:
        if path not in made:
            os.makedirs(path, exist_ok=True)
            made.add(path)

    for e in entries:
        path = os.path.normpath(os.path.join(dest, e["path"]))
        if not path.startswith(inside) and path != dest:
            raise SnapshotError(f"snapshot entry outside its tree: {e['path']!r}")
        if e.get("dir") or "unreadable" in e:
            directory(path)
            continue
        directory(os.path.dirname(path))
        if "link" in e:
            if not os.path.lexists(path):
                os.symlink(e["link"], path)
            continue
        data = e["text"].encode("utf-8") if "text" in e else base64.b64decode(e["bytes"])
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


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
    from ibtool.session import LISTED

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
    attempts = [session.system, session.poll_ports, lambda: _resources(host, comms, LISTED)]
    attempts += [lambda n=n: _optional(session, n) for n in names]
    for attempt in attempts:
        try:
            attempt()
        except IbtoolError:
            pass  # recorded: the replay raises it where the command asks


def _resources(host, comms: dict[str, str | None], kinds) -> None:
    session = host.netlink_session
    devices = session.devices()
    session.summaries(devices)
    for kind in kinds:
        for details in (False, True):
            try:
                objects = session.resources(
                    kind, devices, None, details, kernel_before_5_8=host.kernel_before(5, 8)
                )
            except IbtoolError:
                continue
            for o in objects:
                if o.owner.pid is not None and str(o.owner.pid) not in comms:
                    comms[str(o.owner.pid)] = host.comm(o.owner.pid)


def _optional(session, name: str) -> None:
    indexes = session.indexes()
    for reply in session.client.ports(indexes[name]) if name in indexes else ():
        port = reply.get("RDMA_NLDEV_ATTR_PORT_INDEX")
        try:
            session.counter_status(indexes, name, port)
        except IbtoolError:
            pass


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
        except (OSError, KeyError, TypeError, ValueError) as e:
            self.close()
            if isinstance(e, SnapshotError):
                raise
            raise SnapshotError(
                f"{path} is damaged: its sysfs tree cannot be built ({e})"
            ) from None
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
