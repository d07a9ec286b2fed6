"""Any file under a root (/sys, /proc, /etc), read bounded and never through a link that leads
out of the root: a captured tree whose link points at /proc/self/... or ../../.. must not read
the machine it is examined on.

Warnings name the path as the running host has it (/proc/sys/net/ipv4/conf/all/rp_filter),
once per file.
"""

from __future__ import annotations

import os

from ibtool.sources.sysfs.files import SysfsFiles
from ibtool.sources.sysfs.values import quoted

# One page is what a sysfs or /proc attribute prints; /proc/PID/status and limits are ~1.5 KiB.
READ_LIMIT = 64 * 1024


class RootedFiles(SysfsFiles):
    """The files under `root`, each read once up to `limit` bytes."""

    def __init__(self, *args, limit: int = READ_LIMIT, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limit = limit
        self._real_root = self.fs.realpath(self.root)

    def path(self, *parts: str) -> str:
        """root + /parts (parts relative to /)."""
        return os.path.join(self.root, *(p.lstrip("/") for p in parts))

    def _rel(self, path: str) -> str:
        if self.root in ("/", ""):
            return path
        rel = os.path.relpath(path, self.root)
        return path if rel.startswith("..") else "/" + rel

    def inside(self, path: str) -> str | None:
        """`path` with every link resolved, if that stays under the root; None (and a warning)
        when a link leads out of it; the path itself when it does not exist."""
        real = self.fs.realpath(path)
        if self._real_root == "/" or real == self._real_root:
            return real
        if os.path.commonpath([real, self._real_root]) != self._real_root:
            self.bad(path, f"a link out of the root (to {quoted(real)}): not followed")
            return None
        return real

    def read(self, path: str, *, required: bool = True, quiet: bool = False) -> str | None:
        real = self.inside(path)
        if real is None:
            return None
        try:
            data = self.fs.read(real, self.limit + 1)
        except FileNotFoundError:
            if self.fs.islink(path):
                self.bad(path, "dangling link")
            elif required:
                self.bad(path, "missing")
            return None
        except OSError as e:
            if not quiet:
                self.bad(path, f"cannot read: {e.strerror or e}")
            return None
        if len(data) > self.limit:
            self.bad(path, f"larger than {self.limit} bytes: not read")
            return None
        return data.decode("utf-8", "surrogateescape").rstrip("\n")

    def isdir(self, path: str) -> bool:
        real = self.inside(path)
        return real is not None and self.fs.isdir(real)

    def exists(self, path: str) -> bool:
        """Whether `path` is there, without following a link out of the root (quietly)."""
        real = self.fs.realpath(path)
        if self._real_root != "/" and real != self._real_root:
            if os.path.commonpath([real, self._real_root]) != self._real_root:
                return False
        return self.fs.exists(real)

    def listdir(self, path: str, *, required: bool = True) -> list[str]:
        real = self.inside(path)
        return [] if real is None else super().listdir(real, required=required)
