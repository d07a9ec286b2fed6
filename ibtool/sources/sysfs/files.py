"""The files of a sysfs tree read, parsed and warned about: the base of the sysfs readers.

Every value that cannot be read or parsed becomes None plus one warning naming the file, once per
file (relative to class/infiniband where it is under it); one bad file never hides the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ibtool.sources.sysfs.fs import DISK
from ibtool.sources.sysfs.values import Invalid, printable, quoted

Warn = Callable[[str], None]


def read_attr(path: str, fs=DISK) -> str:
    # A sysfs attribute is at most one page: one read() on a raw fd, about three times
    # cheaper than a buffered text file (it matters for 10^4 GID files on SR-IOV hosts).
    return fs.text(path, 8192).rstrip("\n")


class SysfsFiles:
    """A sysfs tree rooted at `root` (the live host's /, a sosreport, a captured tree), read
    from `fs` (the disk, or a snapshot's tree in memory)."""

    def __init__(
        self,
        root: str = "/",
        warn: Warn | None = None,
        *,
        origin: str | None = None,
        fs=DISK,
    ) -> None:
        self.root = root
        self.fs = fs
        self.class_dir = os.path.join(root, "sys", "class", "infiniband")
        # What the "no RDMA devices" errors name: the directory, or what it was read from
        # (a snapshot's tree, whose root is the file's own path).
        self.origin = origin
        self.warn: Warn = warn or (lambda message: None)
        # The files warned about: one warning per file, however often it is read.
        self.warned: set[str] = set()
        self._vlans: dict[str, tuple[int, str]] | None = None
        self._drivers: dict[str, str | None] = {}

    # -- raw reads ---------------------------------------------------------------------------

    def _rel(self, path: str) -> str:
        return os.path.relpath(path, self.class_dir) if path.startswith(self.class_dir) else path

    def bad(self, path: str, problem: str) -> None:
        """Warn about a file: 'DEV/ports/1/state: PROBLEM', the first time only."""
        rel = self._rel(path)
        if rel not in self.warned:
            self.warned.add(rel)
            self.warn(f"{rel}: {problem}")

    def read(self, path: str, *, required: bool = True, quiet: bool = False) -> str | None:
        """File content without the trailing newline; None (and a warning) when unreadable.

        Absent files are silent unless `required`: many attributes exist only on some drivers.
        `quiet`: a read the kernel fails on purpose (gid_attrs of empty or InfiniBand GID
        slots: EINVAL). A dangling link is never what the kernel shows: always warned about.
        """
        try:
            return read_attr(path, self.fs)
        except OSError as e:
            return self.unread(path, e, required=required, quiet=quiet)

    def unread(self, path: str, e: OSError, *, required: bool = True, quiet: bool = False) -> None:
        """What read() says of a file it could not read (None, and the warning)."""
        if isinstance(e, FileNotFoundError):
            if self.fs.islink(path):
                self.bad(path, "dangling link")
            elif required:
                self.bad(path, "missing")
        elif not quiet:
            self.bad(path, f"cannot read: {e.strerror or e}")
        return None

    def read_each(self, directory: str, names: list[str]) -> list[str | OSError]:
        """The files `names` of `directory` read as read() reads one (their text, without the
        trailing newline), through one descriptor of the directory: the error of one that
        could not be read in its place, for unread() to say in the order the caller reads."""
        return [
            t if isinstance(t, OSError) else t.rstrip("\n")
            for t in self.fs.texts(directory, names, 8192)
        ]

    def parse(self, path: str, text: str, parse: Callable):
        """parse(text), or None and a warning naming the file."""
        try:
            return parse(text)
        except Invalid as e:
            self.bad(path, str(e))
        except (ValueError, IndexError):
            self.bad(path, f"malformed value {quoted(text)}")
        return None

    def parsed(self, path: str, parse: Callable, *, required: bool = True):
        text = self.read(path, required=required)
        if text is None:
            return None
        return self.parse(path, text, parse)

    def text(self, path: str, *, empty: str | None = None) -> str | None:
        """A driver's free-text attribute (fw_ver, hca_type, board_id, ...): absent is silent, an
        empty line (rxe's fw_ver) is `empty`, text that is not one printable line is warned
        about."""
        text = self.read(path, required=False)
        if not text:
            return empty if text == "" else None
        if not printable(text):
            self.bad(path, f"malformed value {quoted(text)}")
            return None
        return text

    def listdir(self, path: str, *, required: bool = True) -> list[str]:
        try:
            return self.fs.listdir(path)
        except FileNotFoundError:
            if self.fs.islink(path):
                self.bad(path, "dangling link")
            elif required:
                self.bad(path, "missing")
        except OSError as e:
            self.bad(path, f"cannot list: {e.strerror or e}")
        return []
