"""The RDMA sysfs tree as a snapshot holds it: what the sysfs source reads of each device (its
directory, its bus device's driver link and netdevs, /proc/net/vlan/config) as entries, and
those entries built back into a directory tree."""

from __future__ import annotations

import base64
import errno as errnos
import os
from typing import Any

from ibtool.replay import SnapshotError
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
