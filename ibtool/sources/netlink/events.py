"""RDMA monitor events: what the kernel multicasts on RDMA_NL_GROUP_NOTIFY (Linux 6.12 and later).

The kernel sends one RDMA_NLDEV_CMD_MONITOR message per event, unasked (sequence number 0),
to every socket bound to the group:

    REGISTER, UNREGISTER, RENAME   DEV_INDEX, DEV_NAME (the new name for RENAME), EVENT_TYPE
    NETDEV_ATTACH, NETDEV_DETACH   DEV_INDEX, DEV_NAME, PORT_INDEX, [NDEV_INDEX, NDEV_NAME],
                                   EVENT_TYPE
    NETDEV_RENAME                  NDEV_INDEX, NDEV_NAME, EVENT_TYPE (no device: the kernel
                                   sends one per port the netdev serves)

(drivers/infiniband/core/nldev.c, rdma_nl_notify_event). RENAME and NETDEV_RENAME came in
6.13. Whether the kernel sends them at all is SYS_GET's MONITOR_MODE, which iproute2's
`rdma monitor` checks first: a kernel without events accepts the bind and stays silent.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING, Any

from ibtool.errors import EventsLost, IbtoolError, PermissionDeniedError
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import messages
from ibtool.sources.netlink.client import RECV_BUFFER, open_socket
from ibtool.sources.netlink.errors import malformed

if TYPE_CHECKING:
    from ibtool.model.events import Event, Seen

__all__ = ["EventListener", "EventsLost", "decode"]

RDMA_NL_GROUP_NOTIFY = 4  # uapi rdma_netlink.h: the group monitor events go to

MONITOR = A.nlmsg_type(A.RDMA_NLDEV_CMD_MONITOR)


def decode(data: bytes) -> list[dict[str, Any]]:
    """The monitor events in one datagram, as {uapi name: value}; other messages skipped.

    An event without EVENT_TYPE is malformed: without it nothing says what happened.
    """
    events = []
    for msg in messages.parse(data):
        if msg["header"]["type"] != MONITOR:
            continue
        event = messages.attributes(msg)
        if "RDMA_NLDEV_ATTR_EVENT_TYPE" not in event:
            raise malformed("a monitor event without RDMA_NLDEV_ATTR_EVENT_TYPE")
        events.append(event)
    return events


class EventListener:
    """A NETLINK_RDMA socket that has joined RDMA_NL_GROUP_NOTIFY.

    `sock` is for tests: anything with bind, recvmsg, setblocking, fileno and close.
    """

    def __init__(self, sock=None):
        self._sock = sock if sock is not None else open_socket()
        try:
            if sock is None:
                self._join()
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise

    def _join(self) -> None:
        try:
            self._sock.bind((0, 1 << (RDMA_NL_GROUP_NOTIFY - 1)))
        except OSError as e:
            if e.errno in (errno.EPERM, errno.EACCES):
                # The RDMA netlink family lets only CAP_NET_ADMIN join its groups.
                raise PermissionDeniedError(
                    "joining the RDMA monitor group needs CAP_NET_ADMIN",
                    "run as root",
                    errno=e.errno,
                ) from e
            raise IbtoolError(
                f"cannot join the RDMA monitor group: {e.strerror or e}", errno=e.errno
            ) from e

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self) -> list[dict[str, Any]]:
        """Every event waiting on the socket now ([] when none); EventsLost on an overrun."""
        events = []
        while True:
            try:
                data, _, flags, _ = self._sock.recvmsg(RECV_BUFFER)
            except BlockingIOError:
                return events
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    raise EventsLost(
                        "the kernel dropped RDMA monitor events (receive buffer full)",
                        errno=e.errno,
                    ) from e
                raise IbtoolError(f"RDMA monitor socket: {e.strerror or e}", errno=e.errno) from e
            if flags & socket.MSG_TRUNC:
                raise malformed(f"an event larger than {RECV_BUFFER} bytes")
            if not data:
                return events
            events.extend(decode(data))

    def events(self, last: Seen | None = None) -> list[Event]:
        """What read() has, as Events (`last`, the latest poll, names what the kernel leaves
        out: monitor.kernel_event); EventsLost on an overrun."""
        from ibtool.sources.netlink.monitor import kernel_event

        return [kernel_event(reply, last) for reply in self.read()]

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> EventListener:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
