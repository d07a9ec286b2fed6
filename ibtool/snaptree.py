"""The RDMA sysfs tree as a snapshot holds it: what the sysfs source reads of each device (its
directory, its bus device's driver link and netdevs, /proc/net/vlan/config) as entries, and
those entries built back into a directory tree."""

from __future__ import annotations

import base64
import errno as errnos
import os
from typing import Any

from ibtool.replay import SnapshotError
from ibtool.snaplimits import DEFAULT, Limits, hint, shown
from ibtool.sources.sysfs import BOND_FILES, BOND_SLAVE_FILES, valid_netdev_name

_SKIP_DIRS = {"power"}  # runtime PM attributes: not RDMA state, and reading them wakes devices


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
    _bonds(root, out)
    return out


def _bonds(root: str, out: list[dict[str, Any]]) -> None:
    """What the sysfs source reads of each bond (a RoCE port's netdev may be one): its
    bonding/ attributes and its slaves' bonding_slave/ ones."""
    net = os.path.join(root, "sys", "class", "net")
    try:
        names = sorted(os.listdir(net))
    except OSError:
        return
    for name in names:
        bonding = os.path.join(net, name, "bonding")
        if not os.path.isdir(bonding):
            continue
        for directory, files in ((bonding, BOND_FILES), *_slave_dirs(net, bonding)):
            out.append({"path": os.path.relpath(directory, root), "dir": True})
            for file in files:
                entry = _entry(os.path.join(directory, file), root)
                if entry is not None and "dir" not in entry:
                    out.append(entry)


def _slave_dirs(net: str, bonding: str) -> list[tuple[str, tuple[str, ...]]]:
    try:
        with open(os.path.join(bonding, "slaves")) as f:
            slaves = f.read().split()
    except OSError:
        return []
    return [
        (os.path.join(net, s, "bonding_slave"), BOND_SLAVE_FILES)
        for s in slaves
        if valid_netdev_name(s)
    ]


# What a path of the tree is; a file's content and a link's target are kept beside.
_DIR, _FILE, _LINK = "dir", "file", "link"
_MAXSYMLINKS = 40  # links followed in one lookup before ELOOP (include/linux/namei.h)
_NAME_MAX = 255  # bytes of one path component (include/uapi/linux/limits.h)
_KINDS = ("dir", "unreadable", "link", "text", "bytes")


class Tree:
    """A snapshot's entries checked and laid out in memory before anything is written: every
    path inside the tree, no entry under a link or a file, every link resolving inside the tree
    (through the snapshot's other links, as the kernel will), within the limits."""

    def __init__(self, entries: Any, limits: Limits = DEFAULT):
        self.limits = limits
        self.kind: dict[tuple[str, ...], str] = {(): _DIR}
        self.children: dict[tuple[str, ...], dict[str, None]] = {(): {}}
        self.content: dict[tuple[str, ...], bytes | str] = {}
        self._resolved: dict[tuple[str, ...], tuple[str, ...] | None] = {}
        if not isinstance(entries, list):
            raise SnapshotError("its sysfs entries are not a list")
        for number, entry in enumerate(entries):
            self._add(number, entry)
        for path, kind in self.kind.items():
            if kind == _LINK:
                self._check_link(path)

    # -- entries ---------------------------------------------------------------------------

    def _add(self, number: int, entry: Any) -> None:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise SnapshotError(f"sysfs entry {number} is not an object with a path")
        parts = self._parts(entry["path"], "path")
        kinds = [k for k in _KINDS if k in entry]
        if len(kinds) != 1 or len(entry) != 2:
            raise SnapshotError(
                f"sysfs entry {_show(entry['path'])} is not a directory, a file or a link"
            )
        kind, value = kinds[0], entry[kinds[0]]
        if kind in ("dir", "unreadable"):
            # A file the kernel would not let be read is an empty directory: reading it fails.
            if (kind == "dir" and value is not True) or (
                kind == "unreadable" and type(value) is not int
            ):
                raise SnapshotError(f"sysfs entry {_show(entry['path'])} has a malformed {kind!r}")
            self._place(parts, _DIR, None)
            return
        if not isinstance(value, str):
            raise SnapshotError(f"sysfs entry {_show(entry['path'])} has a malformed {kind!r}")
        if kind == "link":
            self._parts(value, "link target", relative=True)
            self._place(parts, _LINK, value)
        elif kind == "text":
            self._place(parts, _FILE, value.encode("utf-8", "surrogatepass"))
        else:
            try:
                data = base64.b64decode(value, validate=True)
            except ValueError:
                raise SnapshotError(f"sysfs entry {_show(entry['path'])} is not base64") from None
            self._place(parts, _FILE, data)

    def _parts(self, path: str, what: str, relative: bool = False) -> tuple[str, ...]:
        limit = self.limits.path
        if len(path.encode("utf-8", "surrogatepass")) > limit:
            raise SnapshotError(
                f"a {what} is longer than the limit of {shown('path', limit)}",
                hint("path"),
            )
        try:
            os.fsencode(path)  # a lone surrogate has no bytes to name a file with
        except UnicodeError:
            raise SnapshotError(f"a {what} is not a file name: {_show(path)}") from None
        if "\0" in path or not path:
            raise SnapshotError(f"a {what} is not a file name: {_show(path)}")
        if path.startswith("/"):
            raise SnapshotError(f"snapshot {what} outside its tree: {_show(path)}")
        parts = tuple(p for p in path.split("/") if p not in ("", "."))
        if not relative and ".." in parts:
            raise SnapshotError(f"snapshot {what} outside its tree: {_show(path)}")
        if len(parts) > self.limits.depth:
            raise SnapshotError(
                f"a {what} is deeper than the limit of {shown('depth', self.limits.depth)}",
                hint("depth"),
            )
        if any(len(p.encode("utf-8", "surrogatepass")) > _NAME_MAX for p in parts):
            raise SnapshotError(f"a {what} has a name longer than {_NAME_MAX} bytes")
        return parts

    def _place(self, parts: tuple[str, ...], kind: str, content: bytes | str | None) -> None:
        for depth in range(1, len(parts)):
            parent = parts[:depth]
            found = self.kind.get(parent)
            if found is None:
                self._new(parent, _DIR)
            elif found != _DIR:
                raise SnapshotError(
                    f"snapshot entry {_show('/'.join(parts))} lies under a {found}, "
                    f"{_show('/'.join(parent))}"
                )
        found = self.kind.get(parts)
        if found is None:
            self._new(parts, kind)
        elif found != kind or (kind != _DIR and self.content[parts] != content):
            raise SnapshotError(f"snapshot entry {_show('/'.join(parts))} is given twice")
        if kind != _DIR:
            self.content[parts] = content  # type: ignore[assignment]

    def _new(self, parts: tuple[str, ...], kind: str) -> None:
        self.kind[parts] = kind
        self.children[parts[:-1]][parts[-1]] = None
        if kind == _DIR:
            self.children[parts] = {}

    # -- links -----------------------------------------------------------------------------

    def _check_link(self, path: tuple[str, ...]) -> None:
        try:
            self._follow(path, 0)
        except _Outside as e:
            raise SnapshotError(
                f"snapshot link {_show('/'.join(path))} -> {_show(str(self.content[path]))} "
                f"{e}: a replay reads nothing outside its own tree"
            ) from None

    def _follow(self, link: tuple[str, ...], hops: int) -> tuple[str, ...] | None:
        """Where a link leads, as a path of the tree, or None where the lookup stops (a
        missing entry, a file in the middle): _Outside where it would leave the tree."""
        if link in self._resolved:
            return self._resolved[link]
        if hops >= _MAXSYMLINKS:
            raise _Outside("is a loop of links")
        where: list[str] = list(link[:-1])
        target = str(self.content[link])
        parts = [p for p in target.split("/") if p not in ("", ".")]
        found: tuple[str, ...] | None = None
        for i, part in enumerate(parts):
            if part == "..":
                if not where:
                    raise _Outside("leads out of the tree")
                where.pop()
                continue
            where.append(part)
            kind = self.kind.get(tuple(where))
            if kind == _LINK:
                next_hop = self._follow(tuple(where), hops + 1)
                if next_hop is None:
                    break
                where = list(next_hop)
            elif kind is None or (kind == _FILE and i < len(parts) - 1):
                # The kernel's lookup stops here (ENOENT, ENOTDIR); what follows must not
                # climb out all the same.
                depth = len(where)
                for rest in parts[i + 1 :]:
                    depth += -1 if rest == ".." else 1
                    if depth < 0:
                        raise _Outside("leads out of the tree")
                break
        else:
            found = tuple(where)
        self._resolved[link] = found
        return found

    # -- on disk ---------------------------------------------------------------------------

    def build(self, dest: str) -> None:
        """The tree under the empty directory `dest`, each entry made relative to its parent's
        descriptor, exclusively and without following a link."""
        fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._fill((), fd)
        finally:
            os.close(fd)

    def _fill(self, parts: tuple[str, ...], fd: int) -> None:
        for name in self.children[parts]:
            path = (*parts, name)
            kind = self.kind[path]
            if kind == _LINK:
                os.symlink(self.content[path], name, dir_fd=fd)
            elif kind == _FILE:
                _write_new(name, self.content[path], fd)  # type: ignore[arg-type]
            else:
                os.mkdir(name, 0o755, dir_fd=fd)
                sub = os.open(name, _DIRECTORY, dir_fd=fd)
                try:
                    self._fill(path, sub)
                finally:
                    os.close(sub)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Outside(Exception):
    pass


def _write_new(name: str, data: bytes, dir_fd: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _show(text: str, width: int = 80) -> str:
    """An untrusted path in a message: escaped, cut to a width."""
    said = repr(text[: width + 1])
    return said if len(text) <= width else said[:-1] + "...'"


def build_tree(entries: Any, dest: str, limits: Limits = DEFAULT) -> None:
    """The captured entries, checked (Tree), as a directory tree under `dest` (made if it is
    not there; an empty directory if it is)."""
    tree = Tree(entries, limits)
    os.makedirs(dest, exist_ok=True)
    tree.build(dest)
