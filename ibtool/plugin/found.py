"""Which installed distributions offer ibtool plugins, found once per install, not per start.

Finding them means reading the metadata of every installed distribution (importlib.metadata's
`distributions()`, which parses each one's METADATA with the email package): ~40 ms on a host,
~1.5 s in a VM whose root is shared over 9p. What it finds changes only when something is
installed, upgraded or removed, and each of those adds or removes a `NAME-VERSION.dist-info`
(or `.egg-info`) directory in a directory on sys.path (the Python Packaging Authority's
"Recording installed projects" specification) and so changes that directory's listing and its
modification time. So the answer is kept in a cache file under the user's cache directory
(XDG Base Directory: $XDG_CACHE_HOME, else ~/.cache), keyed by sys.path and, for each of its
directories, the modification time and the names of the distributions' directories in it; a
start lists those few directories and reads one small file. Any change to the key is a new scan.

The cache is read only where it cannot have been planted: a regular file, not a link, owned by
this user and writable by no one else, in a directory likewise; at most CACHE_LIMIT bytes; its
every field checked. Anything else, or a write that fails (a read-only home), is a scan, as if
there were no cache. It names only entry points found on sys.path, the same code the scan finds.
"""

from __future__ import annotations

import os
import stat
import sys
import zlib
from collections.abc import Mapping

GROUP = "ibtool"
DISTRIBUTION = "ibtool"  # ibtool's own distribution's name
FORMAT = 1
CACHE_LIMIT = 1 << 20
KEEP = 16
_INFO = (".dist-info", ".egg-info")


class Offered:
    """An entry point of group GROUP: its name, `module[:attr]` value, and its distribution's
    name and version as its metadata says them."""

    __slots__ = ("name", "value", "distribution", "version")

    def __init__(self, name: str, value: str, distribution: str, version: str | None) -> None:
        self.name, self.value = name, value
        self.distribution, self.version = distribution, version

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()

    def load(self) -> object:
        """What the entry point names, as importlib.metadata's EntryPoint.load finds it."""
        import importlib

        found: object = importlib.import_module(self.module)
        attr = self.value.partition(":")[2].partition("[")[0].strip()  # extras name no object
        for part in filter(None, attr.split(".")):
            found = getattr(found, part)
        return found


class Found:
    """ibtool's own distribution (name, version; None in a clone) and the plugins offered."""

    __slots__ = ("own", "offered")

    def __init__(self, own: tuple[str, str | None] | None, offered: list[Offered]) -> None:
        self.own, self.offered = own, offered


def scan() -> Found:
    """Read every installed distribution's metadata: the slow way, and the truth. A
    distribution found twice on sys.path counts once, the first (as `entry_points()` does on
    Python 3.10+); walked per distribution because `EntryPoint.dist` and
    `entry_points(group=)` are Python 3.10+."""
    import re
    from importlib import metadata

    seen = set()
    offered = []
    for dist in metadata.distributions():
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        if name in seen:
            continue
        seen.add(name)
        for ep in dist.entry_points:
            if ep.group == GROUP:
                offered.append(Offered(ep.name, ep.value, dist.metadata["Name"], dist.version))
    try:
        mine = metadata.distribution(DISTRIBUTION)
        own: tuple[str, str | None] | None = (mine.metadata["Name"], mine.version)
    except metadata.PackageNotFoundError:
        own = None
    return Found(own, offered)


def _key() -> list:
    """What a new install changes: the names of the distributions' metadata directories in each
    sys.path entry and, where there are some, the entry's modification time (a reinstall of the
    same version makes the directory anew). A directory without any (the script's, the working
    directory of `python3 -m ibtool`) changes as files come and go: its time is left out."""
    key = []
    for entry in sys.path:
        where = entry or os.curdir
        try:
            names = sorted(n for n in os.listdir(where) if n.endswith(_INFO))
            mtime = os.stat(where).st_mtime_ns if names else None
        except OSError:  # not there, a zip file, or a directory we may not list
            names, mtime = [], None
        key.append([entry, mtime, names])
    return key


def cache_path(environ: Mapping[str, str]) -> str | None:
    base = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the specification: a relative path is to be ignored
        home = environ.get("HOME", "")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    # One file per interpreter and path (`python3 -m ibtool` puts the working directory first
    # on sys.path, the `ibtool` script its own directory): the two never take turns at one.
    where = os.fsencode("\0".join([sys.executable, *sys.path]))
    return os.path.join(base, "ibtool", f"plugins-{zlib.crc32(where):08x}.json")


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _read(path: str) -> object:
    import json

    folder = os.path.dirname(path)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or not _trusted(st):
        return None
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _trusted(st) or st.st_size > CACHE_LIMIT:
            return None
        data = os.read(fd, CACHE_LIMIT + 1)
    finally:
        os.close(fd)
    return json.loads(data)


def _strings(value: object, size: int, optional: int = -1) -> bool:
    return (
        isinstance(value, list)
        and len(value) == size
        and all(isinstance(v, str) or (i == optional and v is None) for i, v in enumerate(value))
    )


def _parse(data: object, key: list) -> Found | None:
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
        return None
    own, offered = data.get("own"), data.get("plugins")
    if not (own is None or _strings(own, 2, optional=1)) or not isinstance(offered, list):
        return None
    if not all(_strings(o, 4, optional=3) for o in offered):
        return None
    return Found(tuple(own) if own else None, [Offered(*o) for o in offered])


def _prune(folder: str) -> None:
    """Keep the KEEP files used last (`python3 -m ibtool` run from many directories makes one
    each), and remove what a write killed half way (SIGKILL) left: its `.PID` file, a minute
    old."""
    import time

    kept = []
    for name in os.listdir(folder):
        if not name.startswith("plugins-"):
            continue
        where = os.path.join(folder, name)
        try:
            st = os.lstat(where)
        except OSError:
            continue
        if name.endswith(".json"):
            kept.append((st.st_atime_ns, name))
        elif st.st_mtime < time.time() - 60:
            _unlink(where)
    for _, name in sorted(kept, reverse=True)[KEEP - 1 :]:
        _unlink(os.path.join(folder, name))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write(path: str, key: list, found: Found) -> None:
    import json

    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if not _trusted(os.lstat(folder)):
        return
    _prune(folder)
    text = json.dumps(
        {
            "format": FORMAT,
            "key": key,
            "own": list(found.own) if found.own else None,
            "plugins": [[o.name, o.value, o.distribution, o.version] for o in found.offered],
        }
    )
    temporary = f"{path}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def find(environ: Mapping[str, str]) -> Found:
    """The plugins offered and ibtool's own distribution: from the cache when nothing was
    installed or removed since it was written, else scanned (and the cache written)."""
    path = cache_path(environ)
    key = _key()
    if path is not None:
        try:
            found = _parse(_read(path), key)
        except (OSError, ValueError, RecursionError):
            found = None
        if found is not None:
            return found
    found = scan()
    if path is not None:
        try:
            _write(path, key, found)
        except OSError:
            pass  # a read-only or foreign home: the next start scans again
    return found
