"""Snapshots: one file holding what every read-only command needs, read back as a host.

`save` captures the RDMA sysfs tree (each device's directory, its bus device's driver link
and netdevs, /proc/net/vlan/config), the PCI side of the GPUs and RDMA devices `topo` reads
(tree._pci) with the GPUDirect modules and rdma-core's version (_gpudirect), every RDMA
netlink answer the read-only commands ask for (devices, ports, statistics, optional-counter
status, resources of every kind, system settings and features), the verbs attributes `-d`
shows, the names of the processes holding RDMA objects, and the kernel release, ibtool
version, host name and time. `SnapshotHost` gives a Host whose sources answer from the file:
every read-only command then prints what it printed live at that moment.

The answers are recorded where the host asks its sources (ibtool.snapshot.replay: method,
arguments -> value or error), so a replayed command takes the same path as the live one did;
the tree is ibtool.snapshot.tree's. The file is JSON (gzip-compressed when its name ends in
.gz) with a format name and version: a file from a newer ibtool, or a damaged one, is one clear
error.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import os
import signal
import stat
import time
import zlib
from collections.abc import Callable, Iterator
from itertools import repeat
from typing import Any

from ibtool import errors, snapshot
from ibtool.errors import IbtoolError, UsageError
from ibtool.snapshot.limits import DEFAULT, Limits, hint, shown
from ibtool.snapshot.replay import SnapshotError, recording, replaying
from ibtool.snapshot.tree import Tree, capture_tree

FORMAT = "ibtool-snapshot"
VERSION = 1
NOT_LIVE = "a snapshot is a record of a host, not its running kernel"
_RECORDED = "snapshot save records the kernel's RDMA netlink answers"


# -- saving -------------------------------------------------------------------------------------


def save(
    path: str,
    warn: Callable[[str], None],
    version: str,
    *,
    root: str = "/",
    open_netlink: Callable[[], Any] | None = None,
    open_verbs: Callable[[], Any] | None = None,
    release: str | None = None,
    comm: Callable[[int], str | None] | None = None,
    fabric: Callable[[Any], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Capture the host into `path` and return what was saved. `root`, `open_netlink`,
    `open_verbs`, the kernel `release` and `comm` (a process's name by pid) are the running
    host's unless given, as Host takes them (tests give a tree and a fake kernel). `fabric`:
    given the host, the fabric scan to keep (opt-in: MADs to the whole subnet); one that fails
    is a warning, and the rest is saved."""
    from ibtool import host as hosts
    from ibtool.sources.netlink.session import open_nldev
    from ibtool.sources.sysfs.infiniband import SysfsSource

    if os.path.isdir(path):
        raise UsageError(f"snapshot save {path}: a directory", "give the name of the file to write")

    netlink: dict[str, Any] = {}
    verbs: dict[str, Any] = {}
    host = hosts.Host(
        warn=warn,
        details=True,
        sysfs=SysfsSource(root, warn),
        netlink=recording(open_netlink or open_nldev, netlink),
        verbs=recording(open_verbs or hosts.open_verbs, verbs),
        release=release,
        comm=comm,
    )
    data: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "ibtool": version,
        "host": _hostname(),
        "time": time.time(),
        "kernel": host.kernel_release(),
    }
    data["sysfs"] = capture_tree(root)
    comms: dict[str, str | None] = {}
    features = None
    try:
        _ask_everything(host, comms)
        features = _features(host)
        if fabric is not None:
            try:
                data["fabric"] = fabric(host)
            except IbtoolError as e:
                hint = f" ({e.hint})" if e.hint else ""
                warn(f"the fabric is not saved: {e.message}{hint}")
    finally:
        host.close()
    data.update(netlink=netlink, verbs=verbs, comm=comms, features=features)
    data["gpudirect"] = _gpudirect(root)
    write(path, data)
    return data


def _gpudirect(root: str) -> dict[str, Any]:
    """What `ibtool topo` asks beyond the tree: whether the modules GPUDirect RDMA's memory
    registration needs are loaded under `root` (the tree holds no /sys/module; None where
    `root` cannot tell), and the running host's rdma-core version."""
    from ibtool.model.topo import GPUDIRECT_MODULES
    from ibtool.sources.sysfs.stack import StackFiles
    from ibtool.sources.versions import rdma_core

    stack = StackFiles(root)
    captured = root == "/" or stack.captured()
    found = rdma_core() if root == "/" else None
    return {
        "modules": {m: stack.module_loaded(m) for m in GPUDIRECT_MODULES} if captured else None,
        "rdma_core": found[0] if found else None,
    }


def _hostname() -> str:
    import socket  # a replay never needs it

    return socket.gethostname()


def _ask_everything(host, comms: dict[str, str | None]) -> None:
    """Every read the read-only commands make, so that their answers are recorded."""
    try:
        names = host.device_names()
    except IbtoolError:
        names = []
    if names:
        host.devices()
        host.ports()
        host.gids()
        host.counters()
        for name in names:
            host.device_caps(name)
    session = host.netlink(_RECORDED)  # save's host always has one
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
        for port in host.port_numbers(name):
            try:
                session.counter_status(indexes, name, port)
            except IbtoolError:
                pass


def _resources(host, comms: dict[str, str | None]) -> None:
    session = host.netlink(_RECORDED)
    devices = session.devices()
    session.summaries(devices)
    for details in (False, True):
        for _, o in session.every_resource(devices, details):
            if o.owner.pid is not None and str(o.owner.pid) not in comms:
                comms[str(o.owner.pid)] = host.comm(o.owner.pid)


def _features(host) -> list[dict[str, Any]] | None:
    import dataclasses

    try:
        _, features = host.netlink(_RECORDED).system_features()
    except IbtoolError:
        return None
    return [dataclasses.asdict(f) for f in features]


def write(path: str, data: dict[str, Any]) -> None:
    """Write a snapshot's JSON to `path` atomically: a new file beside it, renamed over it."""
    # Key order is kept: a replayed dict (verbs capabilities, driver attributes) is printed in
    # the order the source gave it.
    text = (json.dumps(data, separators=(",", ":")) + "\n").encode("utf-8")
    directory, name = os.path.split(path)
    # mkstemp: a name no one can guess, made with O_CREAT | O_EXCL | O_NOFOLLOW in the target's
    # directory, so that nothing planted there is followed and the rename is atomic.
    tmp = None
    try:
        with _signals_held():
            import tempfile

            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory or ".")
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
        with open(fd, "wb") as f:
            if path.endswith(".gz"):
                with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as z:
                    z.write(text)
            else:
                f.write(text)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise IbtoolError(f"cannot write {path}: {e.strerror or e}", errno=e.errno) from e
    finally:
        if tmp is not None:
            with _signals_held(), contextlib.suppress(OSError):
                os.unlink(tmp)


# -- reading ------------------------------------------------------------------------------------


HINT = "give a file written by `ibtool snapshot save`"
SIZES = " sizes"  # load()'s note of the file's size as stored and expanded (no JSON key has it)
_CHUNK = 1 << 20


def load(path: str, limits: Limits = DEFAULT) -> dict[str, Any]:
    """A snapshot file's content, read within `limits` and checked: one SnapshotError for what
    cannot be used, before anything is built from it."""
    raw = _read(path, limits)
    text = _expand(raw, path, limits)
    if text.count(b"{") > limits.entries:
        raise SnapshotError(
            f"{path} holds more than the limit of {shown('entries', limits.entries)}",
            hint("entries"),
        )
    try:
        data = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else e
        raise SnapshotError(f"{path} is not an ibtool snapshot (damaged: {why})", HINT) from None
    _check(data, path)
    data[SIZES] = (len(raw), len(text))
    return data


def _read(path: str, limits: Limits) -> bytes:
    # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses all but a
    # regular file (a FIFO, /dev/zero and /proc files have no size to bound the read by).
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise errors.NotFoundError(f"no snapshot {path}", HINT) from None
    except OSError as e:
        raise IbtoolError(f"cannot read {path}: {e.strerror or e}", errno=e.errno) from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise SnapshotError(f"{path} is {kind}", HINT)
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limits.size:
                raise SnapshotError(
                    f"{path} is larger than the limit of {shown('size', limits.size)}",
                    hint("size"),
                )
            chunks.append(chunk)
    except OSError as e:
        raise IbtoolError(f"cannot read {path}: {e.strerror or e}", errno=e.errno) from e
    finally:
        os.close(fd)


def _expand(raw: bytes, path: str, limits: Limits) -> bytes:
    """The JSON text: `raw`, or its gzip members decompressed. The expanded size is measured
    first, keeping nothing, so that a bomb (1 MB of gzip holding 1 GB) is refused at once."""
    if raw[:2] != b"\x1f\x8b":
        if len(raw) > limits.expanded:
            raise _too_large(path, limits)
        return raw
    _inflate(raw, path, limits, None)
    out: list[bytes] = []
    _inflate(raw, path, limits, out)
    return b"".join(out)


def _too_large(path: str, limits: Limits) -> SnapshotError:
    return SnapshotError(
        f"{path} expands past the limit of {shown('expanded', limits.expanded)}",
        hint("expanded"),
    )


def _inflate(raw: bytes, path: str, limits: Limits, out: list[bytes] | None) -> None:
    size = 0
    rest = raw
    while rest:
        if rest[:2] != b"\x1f\x8b":
            if rest.strip(b"\0"):  # gzip(1) ignores trailing zeros, nothing else
                raise SnapshotError(f"{path} is not an ibtool snapshot (damaged: trailing data)")
            return
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # one gzip member
        pending = rest
        try:
            while not inflater.eof:
                chunk = inflater.decompress(pending, _CHUNK)
                pending = inflater.unconsumed_tail
                size += len(chunk)
                if size > limits.expanded:
                    raise _too_large(path, limits)
                if out is not None:
                    out.append(chunk)
                if not chunk and not pending:
                    raise SnapshotError(f"{path} is not an ibtool snapshot (damaged: truncated)")
        except zlib.error as e:
            raise SnapshotError(f"{path} is not an ibtool snapshot (damaged: {e})") from None
        rest = inflater.unused_data


def _check(data: Any, path: str) -> None:
    """The shape every reader relies on; what a command reads of an answer is checked where
    the answer is used (a damaged answer is a SnapshotError too: see answer_unusable)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SnapshotError(f"{path} is not an ibtool snapshot", HINT)
    version = data.get("version")
    if type(version) is not int or version < 1:
        raise SnapshotError(
            f"{path} is damaged: its format version is {repr(version)[:40]}, not a number from 1",
            HINT,
        )
    if version > VERSION:
        raise SnapshotError(
            f"{path} is a snapshot of format {version}; this ibtool reads format {VERSION} "
            "and older",
            f"read it with the ibtool that saved it ({_said(data.get('ibtool', 'unknown'))}) "
            "or newer",
        )
    for field, kind in (("sysfs", list), ("netlink", dict), ("verbs", dict), ("comm", dict)):
        if not isinstance(data.get(field), kind):
            raise SnapshotError(f"{path} is damaged: its {field!r} is missing or malformed", HINT)
    for field in ("netlink", "verbs"):
        for answer in data[field].values():
            if not _answer(answer):
                raise SnapshotError(f"{path} is damaged: a {field} answer is malformed", HINT)
    for pid, comm in data["comm"].items():
        if comm is not None and not isinstance(comm, str):
            raise SnapshotError(f"{path} is damaged: the name of process {_said(pid)}", HINT)
    for field in ("host", "kernel", "ibtool"):
        if not isinstance(data.get(field, ""), str):
            raise SnapshotError(f"{path} is damaged: its {field!r} is not text", HINT)
    gpudirect = data.get("gpudirect")
    if gpudirect is not None and not _gpudirect_record(gpudirect):
        raise SnapshotError(f"{path} is damaged: its 'gpudirect' is malformed", HINT)
    features = data.get("features")
    if features is not None and not (
        isinstance(features, list) and all(map(_feature, features, repeat(_feature_fields())))
    ):
        raise SnapshotError(f"{path} is damaged: its 'features' are malformed", HINT)


def _gpudirect_record(record: Any) -> bool:
    from ibtool.model.topo import GPUDIRECT_MODULES

    if not isinstance(record, dict) or set(record) != {"modules", "rdma_core"}:
        return False
    modules, version = record["modules"], record["rdma_core"]
    if modules is not None and not (
        isinstance(modules, dict)
        and set(modules) <= set(GPUDIRECT_MODULES)
        and all(type(v) is bool for v in modules.values())
    ):
        return False
    return version is None or (isinstance(version, str) and len(version) <= 32)


def _answer(answer: Any) -> bool:
    if not isinstance(answer, dict) or len(answer) != 1:
        return False
    if "value" in answer:
        return True
    error = answer.get("error")
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and isinstance(error.get("hint"), (str, type(None)))
        and isinstance(error.get("errno"), (int, type(None)))
        and isinstance(error.get("class", ""), str)
    )


def _feature_fields() -> set[str]:
    import dataclasses

    from ibtool.model.records import NetlinkFeature

    return {f.name for f in dataclasses.fields(NetlinkFeature)}


def _feature(record: Any, names: set[str]) -> bool:
    if not isinstance(record, dict):
        return False
    return set(record) == names and all(
        isinstance(v, (str, int, float, bool, type(None))) for v in record.values()
    )


def _said(value: Any) -> str:
    """An untrusted value in a message: printable text as it is, anything else as its repr
    (escaped), cut short."""
    text = value if isinstance(value, str) and value.isprintable() else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- the replayed tree --------------------------------------------------------------------------

_read_paths: list[str] = []  # snapshots this process replayed


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait while a temporary thing is made and noted, or removed: a signal
    landing between the two would leave it behind. They are delivered right after."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def _uncollected() -> Iterator[None]:
    """The cyclic garbage collector held while a snapshot's ~10^5 objects are made, none of
    them in a cycle: it would walk them all again at each generation's threshold. What lives
    then is frozen (gc.freeze: kept out of every later collection, 14 ms of a 500-VF replay's
    150): the replay keeps it to its end, and SnapshotHost.close thaws it. Nothing made later
    is kept from the collector."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def answer_unusable(e: Exception) -> SnapshotError | None:
    """An exception a command raised on an answer a replayed snapshot gave, as the
    SnapshotError it is (exit 7), or None when no snapshot was replayed in this process."""
    if not _read_paths or not isinstance(
        e, (TypeError, KeyError, ValueError, AttributeError, IndexError, OverflowError)
    ):
        return None
    paths = " and ".join(dict.fromkeys(_read_paths))
    return SnapshotError(
        f"snapshot {paths} holds an answer ibtool cannot use ({type(e).__name__}: {e})",
        "the file is damaged, or was not written by `ibtool snapshot save`; --debug shows "
        "where it was read",
    )


class SnapshotHost:
    """A snapshot read back, its Host: the files of its tree read from memory, its recorded
    answers replayed. Nothing is written anywhere."""

    def __init__(
        self,
        path: str,
        warn: Callable[[str], None],
        details: bool,
        limits: Limits = DEFAULT,
    ):
        from ibtool.host import Host
        from ibtool.model.records import NetlinkFeature
        from ibtool.snapshot.memory import Memory
        from ibtool.sources.sysfs.infiniband import SysfsSource

        self.path = path
        # The tree as the file's own path: nothing on disk can lie under a regular file.
        self.root = os.path.abspath(path)
        with _uncollected():
            self.data = load(path, limits)
            files = Memory(Tree(self.data["sysfs"], limits), self.root)
        _read_paths.append(path)
        features = self.data.get("features")
        extra = {}
        if isinstance(features, list):
            extra["recorded_features"] = [NetlinkFeature(**f) for f in features]
        comms = self.data["comm"]
        saved_fabric = self.fabric = None
        if self.data.get("fabric") is not None:
            from ibtool.model.fabric import fabric_from_data

            try:
                saved_fabric = self.fabric = fabric_from_data(self.data["fabric"])
            except ValueError as e:
                self.close()
                raise SnapshotError(f"{path} is damaged: its {e}", HINT) from None
        self.host = Host(
            root=self.root,
            warn=warn,
            details=details,
            sysfs=SysfsSource(self.root, warn, origin=f"snapshot {path}", fs=files),
            netlink=replaying(self.data["netlink"], "RDMA netlink", path, extra),
            verbs=replaying(self.data["verbs"], "verbs", path),
            release=str(self.data.get("kernel", "")),
            live=False,
            not_live=NOT_LIVE,
            comm=lambda pid: comms.get(str(pid)),
            saved_fabric=saved_fabric,
            fs=files,
            gpudirect=self.data.get("gpudirect"),
        )

    def close(self) -> None:
        host = getattr(self, "host", None)
        if host is not None:
            host.close()
        gc.unfreeze()


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """What a loaded snapshot holds, counted, without building anything: `snapshot show`."""
    from ibtool.model.names import natural_key

    devices = []
    for entry in data["sysfs"]:
        path = entry.get("path") if isinstance(entry, dict) else None
        parent, _, name = str(path).rpartition("/")
        if parent == "sys/class/infiniband" and name:
            devices.append(name)
    stored, expanded = data.get(SIZES, (None, None))
    return {
        "format": data["format"],
        "version": data["version"],
        "ibtool": data.get("ibtool"),
        "host": data.get("host"),
        "time": data.get("time") if isinstance(data.get("time"), (int, float)) else None,
        "kernel": data.get("kernel"),
        "devices": sorted(devices, key=natural_key),
        "sysfs_entries": len(data["sysfs"]),
        "netlink_answers": len(data["netlink"]),
        "verbs_answers": len(data["verbs"]),
        "processes": len(data["comm"]),
        "bytes": stored,
        "bytes_expanded": expanded,
    }


snapshot.CLASSIFIERS.append(answer_unusable)
