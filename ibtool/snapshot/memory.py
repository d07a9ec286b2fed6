"""A snapshot's sysfs tree read from memory: the files layer (ibtool.sources.sysfs.fs) over a
checked Tree, answering every read, listing and lookup as the kernel would answer them for the
same tree built on disk, without building it. Nothing is written, so nothing can be left
behind, whatever ends the replay.

Paths are absolute, under `root` (the snapshot file's own absolute path: a warning names
"/tmp/node7.json.gz/sys/class/net/bond0/bonding/mode", and no file can lie under a regular
file on disk). What is not under `root` is not there (ENOENT).

Lookups follow the kernel's path walk (fs/namei.c): a link met before the last component is
always followed, the last one where the call follows links (stat, open, opendir; not lstat,
readlink); a missing component is ENOENT, a file used as a directory ENOTDIR, more than 40
links in one lookup ELOOP (Tree refuses such snapshots before they get here). A file the
saving host could not read is an empty directory, as Tree.build makes it: reading it is
EISDIR. Listings come in the order entries were saved, as tmpfs lists a tree made in that
order.
"""

from __future__ import annotations

import errno
import os

from ibtool.snapshot.tree import DIR, FILE, LINK, MAXSYMLINKS, Tree


def _error(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


class _Entry:
    """What os.scandir yields, for one entry of a listed directory: is_dir() follows a link,
    and raises what stat(2) would but ENOENT (os.DirEntry's)."""

    __slots__ = ("name", "path", "_files", "_where")

    def __init__(self, name: str, path: str, files: Memory, where: str):
        self.name = name
        self.path = path
        self._files = files
        self._where = where  # the entry as the tree names it

    def is_symlink(self) -> bool:
        return self._files._kind[self._where] == LINK

    def is_dir(self) -> bool:
        files = self._files
        where = self._where
        if files._kind[where] == LINK:
            try:
                where = files._target(where, 0)
            except _Lookup as e:
                if e.code == errno.ENOENT:
                    return False
                raise _error(e.code, self.path) from None
        return files._kind[where] == DIR


class Memory:
    """The files of `tree`, as if it were built at `root`."""

    def __init__(self, tree: Tree, root: str):
        self.tree = tree
        self.root = root
        self._prefix = root.rstrip("/") + "/"
        self._kind = tree.kind
        self._dirs: dict[str, str] = {"": ""}  # a directory as named -> where it is
        self._named: dict[str, str] = {}  # the same, by its whole path
        self._links: dict[str, str | int] = {}  # a link -> where it leads, or the errno
        self._inodes: dict[str, int] | None = None

    # -- lookups -----------------------------------------------------------------------------

    def _rel(self, path: str) -> str:
        """`path` as the tree names it ("" its root); ENOENT outside the tree."""
        if path.startswith(self._prefix):
            return path[len(self._prefix) :]
        if path == self.root or path + "/" == self._prefix:
            return ""
        raise _error(errno.ENOENT, path)

    def _lookup(self, path: str, follow: bool) -> str:
        if path == self.root:
            return ""
        whole, _, name = path.rpartition("/")
        where = self._named.get(whole)
        try:
            if where is None:
                parent = self._rel(path).rpartition("/")[0]
                where = self._named[whole] = self._dir(parent)
            return self._step(where, name, follow, 0)
        except _Lookup as e:
            raise _error(e.code, path) from None

    def _dir(self, rel: str) -> str:
        """The directory `rel` names (links followed), where the tree has it."""
        found = self._dirs.get(rel)
        if found is None:
            parent, _, name = rel.rpartition("/")
            found = self._step(self._dir(parent), name, True, 0)
            if self._kind[found] != DIR:
                raise _Lookup(errno.ENOTDIR)
            self._dirs[rel] = found
        return found

    def _step(self, where: str, name: str, follow: bool, hops: int) -> str:
        """The entry `name` of directory `where` (a tree path)."""
        if name == "" or name == ".":
            return where
        if name == "..":
            if not where:
                raise _Lookup(errno.ENOENT)  # above the tree: nothing of the snapshot's
            return where.rpartition("/")[0]
        path = f"{where}/{name}" if where else name
        kind = self._kind.get(path)
        if kind is None:
            raise _Lookup(errno.ENOENT)
        if kind == LINK and follow:
            return self._target(path, hops)
        return path

    def _target(self, link: str, hops: int) -> str:
        """Where a link leads (every link on the way followed)."""
        found = self._links.get(link)
        if found is None:
            if hops >= MAXSYMLINKS:
                raise _Lookup(errno.ELOOP)
            try:
                found = self._walk(link.rpartition("/")[0], str(self.tree.content[link]), hops + 1)
            except _Lookup as e:
                found = e.code
            self._links[link] = found
        if isinstance(found, int):
            raise _Lookup(found)
        return found

    def _walk(self, where: str, target: str, hops: int) -> str:
        for name in target.split("/"):
            if self._kind[where] != DIR:
                raise _Lookup(errno.ENOTDIR)
            where = self._step(where, name, True, hops)
        return where

    # -- the layer ---------------------------------------------------------------------------

    def _file(self, path: str, follow: bool) -> str | bytes:
        """The content of the file `path` names; the error open(2) and read(2) would give."""
        found = self._lookup(path, follow)
        kind = self._kind[found]
        if kind == FILE:
            return self.tree.content[found]
        if kind == LINK:  # O_NOFOLLOW
            raise _error(errno.ELOOP, path)
        # A directory opens; reading it is EISDIR, and without following, it is not regular.
        raise _error(errno.EISDIR if follow else errno.EINVAL, path)

    def read(self, path: str, size: int, follow: bool = True) -> bytes:
        data = self._file(path, follow)
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        return data[:size]

    def text(self, path: str, size: int) -> str:
        data = self._file(path, True)
        if isinstance(data, str) and data.isascii():
            return data[:size]  # its bytes are its characters
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        return data[:size].decode("utf-8", "surrogateescape")

    def texts(self, directory: str, names: list[str], size: int) -> list[str | OSError]:
        out: list[str | OSError] = []
        for name in names:
            try:
                out.append(self.text(f"{directory}/{name}", size))
            except OSError as e:
                out.append(e)
        return out

    def listdir(self, path: str) -> list[str]:
        found = self._lookup(path, True)
        if self._kind[found] != DIR:
            raise _error(errno.ENOTDIR, path)
        return list(self.tree.children[found])

    def scandir(self, path: str) -> list[_Entry]:
        where = self._lookup(path, True)
        if self._kind[where] != DIR:
            raise _error(errno.ENOTDIR, path)
        base = path.rstrip("/")
        prefix = f"{where}/" if where else ""
        names = self.tree.children[where]
        return [_Entry(name, f"{base}/{name}", self, prefix + name) for name in names]

    def readlink(self, path: str) -> str:
        found = self._lookup(path, False)
        if self._kind[found] != LINK:
            raise _error(errno.EINVAL, path)
        return str(self.tree.content[found])

    def inode(self, path: str) -> int:
        found = self._lookup(path, True)
        if self._inodes is None:
            self._inodes = {p: n for n, p in enumerate(self._kind, 2)}  # 1: none, as on disk
        return self._inodes[found]

    def _kind_of(self, path: str, follow: bool) -> str | None:
        try:
            return self._kind[self._lookup(path, follow)]
        except OSError:
            return None

    def islink(self, path: str) -> bool:
        return self._kind_of(path, False) == LINK

    def lexists(self, path: str) -> bool:
        return self._kind_of(path, False) is not None

    def exists(self, path: str) -> bool:
        return self._kind_of(path, True) is not None

    def isdir(self, path: str) -> bool:
        return self._kind_of(path, True) == DIR

    def realpath(self, path: str) -> str:
        """os.path.realpath's answer (not strict): links resolved as far as they lead, what
        is missing kept as named."""
        try:
            rel = self._rel(path)
        except OSError:
            return os.path.normpath(path)
        resolved, outside = self._real([], rel, {})
        if outside is not None:
            return outside
        return self._prefix + "/".join(resolved) if resolved else self.root

    def _real(self, path: list[str], rest: str, seen: dict) -> tuple[list[str], str | None]:
        """posixpath._joinrealpath over the tree: `path` resolved, `rest` to go. The second
        value is the answer when a '..' climbs above the tree (never from a checked link)."""
        names = rest.split("/")
        for i, name in enumerate(names):
            if not name or name == ".":
                continue
            if name == "..":
                if not path:
                    above = os.path.dirname(self.root.rstrip("/"))
                    return path, os.path.normpath(os.path.join(above, *names[i + 1 :]))
                path = path[:-1]
                continue
            new = [*path, name]
            key = "/".join(new)
            if self._kind.get(key) != LINK:
                path = new
                continue
            if key in seen:
                if seen[key] is not None:
                    path = seen[key]
                    continue
                return [*new, *names[i + 1 :]], None  # a loop: what is left kept as named
            seen[key] = None
            path, outside = self._real(path, str(self.tree.content[key]), seen)
            if outside is not None:
                return path, outside
            seen[key] = path
        return path, None


class _Lookup(Exception):
    def __init__(self, code: int):
        super().__init__(code)
        self.code = code
