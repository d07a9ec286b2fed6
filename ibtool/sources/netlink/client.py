"""NLDEV requests over a NETLINK_RDMA socket: a blocking client and an asyncio one.

Both drive the same sans-I/O Exchange (one request, the replies that answer it), so they only
differ in how they wait for the socket. pyroute2's own sockets are not used: its synchronous
NetlinkSocket runs a private event loop and fails inside a running one (the TUI's), and its
Marshal drops the kernel's extended-ack text from the capped acks NETLINK_CAP_ACK asks for
(their echoed request is cut to its header). A dump ends at NLMSG_DONE; a
single-object request asks for an ack (as iproute2 does) and ends at it, so no late ack is left
in the socket for the next request.
"""

from __future__ import annotations

import itertools
import socket
import struct
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ibtool.errors import IbtoolError
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import messages
from ibtool.sources.netlink.errors import kernel_error, malformed, socket_error

if TYPE_CHECKING:
    import asyncio  # the blocking client is used far more: 0.7 s of imports in the testbed guest

DEFAULT_TIMEOUT = 10.0  # seconds; the kernel answers at once, this only bounds a bug
# Dump parts are at most 32 KiB (netlink_dump); doit replies are smaller.
RECV_BUFFER = 64 * 1024

# -- one request and its replies ----------------------------------------------------------------


class Exchange:
    """One request and the replies that answer it, without any I/O."""

    def __init__(self, command: int, attributes: Mapping[str, Any] | None, dump: bool, seq: int):
        self.command = command
        self.with_attributes = bool(attributes)
        self.seq = seq
        flags = A.NLM_F_REQUEST | (A.NLM_F_DUMP if dump else A.NLM_F_ACK)
        self.request = messages.encode(command, attributes, flags=flags, seq=seq)
        self.replies: list[dict[str, Any]] = []
        self.done = False

    def feed(self, data: bytes) -> None:
        """Take one datagram from the socket; raises the kernel's error, if it sent one."""
        for msg in messages.parse(data):
            header = msg["header"]
            if header["sequence_number"] != self.seq or self.done:
                continue  # left over from an abandoned request
            kind = header["type"]
            if kind in (A.NLMSG_ERROR, A.NLMSG_DONE):
                code, detail = _status(msg)
                self.done = True
                if code:
                    raise kernel_error(
                        self.command, code, detail, with_attributes=self.with_attributes
                    )
            elif A.command_of(kind) is not None:
                self.replies.append(messages.attributes(msg))


def _status(msg) -> tuple[int, str | None]:
    """(errno, extended-ack message) of an NLMSG_ERROR or NLMSG_DONE; errno 0 for an ack."""
    header = msg["header"]
    raw = bytes(msg.data[msg.offset : msg.offset + header["length"]])
    if len(raw) < 20:
        if header["type"] == A.NLMSG_DONE:
            return 0, None  # kernels before 4.x sent DONE without a status
        raise malformed("NLMSG_ERROR without an error code")
    code = -struct.unpack_from("=i", raw, 16)[0]
    if not header["flags"] & A.NLM_F_ACK_TLVS:
        return code, None
    offset = 20
    if header["type"] == A.NLMSG_ERROR:
        echoed = 16 if header["flags"] & A.NLM_F_CAPPED else struct.unpack_from("=I", raw, 20)[0]
        offset += (echoed + 3) & ~3
    return code, _extack_message(raw, offset)


def _extack_message(raw: bytes, offset: int) -> str | None:
    while offset + 4 <= len(raw):
        length, kind = struct.unpack_from("=HH", raw, offset)
        if length < 4 or offset + length > len(raw):
            return None
        if kind & A.NLA_TYPE_MASK == A.NLMSGERR_ATTR_MSG:
            return raw[offset + 4 : offset + length].split(b"\0", 1)[0].decode("utf-8", "replace")
        offset += (length + 3) & ~3
    return None


# -- the socket ----------------------------------------------------------------------------------


def open_socket() -> socket.socket:
    """An NETLINK_RDMA socket with extended, capped acks where the kernel offers them."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, A.NETLINK_RDMA)
    except OSError as e:
        raise socket_error(e) from e
    return with_acks(sock)


def with_acks(sock: socket.socket) -> socket.socket:
    """`sock` asking for extended, capped acks where the kernel offers them."""
    for option in (A.NETLINK_CAP_ACK, A.NETLINK_EXT_ACK):
        try:
            sock.setsockopt(A.SOL_NETLINK, option, 1)
        except OSError:
            pass  # kernels before 4.3 / 4.12: plain acks
    return sock


def _receive(sock) -> bytes:
    data, _, flags, _ = sock.recvmsg(RECV_BUFFER)
    if flags & socket.MSG_TRUNC:
        raise malformed(f"a reply larger than {RECV_BUFFER} bytes")
    return data


class _Queries:
    """The requests ibtool makes, shared by both clients: `_call` returns the value in the
    blocking client and a coroutine in the asyncio one."""

    def _call(self, command, attributes=None, *, dump=False, one=False):
        raise NotImplementedError

    def devices(self):
        """GET dump: every RDMA device in this network namespace."""
        return self._call(A.RDMA_NLDEV_CMD_GET, dump=True)

    def device(self, index: int):
        return self._call(A.RDMA_NLDEV_CMD_GET, {"RDMA_NLDEV_ATTR_DEV_INDEX": index}, one=True)

    def ports(self, index: int):
        """PORT_GET dump of one device's ports."""
        return self._call(
            A.RDMA_NLDEV_CMD_PORT_GET, {"RDMA_NLDEV_ATTR_DEV_INDEX": index}, dump=True
        )

    def port(self, index: int, port: int):
        attributes = {"RDMA_NLDEV_ATTR_DEV_INDEX": index, "RDMA_NLDEV_ATTR_PORT_INDEX": port}
        return self._call(A.RDMA_NLDEV_CMD_PORT_GET, attributes, one=True)

    def system(self):
        """SYS_GET: the system-wide settings (netns mode, copy-on-fork, ...)."""
        return self._call(A.RDMA_NLDEV_CMD_SYS_GET, one=True)

    def set_system(self, attribute: str, value: int):
        """SYS_SET of one setting (the kernel takes one per request); needs CAP_NET_ADMIN."""
        return self._call(A.RDMA_NLDEV_CMD_SYS_SET, {attribute: value})

    def new_link(self, name: str, link_type: str, netdev: str):
        """NEWLINK: a software RDMA device (rxe, siw) called `name` on `netdev`; needs
        CAP_NET_ADMIN. The kernel loads the type's module (rdma-link-TYPE) if it can."""
        attributes = {
            "RDMA_NLDEV_ATTR_DEV_NAME": name,
            "RDMA_NLDEV_ATTR_LINK_TYPE": link_type,
            "RDMA_NLDEV_ATTR_NDEV_NAME": netdev,
        }
        return self._call(A.RDMA_NLDEV_CMD_NEWLINK, attributes)

    def delete_link(self, index: int):
        """DELLINK: unregister a device that allows it (rxe, siw); needs CAP_NET_ADMIN."""
        return self._call(A.RDMA_NLDEV_CMD_DELLINK, {"RDMA_NLDEV_ATTR_DEV_INDEX": index})

    def resource_summaries(self):
        """RES_GET dump: per device, how many of each resource type exist."""
        return self._call(A.RDMA_NLDEV_CMD_RES_GET, dump=True)

    def resource_summary(self, index: int):
        """RES_GET of one device: how many of each resource type it has."""
        return self._call(A.RDMA_NLDEV_CMD_RES_GET, {"RDMA_NLDEV_ATTR_DEV_INDEX": index}, one=True)

    def resource_dump(
        self, kind: str, index: int, port: int | None = None, *, driver_details: bool = False
    ):
        """RES_{QP,CM_ID,CQ,MR,PD,CTX,SRQ}_GET dump of one device's objects of a kind ("qp",
        ...); the parts of a large dump arrive as several messages, all returned.

        There is no all-devices form: without DEV_INDEX the kernel answers EINVAL, so callers
        ask device by device (as rdma does). A port (QPs, CM IDs) makes the kernel skip the
        objects of other ports and those not bound to one yet. DRIVER_DETAILS (Linux 6.10,
        ignored before) adds driver-internal objects and attributes.
        """
        attributes = {"RDMA_NLDEV_ATTR_DEV_INDEX": index}
        if port is not None:
            attributes["RDMA_NLDEV_ATTR_PORT_INDEX"] = port
        if driver_details:
            attributes["RDMA_NLDEV_ATTR_DRIVER_DETAILS"] = 1
        return self._call(A.RESOURCE_COMMANDS[kind], attributes, dump=True)

    def hw_counters(self, index: int, port: int):
        """STAT_GET without STAT_RES: the port's default (driver hw) counters."""
        attributes = {"RDMA_NLDEV_ATTR_DEV_INDEX": index, "RDMA_NLDEV_ATTR_PORT_INDEX": port}
        return self._call(A.RDMA_NLDEV_CMD_STAT_GET, attributes, one=True)

    def hw_counter_status(self, index: int, port: int):
        """STAT_GET_STATUS: every driver counter of a port with its index; optional ones carry
        STAT_HWCOUNTER_DYNAMIC (1 = enabled). Linux 5.16 and later."""
        attributes = {"RDMA_NLDEV_ATTR_DEV_INDEX": index, "RDMA_NLDEV_ATTR_PORT_INDEX": port}
        return self._call(A.RDMA_NLDEV_CMD_STAT_GET_STATUS, attributes, one=True)

    def set_optional_counters(self, index: int, port: int, counters):
        """STAT_SET: exactly these optional counters (indexes) enabled, every other one
        disabled; needs CAP_NET_ADMIN."""
        attributes = {
            "RDMA_NLDEV_ATTR_DEV_INDEX": index,
            "RDMA_NLDEV_ATTR_PORT_INDEX": port,
            "RDMA_NLDEV_ATTR_STAT_HWCOUNTERS": [
                ("RDMA_NLDEV_ATTR_STAT_HWCOUNTER_INDEX", i) for i in counters
            ],
        }
        return self._call(A.RDMA_NLDEV_CMD_STAT_SET, attributes)


def _only(exchange: Exchange) -> dict[str, Any]:
    if len(exchange.replies) != 1:
        name = A.COMMANDS.get(exchange.command, str(exchange.command))
        raise malformed(f"{len(exchange.replies)} replies to {name} where one was expected")
    return exchange.replies[0]


def _timeout_error(command: int, timeout: float) -> IbtoolError:
    name = A.COMMANDS.get(command, str(command))
    return IbtoolError(f"the kernel did not answer {name} within {timeout:g} s")


class NldevClient(_Queries):
    """Blocking NLDEV requests; usable anywhere, including a thread of an asyncio program.

    `sock` is for tests: anything with send, recvmsg, settimeout and close (a datagram
    socketpair plays the kernel).
    """

    def __init__(self, sock=None, timeout: float = DEFAULT_TIMEOUT):
        self._sock = sock if sock is not None else open_socket()
        self._sock.settimeout(timeout)
        self._timeout = timeout
        self._seq = itertools.count(int(time.time()) & 0xFFFFFF)

    def request(
        self, command: int, attributes: Mapping[str, Any] | None = None, *, dump: bool = False
    ) -> list[dict[str, Any]]:
        """Send one request; every reply's attributes as {uapi name: Python value}."""
        return self._exchange(command, attributes, dump).replies

    def _exchange(self, command, attributes, dump) -> Exchange:
        exchange = Exchange(command, attributes, dump, next(self._seq))
        try:
            self._sock.send(exchange.request)
            while not exchange.done:
                exchange.feed(_receive(self._sock))
        except socket.timeout as e:  # TimeoutError only from 3.10
            raise _timeout_error(command, self._timeout) from e
        except OSError as e:
            raise IbtoolError(f"RDMA netlink: {e.strerror or e}", errno=e.errno) from e
        return exchange

    def _call(self, command, attributes=None, *, dump=False, one=False):
        exchange = self._exchange(command, attributes, dump)
        return _only(exchange) if one else exchange.replies

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> NldevClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncNldevClient(_Queries):
    """NLDEV requests as coroutines, for code running inside an asyncio event loop.

    One request at a time per client (later callers wait their turn), so the replies of two
    requests never interleave on the socket.
    """

    def __init__(self, sock=None, timeout: float = DEFAULT_TIMEOUT):
        self._sock = sock if sock is not None else open_socket()
        self._sock.setblocking(False)
        self._timeout = timeout
        self._seq = itertools.count(int(time.time()) & 0xFFFFFF)
        self._lock: asyncio.Lock | None = None

    async def request(
        self, command: int, attributes: Mapping[str, Any] | None = None, *, dump: bool = False
    ) -> list[dict[str, Any]]:
        return (await self._exchange(command, attributes, dump)).replies

    async def _exchange(self, command, attributes, dump) -> Exchange:
        import asyncio  # loaded already by the running loop; the blocking client never needs it

        if self._lock is None:
            self._lock = asyncio.Lock()
        exchange = Exchange(command, attributes, dump, next(self._seq))
        async with self._lock:
            try:
                await asyncio.wait_for(
                    self._converse(exchange, asyncio.get_running_loop()), self._timeout
                )
            except asyncio.TimeoutError as e:
                raise _timeout_error(command, self._timeout) from e
            except OSError as e:
                raise IbtoolError(f"RDMA netlink: {e.strerror or e}", errno=e.errno) from e
        return exchange

    async def _converse(self, exchange: Exchange, loop: asyncio.AbstractEventLoop) -> None:
        await loop.sock_sendall(self._sock, exchange.request)
        while not exchange.done:
            exchange.feed(await self._receive(loop))

    async def _receive(self, loop: asyncio.AbstractEventLoop) -> bytes:
        while True:
            try:
                return _receive(self._sock)
            except BlockingIOError:
                pass
            readable = loop.create_future()
            loop.add_reader(self._sock.fileno(), _set_once, readable)
            try:
                await readable
            finally:
                loop.remove_reader(self._sock.fileno())

    async def _call(self, command, attributes=None, *, dump=False, one=False):
        exchange = await self._exchange(command, attributes, dump)
        return _only(exchange) if one else exchange.replies

    def close(self) -> None:
        self._sock.close()

    async def __aenter__(self) -> AsyncNldevClient:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


def _set_once(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
