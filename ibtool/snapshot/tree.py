"""The RDMA sysfs tree as a snapshot holds it: what the sysfs source reads of each device (its
directory, its bus device's driver link and netdevs, /proc/net/vlan/config) and the PCI side
of the GPUs and RDMA devices (_pci) as entries, and those entries built back into a tree."""

from __future__ import annotations

import base64
import errno as errnos
import os
import re
from itertools import repeat
from typing import Any

from ibtool.snapshot.limits import DEFAULT, Limits, hint, shown
from ibtool.snapshot.replay import SnapshotError
from ibtool.sources.sysfs.net import BOND_FILES, BOND_SLAVE_FILES
from ibtool.sources.sysfs.values import valid_netdev_name

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
    functions: set[str] = set()  # the RDMA devices' bus devices, for _pci
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
            functions.add(real)
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
    _pci(root, out, functions)
    return out


# What `ibtool topo` reads of a PCI function (and of each bridge above it): its IDs, NUMA
# node, CPUs, link and configuration space; not vpd (the board's serial) nor its resources.
PCI_FILES = ("vendor", "device", "class", "subsystem_vendor", "subsystem_device", "numa_node",
             "local_cpulist", "current_link_speed", "current_link_width", "max_link_speed",
             "max_link_width")  # fmt: skip
PCI_LINKS = ("driver", "iommu_group", "physfn")


def _pci(root: str, out: list[dict[str, Any]], rdma: set[str]) -> None:
    """The PCI side of the GPUs and RDMA devices (`ibtool topo`): each one's function and
    every bridge above it with PCI_FILES, its links and its configuration space (the Device
    Serial Number left out), their /sys/bus/pci/devices links, the IOMMU groups' types, the
    NVIDIA driver's version line. `rdma`: the RDMA devices' PCI functions, resolved."""
    from ibtool.model.topo import PciFunction
    from ibtool.sources.sysfs.pci import without_serial

    bus = os.path.join(root, "sys", "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(bus))
    except OSError:
        return
    have = {e["path"] for e in out}
    chosen = []
    for name in names:
        real = os.path.realpath(os.path.join(bus, name))
        ids = [_hex_file(os.path.join(real, f)) for f in ("vendor", "class")]
        if real in rdma or PciFunction(name, ids[0], None, ids[1]).is_gpu:
            chosen.append(real)

    def add(entry: dict[str, Any] | None) -> None:
        if entry is not None and entry["path"] not in have:
            have.add(entry["path"])
            out.append(entry)

    groups = set()
    for real in chosen:
        d = real
        while _PCI_NAME.fullmatch(os.path.basename(d)):
            add({"path": os.path.relpath(d, root), "dir": True})
            add(_entry(os.path.join(bus, os.path.basename(d)), root))
            for name in PCI_FILES:
                if os.path.isfile(os.path.join(d, name)):
                    add(_entry(os.path.join(d, name), root))
            for name in PCI_LINKS:
                entry = _entry(os.path.join(d, name), root)
                if entry is not None and "link" in entry:
                    add(entry)
                    if name == "iommu_group":
                        groups.add(os.path.realpath(os.path.join(d, name)))
            config = os.path.join(d, "config")
            try:
                with open(config, "rb") as f:
                    data = without_serial(f.read(4097)[:4096])
                add({"path": os.path.relpath(config, root),
                     "bytes": base64.b64encode(data).decode()})  # fmt: skip
            except OSError:
                pass
            d = os.path.dirname(d)
    iommu = os.path.join(root, "sys", "kernel", "iommu_groups")
    if os.path.isdir(iommu):
        add({"path": os.path.relpath(iommu, root), "dir": True})
    for group in sorted(groups):
        add({"path": os.path.relpath(group, root), "dir": True})
        kind = os.path.join(group, "type")
        if os.path.isfile(kind):
            add(_entry(kind, root))
    nvidia = os.path.join(root, "proc", "driver", "nvidia", "version")
    if os.path.isfile(nvidia):
        add(_entry(nvidia, root))


_PCI_NAME = re.compile(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def _hex_file(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read(16).strip(), 16)
    except (OSError, ValueError):
        return None


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
DIR, FILE, LINK = "dir", "file", "link"
MAXSYMLINKS = 40  # links followed in one lookup before ELOOP (include/linux/namei.h)
_NAME_MAX = 255  # bytes of one path component (include/uapi/linux/limits.h)
_KINDS = ("dir", "unreadable", "link", "text", "bytes")
# What a path may hold that is other than plain "a/b/c" names (Tree._plain), found in the
# paths joined by newlines: NUL, an empty component (a leading, doubled or trailing slash, an
# empty path), a component starting with a dot (".", "..", and the rare name that starts so).
_UNUSUAL = ("\0", "//", "/.", "\n/", "\n.", "/\n", "\n\n")
_UNUSUAL_ENDS = ("", "/", ".", "\n")
# A link's target may hold ".." components, but no NUL, newline, empty or "." component.
_UNUSUAL_TARGET = re.compile(r"\0|\n|(?:^|/)\.?(?:/|$)")


class Tree:
    """A snapshot's entries checked and laid out in memory before anything is written: every
    path inside the tree, no entry under a link or a file, every link resolving inside the tree
    (through the snapshot's other links, as the kernel will), within the limits.

    Paths are kept as "a/b/c" strings ("" is the tree's root): 28,348 entries of the largest
    host are checked in about 20 ms."""

    def __init__(self, entries: Any, limits: Limits = DEFAULT, *, at_once: bool = True):
        """`at_once`: whether plain entries may be laid out at once (_plain); False lays
        every entry out one by one, as an entry that is not plain is."""
        self.limits = limits
        self._empty()
        self._resolved: dict[str, str | None] = {}
        if not isinstance(entries, list):
            raise SnapshotError("its sysfs entries are not a list")
        if not (at_once and self._plain(entries)):
            self._empty()
            for number, entry in enumerate(entries):
                self._add(number, entry)
        for path, kind in self.kind.items():
            if kind == LINK:
                self._check_link(path)

    def _empty(self) -> None:
        self.kind: dict[str, str] = {"": DIR}
        self.children: dict[str, list[str]] = {"": []}
        self.content: dict[str, Any] = {}  # a file's text (str) or bytes, a link's target

    # -- entries ---------------------------------------------------------------------------

    def _plain(self, entries: list) -> bool:
        """The entries laid out at once where every one is plain (what `snapshot save`
        writes): paths of ASCII names, none empty, "." or "..", none given twice (but a
        directory), each of a known kind with a well-formed value, each under a directory.
        False as soon as one is not: then _add lays them out one by one and says what is
        wrong with the first that is. Both give the same tree, this one in half the time."""
        try:
            paths = [e["path"] for e in entries]
            joined = "\n".join(paths)
        except (TypeError, KeyError):
            return False
        limits = self.limits
        if (
            not joined.isascii()
            or joined.count("\n") != len(paths) - 1
            or joined[:1] in _UNUSUAL_ENDS
            or joined[-1:] in _UNUSUAL_ENDS
            or any(s in joined for s in _UNUSUAL)
            or (paths and max(map(len, paths)) > min(limits.path, _NAME_MAX))
            or (paths and max(map(str.count, paths, repeat("/"))) >= limits.depth)
        ):
            return False
        kind, children, content = self.kind, self.children, self.content
        for entry, path in zip(entries, paths):
            if type(entry) is not dict or len(entry) != 2:
                return False
            if path in kind:  # a directory made on the way, given now: it is there
                if kind[path] != DIR or entry.get("dir") is not True:
                    return False
                continue
            if "text" in entry:
                value = content[path] = entry["text"]
                if type(value) is not str:
                    return False
                kind[path] = FILE
            elif "dir" in entry or "unreadable" in entry:
                # A file the kernel would not let be read is an empty directory (_add).
                if not (entry.get("dir") is True or type(entry.get("unreadable")) is int):
                    return False
                kind[path] = DIR
                children[path] = []
            elif "link" in entry:
                value = entry["link"]
                if type(value) is not str or not value or _UNUSUAL_TARGET.search(value):
                    return False
                if (
                    len(value) > min(limits.path, _NAME_MAX)
                    or not value.isascii()
                    or value.count("/") >= limits.depth
                ):
                    return False
                kind[path] = LINK
                content[path] = value
            else:
                return False  # bytes and the malformed: one by one
            parent, _, name = path.rpartition("/")
            above = kind.get(parent)
            if above is None:
                self._place(parent, DIR, None)  # made on the way, as mkdir -p would
            elif above != DIR:
                return False
            children[parent].append(name)
        return True

    def _add(self, number: int, entry: Any) -> None:
        if type(entry) is not dict or len(entry) != 2 or type(entry.get("path")) is not str:
            if isinstance(entry, dict) and isinstance(entry.get("path"), str):
                raise SnapshotError(
                    f"sysfs entry {_show(entry['path'])} is not a directory, a file or a link"
                )
            raise SnapshotError(f"sysfs entry {number} is not an object with a path")
        path = self._path(entry["path"], "path")
        if "text" in entry:
            kind, value = "text", entry["text"]
        elif "dir" in entry:
            kind, value = "dir", entry["dir"]
        elif "link" in entry:
            kind, value = "link", entry["link"]
        elif "bytes" in entry:
            kind, value = "bytes", entry["bytes"]
        elif "unreadable" in entry:
            kind, value = "unreadable", entry["unreadable"]
        else:
            raise SnapshotError(f"sysfs entry {_show(path)} is not a directory, a file or a link")
        if kind == "dir" or kind == "unreadable":
            # A file the kernel would not let be read is an empty directory: reading it fails.
            if (value is not True) if kind == "dir" else (type(value) is not int):
                raise SnapshotError(f"sysfs entry {_show(path)} has a malformed {kind!r}")
            self._place(path, DIR, None)
            return
        if type(value) is not str:
            raise SnapshotError(f"sysfs entry {_show(path)} has a malformed {kind!r}")
        if kind == "link":
            self._path(value, "link target", relative=True)
            self._place(path, LINK, value)
        elif kind == "text":
            self._place(path, FILE, value)
        else:
            try:
                data = base64.b64decode(value, validate=True)
            except ValueError:
                raise SnapshotError(f"sysfs entry {_show(path)} is not base64") from None
            self._place(path, FILE, data)

    def _path(self, path: str, what: str, relative: bool = False) -> str:
        """`path` checked and made plain ("a/b"; "." and empty parts dropped)."""
        limits = self.limits
        ascii_only = path.isascii()
        if len(path) > limits.path or (
            not ascii_only and len(path.encode("utf-8", "surrogatepass")) > limits.path
        ):
            raise SnapshotError(
                f"a {what} is longer than the limit of {shown('path', limits.path)}",
                hint("path"),
            )
        if not ascii_only:
            try:
                os.fsencode(path)  # a lone surrogate has no bytes to name a file with
            except UnicodeError:
                raise SnapshotError(f"a {what} is not a file name: {_show(path)}") from None
        if not path or "\0" in path:
            raise SnapshotError(f"a {what} is not a file name: {_show(path)}")
        if path[0] == "/":
            raise SnapshotError(f"snapshot {what} outside its tree: {_show(path)}")
        parts = path.split("/")
        if "" in parts or "." in parts:
            parts = [p for p in parts if p and p != "."]
            path = "/".join(parts)
        if not relative and ".." in parts:
            raise SnapshotError(f"snapshot {what} outside its tree: {_show(path)}")
        if len(parts) > limits.depth:
            raise SnapshotError(
                f"a {what} is deeper than the limit of {shown('depth', limits.depth)}",
                hint("depth"),
            )
        if len(path) > _NAME_MAX and any(
            len(p.encode("utf-8", "surrogatepass")) > _NAME_MAX for p in parts
        ):
            raise SnapshotError(f"a {what} has a name longer than {_NAME_MAX} bytes")
        return path

    def _place(self, path: str, kind: str, content: Any) -> None:
        found = self.kind.get(path)
        if found is None:
            parent, _, name = path.rpartition("/")
            if self.kind.get(parent) is None:
                self._place(parent, DIR, None)  # made on the way, as mkdir -p would
            elif self.kind[parent] != DIR:
                raise SnapshotError(
                    f"snapshot entry {_show(path)} lies under a {self.kind[parent]}, "
                    f"{_show(parent)}"
                )
            self.kind[path] = kind
            self.children[parent].append(name)
            if kind == DIR:
                self.children[path] = []
            else:
                self.content[path] = content
        elif found != kind or (kind != DIR and self.content[path] != content):
            raise SnapshotError(f"snapshot entry {_show(path)} is given twice")

    # -- links -----------------------------------------------------------------------------

    def _check_link(self, path: str) -> None:
        try:
            self._follow(path, 0)
        except _Outside as e:
            raise SnapshotError(
                f"snapshot link {_show(path)} -> {_show(str(self.content[path]))} "
                f"{e}: a replay reads nothing outside its own tree"
            ) from None

    def _follow(self, link: str, hops: int) -> str | None:
        """Where a link leads, as a path of the tree, or None where the lookup stops (a
        missing entry, a file in the middle): _Outside where it would leave the tree."""
        if link in self._resolved:
            return self._resolved[link]
        if hops >= MAXSYMLINKS:
            raise _Outside("is a loop of links")
        parent = link.rpartition("/")[0]
        where: list[str] = parent.split("/") if parent else []
        parts = [p for p in str(self.content[link]).split("/") if p and p != "."]
        found: str | None = None
        for i, part in enumerate(parts):
            if part == "..":
                if not where:
                    raise _Outside("leads out of the tree")
                where.pop()
                continue
            where.append(part)
            here = "/".join(where)
            kind = self.kind.get(here)
            if kind == LINK:
                next_hop = self._follow(here, hops + 1)
                if next_hop is None:
                    break
                where = next_hop.split("/") if next_hop else []
            elif kind is None or (kind == FILE and i < len(parts) - 1):
                # The kernel's lookup stops here (ENOENT, ENOTDIR); what follows must not
                # climb out all the same.
                depth = len(where)
                for rest in parts[i + 1 :]:
                    depth += -1 if rest == ".." else 1
                    if depth < 0:
                        raise _Outside("leads out of the tree")
                break
        else:
            found = "/".join(where)
        self._resolved[link] = found
        return found

    # -- on disk ---------------------------------------------------------------------------

    def build(self, dest: str) -> None:
        """The tree under the empty directory `dest`, each entry made relative to its parent's
        descriptor, exclusively and without following a link."""
        fd = os.open(dest, _DIRECTORY)
        try:
            self._fill("", fd)
        finally:
            os.close(fd)

    def _fill(self, directory: str, fd: int) -> None:
        prefix = f"{directory}/" if directory else ""
        for name in self.children[directory]:
            path = prefix + name
            kind = self.kind[path]
            if kind == FILE:
                _write_new(name, self.content[path], fd)
            elif kind == LINK:
                os.symlink(self.content[path], name, dir_fd=fd)
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


def _write_new(name: str, data: str | bytes, dir_fd: int) -> None:
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
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
