"""A NETLINK_ROUTE socket's stand-in for the tests of ibtool.sources.rtnetlink's readers (DCB,
VLAN links): each request sent is answered with `reads(seq)`, one recvmsg per bytes object,
then a timeout as the kernel's silence would give."""

from __future__ import annotations

import socket
import struct
from typing import Callable


class RouteSocket:
    def __init__(self, reads: Callable[[int], list[bytes]]):
        self.reads = reads
        self.requests: list[bytes] = []
        self.queue: list[bytes] = []
        self.closed = False
        self.timeout: float | None = None

    def settimeout(self, timeout):
        self.timeout = timeout

    def send(self, data: bytes) -> int:
        self.requests.append(data)
        seq = struct.unpack_from("=I", data, 8)[0]  # struct nlmsghdr's nlmsg_seq
        self.queue = list(self.reads(seq))
        return len(data)

    def recvmsg(self, size):
        if not self.queue:
            raise socket.timeout()
        return self.queue.pop(0), [], 0, None

    def close(self):
        self.closed = True
