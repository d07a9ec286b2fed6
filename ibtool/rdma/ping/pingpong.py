"""rdma-core's ibv_rc_pingpong as the peer of `ibtool ping --compat rc_pingpong`.

What the stock tool does (libibverbs/examples/rc_pingpong.c, pingpong.c): a TCP connection to
port 18515; the client writes its address as the text "LLLL:QQQQQQ:PPPPPP:G..G" (LID, QPN and
PSN in hex, the GID as 32 hex digits, byte for byte) with its terminating NUL, 52 bytes; the
server, its QP already connected, answers the same way; the client writes "done" and its NUL
and the TCP connection ends. Then SEND ping-pong on RC: the client sends -s bytes, the server
answers from the buffer the ping just landed in (the same bytes), -n times each way, and
both exit. Nothing else crosses the wire: each side's -s, -n and -m stay its own, so a
mismatch shows only as a reply of another length, a failed completion or a silence, and the
errors below name the flag to look at.
"""

from __future__ import annotations

import re
import socket
import time

from ibtool.errors import IbtoolError
from ibtool.rdma import wire
from ibtool.rdma.completions import CompletionError, CompletionTimeout
from ibtool.rdma.hwclock import HwClock
from ibtool.rdma.ladder import DEFAULT_PATH, Ladder, PathSpec, Peer
from ibtool.rdma.ping.acceptor import Acceptor, Guard, RefusedError, locked, serving
from ibtool.rdma.ping.client import Client
from ibtool.rdma.ping.echo import answer_pings
from ibtool.rdma.ping.options import ServeOptions
from ibtool.rdma.ping.session import (
    HANDSHAKE_TIMEOUT,
    MAX_PING_SIZE,
    Log,
    QPError,
    ReplySizeError,
    Session,
    SessionEnded,
)

DEFAULT_PORT = 18515
DEFAULT_SIZE = 4096  # ibv_rc_pingpong's -s
DEFAULT_COUNT = 1000  # its -n
DEFAULT_MTU = 1024  # its -m
DEFAULT_IDLE = 2.0  # s without a ping that end a client's session (ping's -W, its default)
MESSAGE_SIZE = len("0000:000000:000000:" + "0" * 32) + 1  # sizeof msg: the NUL goes too
DONE = b"done\0"
TOOL = "ibv_rc_pingpong"
_HEX = rb"[0-9a-fA-F]"
_ADDRESS = re.compile(rb"(%s{1,4}):(%s{1,6}):(%s{1,6}):(%s{32})" % (_HEX, _HEX, _HEX, _HEX))
# The remote errors of a SEND the responder could not take: its receive buffer is too small.
_TOO_LONG = {9, 11}  # IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_OP_ERR
_RETRY_EXC_ERR = 12


class NotPingpong(wire.ProtocolError):
    """What the peer wrote is not an ibv_rc_pingpong address."""


def encode(lid: int, qpn: int, psn: int, gid: bytes) -> bytes:
    """Our address as ibv_rc_pingpong writes its own (sprintf "%04x:%06x:%06x:%s" and the
    NUL; the GID as gid_to_wire_gid writes it: its 16 bytes in order, in hex)."""
    text = f"{lid:04x}:{qpn:06x}:{psn:06x}:{gid.hex()}".encode("ascii")
    return text + b"\0"


def decode(data: bytes) -> Peer:
    """The peer's address; anything that is not one is a NotPingpong."""
    found = _ADDRESS.match(data)
    if found is None or data[found.end() : found.end() + 1] not in (b"\0", b""):
        raise NotPingpong(f"not an {TOOL} address: {wire.printable(repr(data[:MESSAGE_SIZE]))}")
    lid, qpn, psn = (int(found.group(i), 16) for i in (1, 2, 3))
    if not 2 <= qpn or lid >= 0xC000:
        raise NotPingpong(f"{TOOL} address with QPN {qpn:#x} and LID {lid:#x} is not usable")
    # The MTU is not exchanged: each side connects with its own -m (path.mtu here).
    return Peer(qpn, psn, lid, bytes.fromhex(found.group(4).decode("ascii")), 5)


def _check_gid(ladder: Ladder, peer: Peer) -> None:
    # ibv_rc_pingpong sends a GID only when started with -g; without one it connects by LID,
    # which a RoCE port has not.
    if ladder.needs_grh and not any(peer.gid[8:]):
        raise IbtoolError(
            f"the {TOOL} peer sent no GID, and {ladder.device}/{ladder.port} needs one (RoCE)",
            f"start {TOOL} there with -g IDX (`ibtool gids --best NETDEV` there names it)",
        )


def _ours(session: Session) -> bytes:
    lad = session.ladder
    return encode(lad.port_attr.lid, session.qp.qp_num, session.psn, lad.gid)


# -- client ------------------------------------------------------------------------------


class PingpongClient(Client):
    """`ibtool ping --compat rc_pingpong HOST`: one session with a stock server, whose QP
    lives as long as its -n iterations; `ping` is Client's, the exchange and the errors are
    ibv_rc_pingpong's."""

    def __init__(
        self,
        ladder: Ladder,
        host: str,
        tcp_port: int,
        size: int,
        timeout: float,
        path: PathSpec = DEFAULT_PATH,
        count: int | None = None,
        hw: HwClock | None = None,
    ):
        self.ladder, self.size, self.mode, self.timeout = ladder, size, wire.Mode.SEND, timeout
        self.host, self.tcp_port, self.path, self.count = host, tcp_port, path, count
        self.hw = hw
        self.server = f"{host}:{tcp_port}"
        self.session: Session | None = None
        self._used = False

    def close(self) -> None:
        if self.session:
            self.session.close()
            self.session = None

    def connect(self) -> None:
        if self._used:
            raise SessionEnded(f"{TOOL} serves one session, and it has ended")
        self._used = True
        session = Session(
            self.ladder, self.size, self.mode, MAX_PING_SIZE, self.path, stamped=bool(self.hw)
        )
        try:
            with self._dial() as conn:
                wire.send(conn, _ours(session))
                deadline = time.monotonic() + HANDSHAKE_TIMEOUT
                peer = decode(wire.recv_exact(conn, MESSAGE_SIZE, deadline))
                wire.send(conn, DONE)
            _check_gid(self.ladder, peer)
            session.connect_to(peer)
            session.post_recv()
            session.post_recv()
        except BaseException as e:
            session.close()
            if isinstance(e, wire.ProtocolError) and e.hint is None:
                e.hint = f"is what listens at {self.server} an {TOOL} server?"
            raise
        self.session = session

    def _dial(self) -> socket.socket:
        try:
            return socket.create_connection((self.host, self.tcp_port), timeout=HANDSHAKE_TIMEOUT)
        except OSError as e:
            raise IbtoolError(
                f"cannot reach the {TOOL} server at {self.server}: {e.strerror or e}",
                f"start it there with `{TOOL} -g IDX -s {self.size} -n {self.count or 'N'}`"
                f" (-g on RoCE only)",
            ) from None

    def ping(self, seq: int) -> float:
        # Client.ping named, not super(): this runs between every two pings.
        try:
            return Client.ping(self, seq)
        except ReplySizeError as e:
            raise SessionEnded(
                f"{TOOL} answers with {e.got}-byte messages, this ping sends {e.want}",
                f"give -s {e.got} here, or start {TOOL} with -s {e.want}",
            ) from None
        except CompletionTimeout:
            raise self._silence(seq) from None
        except CompletionError as e:
            raise self._failed(seq, e) from None
        except QPError as e:
            raise SessionEnded(e.message, e.hint) from None

    def _silence(self, seq: int) -> SessionEnded:
        # The server's one session ends at its first failure (connect() refuses a second):
        # the pings before `seq` were all answered.
        answered = seq - 1
        if answered:
            return SessionEnded(
                f"{TOOL} stopped answering after {answered} pings",
                f"it ends after its -n iterations: give -c {answered} here, or start it "
                f"with -n {self.count or seq}",
            )
        return SessionEnded(
            f"no answer from {TOOL} to the first ping",
            f"start both with the same message size (-s) and path MTU (-m there, --mtu here); "
            f"on RoCE give {TOOL} -g with a GID on this port's subnet",
        )

    def _failed(self, seq: int, e: CompletionError) -> SessionEnded:
        if e.status in _TOO_LONG and seq == 1:
            return SessionEnded(
                f"{TOOL} could not take a {self.size}-byte ping: {e.message}",
                f"start it with -s {self.size}, or give its -s here",
            )
        if e.status == _RETRY_EXC_ERR and seq > 1:
            return self._silence(seq)  # its QP is gone: it ended
        return SessionEnded(
            e.message,
            f"{TOOL} and this ping must agree on -s, -n and the path MTU (-m there, --mtu here)",
        )


# -- server ------------------------------------------------------------------------------


def serve(options: ServeOptions) -> None:
    """Serve stock ibv_rc_pingpong clients, several at once within `options.limits`
    (acceptor.Acceptor): each gets its exchange, then every ping it sends is answered with as
    many bytes as it carried, until it has sent nothing for `options.idle` seconds (None:
    DEFAULT_IDLE; it ran its -n iterations and exited). A refused client's connection is
    closed at once: the stock tool has no way to be told why. Each session registers
    MAX_PING_SIZE (it cannot know the client's -s) and counts so against --max-memory.
    `options.pkey`: the slot of `options.path.pkey_index`, for the first line."""
    options.require(f"{TOOL}'s server", "device", "device_port")
    log, path, limits = locked(options.log), options.path, options.limits
    idle = DEFAULT_IDLE if options.idle is None else options.idle
    with serving(options, log, f"listening for {TOOL} clients") as (listener, ladder):
        server = Acceptor(listener, ladder, log, limits, options.max_clients, _first_address)

        def one(conn: socket.socket, client: str, guard: Guard, peer: Peer) -> None:
            try:
                count, size = _serve_client(ladder, conn, client, log, path, idle, guard, peer)
                log(f"client {client} done: {count} pings of {size} bytes answered")
            except (CompletionError, QPError) as e:
                log(f"client {client} dropped: {e.message}")
            except RefusedError:
                pass  # logged by admission.py, once a source and interval; the close says it
            except IbtoolError as e:
                log(f"client {client} dropped: {e.message}" + (f" ({e.hint})" if e.hint else ""))
            except OSError as e:
                log(f"client {client} dropped: {e.strerror or e}")

        server.run(one, tells=False)


def _first_address(buf: bytes) -> tuple[int, Peer | None]:
    """The stock client's address in `buf`: (bytes still needed, None) or (0, the Peer)."""
    if len(buf) < MESSAGE_SIZE:
        return MESSAGE_SIZE - len(buf), None
    try:
        return 0, decode(bytes(buf))
    except wire.ProtocolError as e:
        e.hint = e.hint or f"is the client {TOOL}?"
        raise


def _serve_client(ladder: Ladder, conn: socket.socket, client: str, log: Log, path: PathSpec,
                  idle: float, guard: Guard, peer: Peer) -> tuple[int, int]:  # fmt: skip
    """One stock client, its address `peer` read by the Acceptor: our address back, its
    "done", then its pings echoed until it has been silent for `idle` seconds: (the pings
    answered, the size of the last)."""
    with conn:
        _check_gid(ladder, peer)
        guard.reserve(MAX_PING_SIZE)  # before the MR is registered
        try:
            session = Session(ladder, MAX_PING_SIZE, wire.Mode.SEND, path=path)
            try:
                session.connect_to(peer)  # as the stock server: connected before it answers
                session.post_recv()
                session.post_recv()
                wire.send(conn, _ours(session))
                if wire.recv_exact(conn, len(DONE), guard.deadline) != DONE:
                    raise NotPingpong(f"the {TOOL} client did not write done", f"is it {TOOL}?")
                conn.close()
                log(f"client {client}: qpn {peer.qpn:#x} ({TOOL})")
                try:
                    answer_pings(session, None, idle, guard.stop, guard.crowded)
                except CompletionError as e:
                    # A client that got its last answer exits at once; the acknowledgement of
                    # that answer may find its QP gone: the answer's completion fails, the
                    # session ended.
                    if not session.answered or e.status != _RETRY_EXC_ERR:
                        raise
                return session.answered, session.size
            finally:
                session.close()
        finally:
            guard.free()
