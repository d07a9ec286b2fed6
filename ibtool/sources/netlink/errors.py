"""What RDMA netlink failures mean, as ibtool errors with a hint."""

from __future__ import annotations

import errno
import os

from ibtool.errors import DataError, IbtoolError, PermissionDeniedError, UnsupportedError
from ibtool.sources.netlink import attrs as A

NO_RDMA_HINT = (
    "the kernel has no RDMA subsystem, or ib_core is not loaded: load the adapter's driver "
    "(e.g. modprobe mlx5_ib) or rdma_rxe; in a container the host's kernel decides"
)
# Hints for failures whose cause the kernel source makes certain.
KNOWN_FAILURES = {
    (A.RDMA_NLDEV_CMD_SYS_SET, errno.EBUSY): (
        "the netns mode can change only while no network namespace but the initial one exists"
    ),
}
MALFORMED_HINT = "the kernel sent a reply ibtool cannot read; run with --debug and report it"


def malformed(what: str) -> DataError:
    return DataError(f"malformed RDMA netlink reply: {what}", MALFORMED_HINT)


def socket_error(e: OSError) -> IbtoolError:
    """What socket(AF_NETLINK, SOCK_RAW, NETLINK_RDMA) failing means."""
    if e.errno == errno.EPROTONOSUPPORT:
        return UnsupportedError("no RDMA netlink in this kernel", NO_RDMA_HINT, errno=e.errno)
    if e.errno in (errno.EPERM, errno.EACCES):
        return PermissionDeniedError(
            f"cannot open an RDMA netlink socket: {e.strerror}",
            "a seccomp or LSM policy forbids netlink sockets here",
            errno=e.errno,
        )
    return IbtoolError(f"cannot open an RDMA netlink socket: {e.strerror}", errno=e.errno)


def not_in_kernel(
    name: str,
    since: str | None = None,
    serves: str | None = None,
    hint: str | None = None,
    *,
    errno: int | None = None,
) -> UnsupportedError:
    """The one line for a kernel without an NLDEV command or attribute, named as the uapi names
    it: "this kernel has no RDMA_NLDEV_CMD_RES_CTX_GET (contexts are listed from Linux 5.13)".
    `serves` says what it is for; `since` is its first mainline release."""
    if since and serves:
        said = f" ({serves} from Linux {since})"
    elif since:
        said = f" (Linux {since} and later)"
    else:
        said = ""
    return UnsupportedError(f"this kernel has no {name}{said}", hint, errno=errno)


def missing_command(
    command: int, serves: str | None = None, hint: str | None = None, *, errno: int | None = None
) -> UnsupportedError:
    name = A.COMMANDS.get(command, f"NLDEV command {command}")
    return not_in_kernel(name, A.COMMAND_SINCE.get(command), serves, hint, errno=errno)


def kernel_error(
    command: int, code: int, detail: str | None = None, *, with_attributes: bool = False
) -> IbtoolError:
    """An NLMSG_ERROR (or a failed dump's NLMSG_DONE) as the ibtool error it means.

    A kernel without the command answers EINVAL (EOPNOTSUPP where a driver lacks it); but
    EINVAL is also its answer to a request naming a device or port that does not exist, so
    only a request without attributes is certain to mean "unsupported".
    """
    name = A.COMMANDS.get(command, f"NLDEV command {command}")
    said = f" (kernel: {detail})" if detail else ""
    if code == errno.EPERM:
        purpose = A.ADMIN_PURPOSE.get(command, "this request")
        return PermissionDeniedError(
            f"{name} needs CAP_NET_ADMIN{said}",
            f"the kernel asks for CAP_NET_ADMIN for {purpose}: run as root",
            errno=code,
        )
    if code in (errno.EOPNOTSUPP, errno.EINVAL):
        since = A.COMMAND_SINCE.get(command)
        missing = f"{name} (Linux {since} and later)" if since else name
        if code == errno.EINVAL and with_attributes:
            return UnsupportedError(
                f"the kernel rejected {name}: {os.strerror(code)}{said}",
                f"a kernel without {missing} answers so, as does any kernel asked about "
                "a device or port that does not exist (any more)",
                errno=code,
            )
        return UnsupportedError(
            f"this kernel does not support {name}: {os.strerror(code)}{said}",
            f"it needs a kernel (or driver) with {missing}",
            errno=code,
        )
    return IbtoolError(
        f"{name} failed: {os.strerror(code)}{said}", KNOWN_FAILURES.get((command, code)), errno=code
    )
