"""The IbtoolError family: a one-line message, a hint, and the exit code the CLI turns it into."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Process exit codes, documented in ibtool(8)."""

    OK = 0
    FAILED = 1  # the command ran and its answer is "no" (no usable GID, a failed test)
    USAGE = 2  # bad command line
    NO_DEVICES = 3  # no RDMA devices on this host (or under --root)
    NOT_FOUND = 4  # unknown device, port or object
    PERMISSION = 5  # the kernel refused: a capability or file permission is missing
    UNSUPPORTED = 6  # a library or kernel feature the command needs is missing
    DATA_ERROR = 7  # malformed input the command cannot work around
    INTERNAL = 70  # a bug in ibtool (EX_SOFTWARE, sysexits.h)
    IO_ERROR = 74  # standard output could not be written (EX_IOERR, sysexits.h)
    INTERRUPTED = 130  # Ctrl-C (SIGINT): 128 + 2, as a shell reports a process it killed
    TERMINATED = 143  # SIGTERM: 128 + 15


class IbtoolError(Exception):
    exit_code = ExitCode.FAILED

    def __init__(self, message: str, hint: str | None = None, *, errno: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.errno = errno


class UsageError(IbtoolError):
    exit_code = ExitCode.USAGE


class NoDevicesError(IbtoolError):
    exit_code = ExitCode.NO_DEVICES


class NotFoundError(IbtoolError):
    exit_code = ExitCode.NOT_FOUND


class PermissionDeniedError(IbtoolError):
    exit_code = ExitCode.PERMISSION


class NotLiveError(UsageError):
    """What needs the running kernel (netlink, verbs, a change) asked of a --root tree."""


class UnsupportedError(IbtoolError):
    exit_code = ExitCode.UNSUPPORTED


class DataError(IbtoolError):
    exit_code = ExitCode.DATA_ERROR


class EventsLost(IbtoolError):
    """A kernel event socket's receive buffer overflowed (ENOBUFS): the kernel dropped events,
    and what they said must be found by other means (a poll)."""


class CommandFailed(IbtoolError):
    """The command worked but the answer is negative; the exit code is FAILED."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that it unwinds like Ctrl-C (every QP, CQ, MR
    and PD destroyed on the way out); the exit code is TERMINATED, not INTERRUPTED."""


class OutputError(Exception):
    """Standard output cannot be written (no space left, closed, an I/O error); `broken_pipe`
    when its reader went away, which is a quiet exit.

    Not an IbtoolError: the handlers of a command's own errors must not take it for one."""

    def __init__(self, reason: str, *, broken_pipe: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.broken_pipe = broken_pipe
