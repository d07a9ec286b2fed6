"""The out-of-band exchange of `ibtool ping`: what each side must know to connect an RC QP.

A message is an 8-byte header (magic, version, type, payload length) and a fixed-layout
payload, all big-endian. Every field is validated before use; reads are bounded in size and
time, so a peer that sends garbage, stalls or disconnects costs one log line, nothing more.
The one text a peer sends, an ERROR's reason, is made printable (printable()) before anything
shows it: it reaches the operator's terminal and the server's log.
"""

from __future__ import annotations

import enum
import socket
import struct
import time

from ibtool.errors import DataError, ExitCode
from ibtool.model.deferred import dataclass
from ibtool.model.names import MAX_TEXT, printable  # noqa: F401 (MAX_TEXT: the bound peers meet)

MAGIC = b"IBTP"
VERSION = 1
HEADER = struct.Struct("!4sBBH")
MAX_PAYLOAD = 1024
MAX_FACTS_PAYLOAD = 16384  # FACTS only: a port's facts as JSON (ibtool.model.doctor.MAX_FACTS)
ENDPOINT = struct.Struct("!IIHB16sQIIB")  # qpn psn lid mtu gid addr rkey size mode
MAX_BUFFER = 1 << 30  # no ping needs more than 1 GiB registered


class MessageType(enum.IntEnum):
    ENDPOINT = 1  # my QP and buffer: connect to me
    READY = 2  # my QP is in RTS: start
    ERROR = 3  # a reason in UTF-8, then the peer closes
    FACTS_QUERY = 4  # ibtool doctor: tell me your side (no payload) ...
    FACTS = 5  # ... the server's facts as JSON (model/doctor.py), then it closes


class Mode(enum.IntEnum):
    SEND = 1
    WRITE_IMM = 2


MODES = {"send": Mode.SEND, "write-imm": Mode.WRITE_IMM}  # --mode, as ping and mesh take it


class ProtocolError(DataError):
    """The peer broke the protocol: the connection is dropped."""


class ConnectionLost(ProtocolError):
    """The connection broke (reset by the peer, or another socket error): the peer is gone,
    which is a failure to reach it (exit 1), not a broken protocol."""

    exit_code = ExitCode.FAILED


class PeerClosed(ConnectionLost):
    """The peer closed the connection."""


class PeerError(ProtocolError):
    """The peer reported an error (an ERROR message): the session may be retried."""


@dataclass(frozen=True)
class Endpoint:
    qpn: int
    psn: int
    lid: int
    mtu: int  # ibv_mtu enum 1..5
    gid: bytes  # 16 raw bytes; all zero on InfiniBand without GRH
    addr: int
    rkey: int
    size: int
    mode: Mode

    def validate(self) -> Endpoint:
        if not 2 <= self.qpn < 1 << 24:
            raise ProtocolError(f"QPN {self.qpn} out of range (2..2^24-1)")
        if not 0 <= self.psn < 1 << 24:
            raise ProtocolError(f"PSN {self.psn} out of range (0..2^24-1)")
        if not 0 <= self.lid < 0xC000:
            raise ProtocolError(f"LID {self.lid:#x} is not a unicast LID")
        if not 1 <= self.mtu <= 5:
            raise ProtocolError(f"MTU code {self.mtu} not in 1..5 (256..4096 bytes)")
        if len(self.gid) != 16:
            raise ProtocolError(f"GID of {len(self.gid)} bytes, want 16")
        if self.lid == 0 and self.gid == bytes(16):
            raise ProtocolError("neither a LID nor a GID: the peer cannot be addressed")
        if not 1 <= self.size <= MAX_BUFFER:
            raise ProtocolError(f"buffer size {self.size} not in 1..{MAX_BUFFER}")
        if self.addr + self.size > 1 << 64:
            raise ProtocolError("buffer wraps around the address space")
        if not isinstance(self.mode, Mode):
            raise ProtocolError(f"unknown mode {self.mode}")
        return self


def _limit(kind: MessageType) -> int:
    return MAX_FACTS_PAYLOAD if kind == MessageType.FACTS else MAX_PAYLOAD


def encode(mtype: MessageType, payload: bytes = b"") -> bytes:
    if len(payload) > _limit(mtype):
        raise ValueError("payload too large")
    return HEADER.pack(MAGIC, VERSION, mtype, len(payload)) + payload


def encode_endpoint(ep: Endpoint) -> bytes:
    ep.validate()
    return encode(
        MessageType.ENDPOINT,
        ENDPOINT.pack(ep.qpn, ep.psn, ep.lid, ep.mtu, ep.gid, ep.addr, ep.rkey, ep.size, ep.mode),
    )


def encode_error(reason: str) -> bytes:
    return encode(MessageType.ERROR, reason.encode("utf-8")[:MAX_PAYLOAD])


def decode_header(header: bytes) -> tuple[MessageType, int]:
    magic, version, mtype, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError(f"not an ibtool ping peer (magic {magic!r})")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version}, this ibtool speaks {VERSION}")
    try:
        kind = MessageType(mtype)
    except ValueError:
        raise ProtocolError(f"unknown message type {mtype}") from None
    if length > _limit(kind):
        raise ProtocolError(f"payload of {length} bytes exceeds {_limit(kind)}")
    return kind, length


def decode_payload(kind: MessageType, payload: bytes):
    if kind == MessageType.ENDPOINT:
        if len(payload) != ENDPOINT.size:
            raise ProtocolError(f"endpoint of {len(payload)} bytes, want {ENDPOINT.size}")
        qpn, psn, lid, mtu, gid, addr, rkey, size, mode = ENDPOINT.unpack(payload)
        try:
            mode = Mode(mode)
        except ValueError:
            raise ProtocolError(f"unknown mode {mode}") from None
        return Endpoint(qpn, psn, lid, mtu, gid, addr, rkey, size, mode).validate()
    if kind in (MessageType.READY, MessageType.FACTS_QUERY):
        if payload:
            raise ProtocolError(f"{kind.name} carries no payload")
        return None
    if kind == MessageType.FACTS:
        return bytes(payload)  # JSON, validated by ibtool.model.doctor.Facts.from_wire
    return printable(payload.decode("utf-8", errors="replace"))  # ERROR


def decode(data: bytes):
    """One whole message -> (type, value); for tests and fuzzing."""
    if len(data) < HEADER.size:
        raise ProtocolError(f"message of {len(data)} bytes is shorter than its header")
    kind, length = decode_header(data[: HEADER.size])
    if len(data) != HEADER.size + length:
        raise ProtocolError(f"length field says {length}, got {len(data) - HEADER.size}")
    return kind, decode_payload(kind, data[HEADER.size :])


def recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ProtocolError("peer too slow: handshake timed out")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(n - len(buf))
        except socket.timeout:  # TimeoutError only from 3.10
            raise ProtocolError("peer too slow: handshake timed out") from None
        except OSError as e:
            raise connection_lost(e) from None
        if not chunk:
            raise PeerClosed("peer closed the connection")
        buf += chunk
    return bytes(buf)


def connection_lost(e: OSError) -> ConnectionLost:
    """A socket error as the ConnectionLost that says it (a reset named as such)."""
    if isinstance(e, ConnectionResetError):
        return ConnectionLost("peer reset the connection")
    return ConnectionLost(f"connection lost: {e.strerror or e}")


def send(sock: socket.socket, data: bytes) -> None:
    """sendall, a broken connection (reset, EPIPE) raised as ConnectionLost."""
    try:
        sock.sendall(data)
    except OSError as e:
        raise connection_lost(e) from None


def receive(sock: socket.socket, timeout: float, expect: MessageType | None = None):
    """Read one message within `timeout` seconds; an ERROR from the peer raises."""
    deadline = time.monotonic() + timeout
    kind, length = decode_header(recv_exact(sock, HEADER.size, deadline))
    value = decode_payload(kind, recv_exact(sock, length, deadline))
    if kind == MessageType.ERROR:
        raise PeerError(f"peer says: {value}")
    if expect is not None and kind != expect:
        raise ProtocolError(f"expected {expect.name}, got {kind.name}")
    return value


# -- rdma_cm private data (ibtool ping --cm) ---------------------------------------------------
#
# With rdma_cm there is no side channel: what the TCP exchange carries goes in the private data
# of the CM's REQ (rdma_connect), REP (rdma_accept) and REJ (rdma_reject). Room, per the IBTA CM
# messages (linux include/rdma/ib_cm.h, IB_CM_{REQ,REP,REJ}_PRIVATE_DATA_SIZE) less rdma_cm's
# own 36-byte header in a REQ (drivers/infiniband/core/cma.c, struct cma_hdr): 56 bytes in a
# REQ, 196 in a REP, 148 in a REJ. On InfiniBand and RoCE the receiver gets the whole area,
# zero-padded (cma.c, cma_set_req_event_data and cma_set_rep_event_data): the padding must be
# zeros; iWARP passes the exact length. A message is a header like the TCP one but with its
# own magic, so a TCP peer and a CM peer never mistake one another, then a fixed-layout
# payload, big-endian.

CM_MAGIC = b"IBCM"
CM_VERSION = 1
CM_OFFER = struct.Struct("!BxxxIQI")  # mode, size, buffer address, rkey
CM_REQ_ROOM, CM_REP_ROOM, CM_REJ_ROOM = 56, 196, 148


class CmMessage(enum.IntEnum):
    REQUEST = 1  # in the REQ: ping mode, size, and (write-imm) the client's buffer
    ACCEPT = 2  # in the REP: the same mode and size, and (write-imm) the server's buffer
    REFUSE = 3  # in the REJ: the server's reason, UTF-8


@dataclass(frozen=True)
class CmOffer:
    """One side's ping: mode and size, and for WRITE WITH IMM the buffer the peer writes into
    (address 0 and rkey 0 in SEND mode: nothing is advertised that is not used)."""

    mode: Mode
    size: int
    addr: int = 0
    rkey: int = 0

    def validate(self, max_size: int) -> CmOffer:
        if not isinstance(self.mode, Mode):
            raise ProtocolError(f"unknown mode {self.mode}")
        if not 1 <= self.size <= max_size:
            raise ProtocolError(f"ping size {self.size} not in 1..{max_size}")
        if self.mode == Mode.SEND and (self.addr or self.rkey):
            raise ProtocolError("a buffer advertised in SEND mode")
        if self.addr + self.size > 1 << 64:
            raise ProtocolError("buffer wraps around the address space")
        if not 0 <= self.rkey < 1 << 32:
            raise ProtocolError(f"rkey {self.rkey:#x} is not 32 bits")
        return self


def encode_cm(kind: CmMessage, value) -> bytes:
    """REQUEST and ACCEPT take a CmOffer, REFUSE a reason (cut to fit a REJ)."""
    if kind == CmMessage.REFUSE:
        body = value.encode("utf-8")[: CM_REJ_ROOM - HEADER.size]
    else:
        body = CM_OFFER.pack(value.mode, value.size, value.addr, value.rkey)
    return HEADER.pack(CM_MAGIC, CM_VERSION, kind, len(body)) + body


def decode_cm(data: bytes, expect: CmMessage, max_size: int):
    """The `expect` message in a CM event's private data (padding included): a CmOffer, or
    for REFUSE the reason made printable. Anything else raises ProtocolError."""
    if not data.strip(b"\0"):
        raise ProtocolError(f"no ibtool data in the connection ({len(data)} bytes, all zero)")
    if len(data) < HEADER.size:
        raise ProtocolError(f"{len(data)} bytes of private data, shorter than a header")
    magic, version, kind, length = HEADER.unpack(data[: HEADER.size])
    if magic != CM_MAGIC:
        raise ProtocolError(f"not an ibtool ping --cm peer (magic {magic!r})")
    if version != CM_VERSION:
        raise ProtocolError(
            f"ping --cm protocol version {version}, this ibtool speaks {CM_VERSION}"
        )
    if kind != expect:
        name = next((m.name for m in CmMessage if m == kind), str(kind))
        raise ProtocolError(f"expected {expect.name}, got {name}")
    end = HEADER.size + length
    if end > len(data):
        raise ProtocolError(f"length field says {length}, {len(data) - HEADER.size} bytes came")
    if data[end:].strip(b"\0"):
        raise ProtocolError(f"{len(data) - end} bytes after the message are not zero padding")
    body = data[HEADER.size : end]
    if kind == CmMessage.REFUSE:
        return printable(body.decode("utf-8", errors="replace"))
    if length != CM_OFFER.size:
        raise ProtocolError(f"{expect.name} of {length} bytes, want {CM_OFFER.size}")
    mode, size, addr, rkey = CM_OFFER.unpack(body)
    try:
        mode = Mode(mode)
    except ValueError:
        raise ProtocolError(f"unknown mode {mode}") from None
    return CmOffer(mode, size, addr, rkey).validate(max_size)
