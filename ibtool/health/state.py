"""The health check's memory between runs: one JSON file, one lock, written atomically.

Cron may start a run while the last one still waits on a slow device: the lock (flock on a
file beside the state) makes the second wait, then give up with UNKNOWN, rather than both
reading the same baseline and writing over each other. The state is replaced by rename, so a
run killed half-way leaves the previous file whole. What each check kept is stored with the
kernel's boot id and the time, so the next run can tell a baseline from before a reboot.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import field
from typing import Any

from ibtool.errors import IbtoolError, PermissionDeniedError
from ibtool.health import files
from ibtool.model.deferred import dataclass

FORMAT = "ibtool-health-state"
VERSION = 1


class StateLocked(IbtoolError):
    """Another run holds the state file's lock past the wait."""


def default_path(env=os.environ, name: str = "health.json") -> str:
    """/var/lib/ibtool/health.json for root; $XDG_STATE_HOME/ibtool/health.json (or
    ~/.local/state/...) for anyone else, who cannot write /var/lib. `name`: another file of
    the same directory (`ibtool fabric errors` keeps fabric.json)."""
    if os.geteuid() == 0:
        return f"/var/lib/ibtool/{name}"
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "ibtool", name)


def boot_id(root: str, fs: Any) -> str | None:
    """The kernel's random boot id (new at every boot), as the host under `root` has it, read
    from `fs` (the Host's: ibtool.sources.sysfs.fs)."""
    # Under --root the file is a capture's: a FIFO planted there must not hang the run, nor a
    # link make it read another file; either is an unknown boot id. The kernel's is 36
    # characters (a UUID, drivers/char/random.c).
    path = os.path.join(root, "proc/sys/kernel/random/boot_id")
    try:
        data = fs.read(path, 128, follow=root == "/")
    except OSError:
        return None
    return data.decode("ascii", "replace").strip() or None


@dataclass
class Saved:
    """What the state file held: per check, (what it kept, boot id, time)."""

    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    problem: str | None = None  # why an existing file was not usable

    def of(self, check: str) -> tuple[Any, str | None, float | None]:
        entry = self.checks.get(check)
        if not isinstance(entry, dict):
            return None, None, None
        return entry.get("data"), entry.get("boot_id"), entry.get("time")


class Kept:
    """The state of a long-running process (the dashboard, the exporter), kept in memory between
    its polls, with StateFile's interface: a state that is never contended and never lost
    between two polls."""

    def __init__(self) -> None:
        self.saved = Saved()

    @contextlib.contextmanager
    def locked(self, wait: float) -> Iterator[None]:
        yield

    def load(self) -> Saved:
        return self.saved

    def save(self, checks: dict[str, dict[str, Any]]) -> None:
        self.saved = Saved(checks)


class StateFile:
    def __init__(self, path: str, owner: str = "ibtool health"):
        self.path = path
        self.owner = owner  # who keeps it, as messages name it

    @contextlib.contextmanager
    def locked(self, wait: float, clock=time.monotonic, sleep=time.sleep) -> Iterator[None]:
        """Holds PATH.lock (created if need be) for the run; waits up to `wait` seconds for
        another run to finish, then raises StateLocked."""
        directory = os.path.dirname(self.path) or "."
        lock = self.path + ".lock"
        # Refused before the lock is made beside it: `--state /dev/null` would otherwise create
        # /dev/null.lock, and the save rename a regular file over the device. load() checks
        # again on what it opens.
        try:
            what = files.kind(os.stat(self.path).st_mode)
        except OSError:
            what = None  # missing (the first run), or the error is load()'s to tell
        if what is not None:
            raise _not_regular(self.path, what)
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            # Not through a link: root's cron would otherwise create (or truncate the mode of)
            # whatever a dangling health.json.lock symlink points at. O_NOFOLLOW makes the
            # open fail with ELOOP on a symlink (open(2)); O_NONBLOCK keeps a FIFO planted
            # there from hanging the open, and anything but a regular file is refused.
            fd = os.open(
                lock,
                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                0o644,
            )
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _not_a_file(lock, "a symbolic link") from None
            raise _os_error(e, lock) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise _not_a_file(lock, "not a regular file")
        try:
            deadline = clock() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES):
                        raise _os_error(e, lock) from None
                    if clock() >= deadline:
                        raise StateLocked(
                            f"state {self.path} is locked by another {self.owner} run "
                            f"(waited {wait:g} s)",
                            "a run still going: is a device slow to answer? see --lock-wait",
                        ) from None
                    sleep(0.05)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def load(self) -> Saved:
        """The saved state; an empty one for a missing file, and with `problem` set for a file
        that is not a state file (it is then replaced, not trusted)."""
        try:
            raw = files.read(self.path, files.STATE_MAX)
        except FileNotFoundError:
            return Saved()
        except files.NotAFile as e:
            # Not replaced: a FIFO, a device or a file that size is not one ibtool wrote.
            raise _not_regular(self.path, e.what) from None
        except OSError as e:
            raise _os_error(e, self.path) from None
        try:
            data = json.loads(raw)
        except ValueError:
            return Saved(problem=f"state {self.path} is not JSON: starting a new baseline")
        except RecursionError:  # json's decoder recurses once per nested array or object
            return Saved(
                problem=f"state {self.path} is not JSON (nested too deeply): "
                "starting a new baseline"
            )
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return Saved(problem=f"state {self.path} is not an {self.owner} state: replaced")
        if data.get("version") != VERSION or not isinstance(data.get("checks"), dict):
            return Saved(problem=f"state {self.path} has another format version: replaced")
        return Saved(data["checks"])

    def save(self, checks: dict[str, dict[str, Any]]) -> None:
        """Replaces the file with `checks` at once: a temporary file in the same directory,
        flushed to disk, renamed over it."""
        directory = os.path.dirname(self.path) or "."
        data = {"format": FORMAT, "version": VERSION, "checks": checks}
        try:
            fd, tmp = tempfile.mkstemp(prefix=".health.", suffix=".tmp", dir=directory)
        except OSError as e:
            raise _os_error(e, self.path) from None
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, separators=(",", ":"), sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(e, OSError):
                raise _os_error(e, self.path) from None
            raise
        with contextlib.suppress(OSError):
            dirfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dirfd)
            finally:
                os.close(dirfd)


def _not_a_file(path: str, what: str) -> IbtoolError:
    return IbtoolError(
        f"state lock {path} is {what}: refused",
        "remove it (ibtool creates the lock as a regular file), or give another --state FILE",
    )


def _not_regular(path: str, what: str) -> IbtoolError:
    if what.startswith("larger"):
        hint = "not a state ibtool wrote: remove it, or give another --state FILE"
    else:
        hint = "give a regular file (ibtool writes it) with --state FILE, or --no-state"
    return IbtoolError(f"state {path}: {what}", hint)


def _os_error(e: OSError, path: str) -> IbtoolError:
    hint = "give another with --state FILE, or --no-state"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return PermissionDeniedError(f"state {path}: {e.strerror}", hint)
    return IbtoolError(f"state {path}: {e.strerror}", hint)
