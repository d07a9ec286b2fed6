"""Which NLDEV commands and SYS_GET attributes the running kernel has, asked of it.

Never guessed from the kernel version (distribution kernels carry features back, and leave
others out): each command is sent, in a form that can neither change anything nor be mistaken.

- A kernel answers a command it does not have with EINVAL before it looks at the request
  (netlink.c rdma_nl_rcv_msg: an op beyond its RDMA_NLDEV_NUM_OPS, or without callbacks),
  as it answers many a malformed request. So each read is asked about something that exists
  (the first device, its first port) or by an id no object has, which the command's handler
  answers with ENOENT (restrack rdma_restrack_get_byid).
- Commands that need CAP_NET_ADMIN are sent without attributes through a socket whose opener
  lacked CAP_NET_ADMIN: the kernel checks that capability only for a command it has, and
  before its handler runs (rdma_nl_rcv_msg again), so EPERM means "has it" and nothing is ever
  done. netlink_capable() asks about the socket's opener as well as the sender
  (net/netlink/af_netlink.c __netlink_ns_capable): as root, a child process that dropped to
  nobody opens that socket.
- SYS_GET reports the settings the kernel has (nldev.c nldev_sys_get_doit): an attribute it
  leaves out is one it does not have.

EOPNOTSUPP reads as EINVAL does: handlers answer it for what the kernel or driver does not do.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
from collections.abc import Callable, Mapping
from typing import Any

from ibtool.errors import IbtoolError
from ibtool.model.records import NetlinkFeature
from ibtool.sources.netlink import attrs as A

NOBODY = 65534
NO_SUCH_ID = 0xFFFFFFFF  # restrack ids of QPs are 24-bit QPNs; others count up from 0
RDMA_NODE_IB_SWITCH = 2  # a switch's only port is port 0 (rdma_start_port)
CAP_NET_ADMIN = 12

# Commands asked about something that exists: the first device (and its first port).
DEVICE_READS = (
    A.RDMA_NLDEV_CMD_PORT_GET,
    A.RDMA_NLDEV_CMD_RES_QP_GET,
    A.RDMA_NLDEV_CMD_RES_CM_ID_GET,
    A.RDMA_NLDEV_CMD_RES_CQ_GET,
    A.RDMA_NLDEV_CMD_RES_MR_GET,
    A.RDMA_NLDEV_CMD_RES_PD_GET,
    A.RDMA_NLDEV_CMD_STAT_GET,
    A.RDMA_NLDEV_CMD_RES_CTX_GET,
    A.RDMA_NLDEV_CMD_RES_SRQ_GET,
    A.RDMA_NLDEV_CMD_STAT_GET_STATUS,
)
# RDMA_NL_ADMIN_PERM commands (nldev.c nldev_cb_table).
ADMIN_COMMANDS = (
    A.RDMA_NLDEV_CMD_NEWLINK,
    A.RDMA_NLDEV_CMD_DELLINK,
    A.RDMA_NLDEV_CMD_SYS_SET,
    A.RDMA_NLDEV_CMD_STAT_SET,
    A.RDMA_NLDEV_CMD_STAT_DEL,
    A.RDMA_NLDEV_CMD_RES_QP_GET_RAW,
    A.RDMA_NLDEV_CMD_RES_CQ_GET_RAW,
    A.RDMA_NLDEV_CMD_RES_MR_GET_RAW,
    A.RDMA_NLDEV_CMD_RES_SRQ_GET_RAW,
    A.RDMA_NLDEV_CMD_NEWDEV,
    A.RDMA_NLDEV_CMD_DELDEV,
)
COMMANDS = sorted(
    (A.RDMA_NLDEV_CMD_GET, A.RDMA_NLDEV_CMD_SYS_GET, A.RDMA_NLDEV_CMD_RES_GET)
    + DEVICE_READS
    + ADMIN_COMMANDS
)
SYS_ATTRIBUTES = tuple(A.SYS_ATTRIBUTE_SINCE)
NOTES = {
    "RDMA_NLDEV_SYS_ATTR_MONITOR_MODE": "RDMA_NLDEV_CMD_MONITOR events on RDMA_NL_GROUP_NOTIFY",
}
_MISSING = (errno.EINVAL, errno.EOPNOTSUPP)


def key(name: str) -> str:
    """RDMA_NLDEV_CMD_RES_CTX_GET -> res-ctx-get; RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK ->
    copy-on-fork."""
    for prefix in ("RDMA_NLDEV_CMD_", "RDMA_NLDEV_SYS_ATTR_"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name.lower().replace("_", "-")


def _feature(
    name: str, supported: bool | None, note: str | None = None, *, since: str | None
) -> NetlinkFeature:
    return NetlinkFeature(key(name), name, supported, since, note or NOTES.get(name))


def _asked(call: Callable[[], Any]) -> tuple[bool | None, str | None]:
    """(has it, why unknown) from one request: answered, or refused by the command's own
    handler (ENOENT: no such object) or permission check (EPERM), means it has it."""
    try:
        call()
    except IbtoolError as e:
        if e.errno in _MISSING:
            return False, None
        if e.errno in (errno.ENOENT, errno.EPERM):
            return True, None
        return None, f"not probed: {e.message}"
    return True, None


# -- the socket for the commands that need CAP_NET_ADMIN -------------------------------------------


def has_cap_net_admin() -> bool:
    """Whether this process holds CAP_NET_ADMIN (effective), which the kernel would honour."""
    try:
        with open("/proc/self/status") as f:
            caps = next(line for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caps.split()[1], 16) >> CAP_NET_ADMIN & 1)


def unprivileged_socket(timeout: float = 5.0) -> socket.socket:
    """A NETLINK_RDMA socket opened by a child process that dropped to nobody: the kernel
    refuses it every command that needs CAP_NET_ADMIN, whoever sends on it."""
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
    except OSError as e:
        raise IbtoolError(f"cannot start an unprivileged child: {e.strerror or e}") from e
    if pid == 0:
        code = 1
        try:
            ours.close()
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, A.NETLINK_RDMA)
            socket.send_fds(theirs, [b"s"], [sock.fileno()])
            code = 0
        finally:
            os._exit(code)  # never back into the caller's code, nor its buffers flushed twice
    theirs.close()
    try:
        ours.settimeout(timeout)
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    except OSError as e:
        os.kill(pid, signal.SIGKILL)  # stuck (or gone: then this is a no-op on its zombie)
        raise IbtoolError(f"no socket from the unprivileged child: {e.strerror or e}") from e
    finally:
        ours.close()
        os.waitpid(pid, 0)
    if not fds:
        raise IbtoolError("the unprivileged child could not drop to nobody or open a socket")
    return socket.socket(fileno=fds[0])


def admin_client(nl):
    """A client whose requests the kernel treats as unprivileged: `nl` itself when this
    process lacks CAP_NET_ADMIN."""
    if not has_cap_net_admin():
        return nl
    from ibtool.sources.netlink.client import NldevClient, with_acks

    return NldevClient(sock=with_acks(unprivileged_socket()))


# -- the probes --------------------------------------------------------------------------------


def _first_port(device: Mapping[str, Any]) -> int:
    switch = device.get("RDMA_NLDEV_ATTR_DEV_NODE_TYPE") == RDMA_NODE_IB_SWITCH
    return 0 if switch else 1


def _device_read(nl, command: int, device: Mapping[str, Any]) -> Callable[[], Any]:
    index = device["RDMA_NLDEV_ATTR_DEV_INDEX"]
    port = _first_port(device)
    at = {"RDMA_NLDEV_ATTR_DEV_INDEX": index}
    on_port = {**at, "RDMA_NLDEV_ATTR_PORT_INDEX": port}
    if command == A.RDMA_NLDEV_CMD_PORT_GET:
        return lambda: nl.ports(index)
    if command == A.RDMA_NLDEV_CMD_STAT_GET:
        # The port's QP counter mode, or else its driver counters: 5.10 answers the mode of an
        # rxe port with EINVAL (measured on Debian 11's 5.10.223) yet has STAT_GET and answers
        # the counters (nldev.c stat_get_doit_default_counter).
        qp_mode = {**on_port, "RDMA_NLDEV_ATTR_STAT_RES": A.BY_NAME["RDMA_NLDEV_ATTR_RES_QP"].id}

        def stat_get():
            try:
                return nl.request(command, qp_mode)
            except IbtoolError as e:
                if e.errno not in _MISSING:
                    raise
                return nl.hw_counters(index, port)

        return stat_get
    kind = next(k for k, c in A.RESOURCE_COMMANDS.items() if c == command)
    # QPs and CM IDs are asked for on a port, the others on the device (nldev.c
    # res_get_common_doit refuses the other way round).
    where = on_port if kind in ("qp", "cm_id") else at
    return lambda: nl.request(command, {**where, A.RESOURCE_IDS[kind]: NO_SUCH_ID})


def _counter_status(nl, devices) -> tuple[bool | None, str | None]:
    """STAT_GET_STATUS answers EINVAL for a port without driver counters, as a kernel without
    the command does: asked on the first port with counters (STAT_GET answers for it)."""
    for device in devices:
        where = (device["RDMA_NLDEV_ATTR_DEV_INDEX"], _first_port(device))
        found, why = _asked(lambda where=where: nl.hw_counter_status(*where))
        if found is not False:
            return found, why
        has_counters, _ = _asked(lambda where=where: nl.hw_counters(*where))
        if has_counters:
            return False, None
    return None, "not probed: no device with driver counters on its first port"


def probe(
    nl, system: Mapping[str, Any], admin: Callable[[Any], Any] = admin_client
) -> list[NetlinkFeature]:
    """Every feature, in command order and then SYS_GET's attributes. `system` is SYS_GET's
    reply; `admin(nl)` gives the client for the CAP_NET_ADMIN commands."""
    answers: dict[int, tuple[bool | None, str | None]] = {A.RDMA_NLDEV_CMD_SYS_GET: (True, None)}
    devices: list[Mapping[str, Any]] = []

    def list_devices() -> None:
        devices.extend(d for d in nl.devices() if "RDMA_NLDEV_ATTR_DEV_INDEX" in d)

    answers[A.RDMA_NLDEV_CMD_GET] = _asked(list_devices)
    answers[A.RDMA_NLDEV_CMD_RES_GET] = _asked(nl.resource_summaries)
    for command in DEVICE_READS:
        if not devices:
            answers[command] = (None, "not probed: no RDMA device to ask about")
        elif command == A.RDMA_NLDEV_CMD_STAT_GET_STATUS:
            answers[command] = _counter_status(nl, devices)
        else:
            answers[command] = _asked(_device_read(nl, command, devices[0]))
    answers.update(_admin_answers(nl, admin))
    features = [
        _feature(A.COMMANDS[c], *answers[c], since=A.COMMAND_SINCE.get(c)) for c in COMMANDS
    ]
    features += [
        _feature(name, name in system, since=A.SYS_ATTRIBUTE_SINCE[name]) for name in SYS_ATTRIBUTES
    ]
    return features


def _admin_answers(nl, admin) -> dict[int, tuple[bool | None, str | None]]:
    try:
        unprivileged = admin(nl)
    except IbtoolError as e:
        why = f"not probed: no socket without CAP_NET_ADMIN to ask on ({e.message})"
        return dict.fromkeys(ADMIN_COMMANDS, (None, why))
    try:
        # No attributes: however the kernel answered, no handler could act on it.
        return {c: _asked(lambda c=c: unprivileged.request(c)) for c in ADMIN_COMMANDS}
    finally:
        if unprivileged is not nl:
            unprivileged.close()
