"""Where the files under a root are read from: the disk (the running host's /, a --root tree), or
a snapshot's tree held in memory (ibtool.snapshot.memory). The readers of sysfs, /proc and
configfs ask one of these, never `os` itself, so a replay touches no disk.

Both answer as the kernel answers for a tree on disk: the same errors (OSError with its errno)
from the same lookups, links followed where os.* follows them.

- read(path, size, follow=True): at most `size` bytes of the file, with one read(2) of an fd
  opened O_RDONLY | O_NONBLOCK (a FIFO in a --root tree must not wait for a writer; sysfs
  ignores the flag); `follow=False` adds O_NOFOLLOW (ELOOP on a link) and refuses what is not
  a regular file (EINVAL). text(path, size): the same bytes decoded as UTF-8, a byte that is
  not as a lone surrogate (surrogateescape). texts(directory, names, size): text() of each
  name in the directory, or the OSError that one raised, in its place.
- listdir(path), scandir(path) (entries with .name, .path, is_dir(), is_symlink()),
  readlink(path), realpath(path) (os.path.realpath's, not strict), inode(path) (st_ino).
- islink, lexists, exists, isdir: as os.path's, False on any error.
"""

from __future__ import annotations

import errno
import os
import stat

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Disk:
    """The files on disk, through the system calls os.* makes."""

    listdir = staticmethod(os.listdir)
    readlink = staticmethod(os.readlink)
    realpath = staticmethod(os.path.realpath)
    islink = staticmethod(os.path.islink)
    lexists = staticmethod(os.path.lexists)
    exists = staticmethod(os.path.exists)
    isdir = staticmethod(os.path.isdir)

    @staticmethod
    def read(path: str, size: int, follow: bool = True, dir_fd: int | None = None) -> bytes:
        fd = os.open(path, _READ if follow else _READ | os.O_NOFOLLOW, dir_fd=dir_fd)
        try:
            if not follow and not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
            return os.read(fd, size)
        finally:
            os.close(fd)

    @staticmethod
    def text(path: str, size: int) -> str:
        return Disk.read(path, size).decode("utf-8", "surrogateescape")

    @staticmethod
    def texts(directory: str, names: list[str], size: int) -> list[str | OSError]:
        # Each file opened relative to the directory's descriptor (openat(2)): the kernel walks
        # one component, not the ten of a GID slot's path (0.7 us of 2.4 us per file).
        try:
            dir_fd = os.open(directory, _DIRECTORY)
        except OSError:
            dir_fd = None
        out: list[str | OSError] = []
        try:
            for name in names:
                where = name if dir_fd is not None else f"{directory}/{name}"
                try:
                    data = Disk.read(where, size, dir_fd=dir_fd)
                except OSError as e:
                    out.append(e)
                    continue
                out.append(data.decode("utf-8", "surrogateescape"))
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        return out

    @staticmethod
    def scandir(path: str) -> list:
        with os.scandir(path) as entries:
            return list(entries)

    @staticmethod
    def inode(path: str) -> int:
        return os.stat(path).st_ino


DISK = Disk()
