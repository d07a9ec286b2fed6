"""RC ping-pong between two processes or hosts: `ibtool ping HOST` and `ibtool ping --server`.

The TCP connection carries the out-of-band exchange (wire.py) and stays open for the whole
session: the client's ENDPOINT message (re)builds the server's QP, so a QP that died (link
down past the retry budget) is replaced without restarting either side. Both sides busy-poll
their CQ while connected, as ibv_rc_pingpong does by default: latency, not CPU, is the point.

The server faces the network: one thread reads every client's first message through a
selector and admits it within the limits of admission.py; each admitted session runs in a
thread of its own (the server section below says why).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from errno import ENOENT

from ibtool.errors import IbtoolError, PermissionDeniedError, UsageError
from ibtool.model.records import PKey
from ibtool.rdma import wire
from ibtool.rdma.admission import Admission, Limits, Refused, Ticket
from ibtool.rdma.completions import CompletionError, CompletionTimeout, in_place, poll_failed
from ibtool.rdma.hwclock import HwClock
from ibtool.rdma.ladder import (
    ACCESS_LOCAL_WRITE,
    ACCESS_REMOTE_WRITE,
    DEFAULT_PATH,
    Ladder,
    PathSpec,
    Peer,
    new_psn,
)
from ibtool.rdma.loopback import pattern_wheel

DEFAULT_PORT = 18520
HANDSHAKE_TIMEOUT = 5.0
SIGNAL_EVERY = 16
IBV_SEND_SIGNALED = 2
IBV_WC_EX_WITH_COMPLETION_TIMESTAMP = 1 << 7  # enum ibv_create_cq_wc_flags (verbs.h)
RECONNECT_WAIT = 600.0  # how long a server keeps a client whose QP died before it returns
MAX_PING_SIZE = 1 << 20
POLL_ROUND = range(256)  # a client's empty polls between two looks at the clock
ECHO_ROUND = range(2000)  # a server's empty polls between two looks at its TCP side
BACKOFF_ROUND = range(1)  # a quiet session's polls between two sleeps (see _echo)
Log = Callable[[str], None]


class QPError(IbtoolError):
    """The QP refused a work request (typically: it went to the error state)."""


class ReplySizeError(IbtoolError):
    """The reply is not as long as the ping: the peer answers with messages of its own size."""

    def __init__(self, seq: int, got: int, want: int):
        super().__init__(f"reply {seq} has {got} bytes, the ping {want}")
        self.got, self.want = got, want


class SessionEnded(IbtoolError):
    """The peer can no longer answer in this session and cannot be asked for another (a
    stock tool that ended): the run stops here, this ping counted as lost."""


def _access(mode: wire.Mode) -> int:
    # Narrowest rights: SEND needs none for the peer; WRITE WITH IMM needs remote write.
    return ACCESS_LOCAL_WRITE | (ACCESS_REMOTE_WRITE if mode == wire.Mode.WRITE_IMM else 0)


class Session:
    """One side's CQ, MR and QP for one connection; rebuilt when the QP dies.

    `ladder` is a Ladder, or anything else with its `pv`, `ctx`, `pd` and `_verbs`: an
    rdma_cm connection (cm.Connection), which connects the QP itself and then calls ready().

    The hot loops (Client.ping, _echo) use what this builds once: `polled` (the CQ read in
    place, no WC object per completion) with `poll_attr`, the bound post methods, and
    the work requests (`cadence` for sends, `recv_wr`), re-posted as they are. Measured
    under the QEMU testbed: every Python call there costs ~1-2 us, a WC object ~14 us, the
    post_send system call (rxe does the transfer in it) ~20 us.
    """

    def __init__(
        self,
        ladder: Ladder,
        size: int,
        mode: wire.Mode,
        room: int = 0,
        path: PathSpec = DEFAULT_PATH,
        stamped: bool = False,
    ):
        """Pings of `size` bytes; receives take up to `room` bytes (at least `size`), so a
        longer reply arrives whole and its length says what the peer sends. `stamped`:
        completions carry the HCA's timestamp (hwclock.HwClock has checked it can)."""
        self.ladder, self.size, self.mode, self.path = ladder, size, mode, path
        self.room = max(size, room, 1)
        self._objects: list = []
        self.answered = 0  # pings a server answered in this session
        self.with_imm = mode == wire.Mode.WRITE_IMM
        self.cq = self._keep(_completion_queue(ladder, mode, stamped))
        self.polled = in_place(self.cq, ladder.pv)
        self.poll_attr = ladder.pv.cq.PollCqAttr() if ladder.pv.cqex else None
        self.mr = self._keep(ladder.pv.mr.MR(ladder.pd, self.room, _access(mode)))
        # Sends are unsignaled but every SIGNAL_EVERY-th: a completion per ping would cost a
        # poll round on the critical path. The queue has room for the unreaped ones.
        cap = ladder.pv.qp.QPCap(
            max_send_wr=2 * SIGNAL_EVERY, max_recv_wr=2, max_send_sge=1, max_recv_sge=1
        )
        init = ladder.pv.qp.QPInitAttr(
            qp_type=ladder.pv.e.ibv_qp_type.IBV_QPT_RC,
            scq=self.cq,
            rcq=self.cq,
            cap=cap,
            sq_sig_all=0,
        )
        self.qp = self._keep(ladder.pv.qp.QP(ladder.pd, init))
        self.psn = new_psn()

    def _keep(self, obj):
        self._objects.append(obj)
        return obj

    def close(self) -> None:
        for obj in reversed(self._objects):  # QP before MR and CQ
            obj.close()
        self._objects.clear()

    def endpoint(self) -> wire.Endpoint:
        lad = self.ladder
        return wire.Endpoint(
            self.qp.qp_num,
            self.psn,
            lad.port_attr.lid,
            lad.path_mtu(lad.port_attr.active_mtu, self.path.mtu),
            lad.gid,
            self.mr.buf,
            self.mr.rkey,
            max(self.size, 1),
            self.mode,
        )

    def connect(self, peer: wire.Endpoint) -> None:
        self.connect_to(Peer(peer.qpn, peer.psn, peer.lid, peer.gid, peer.mtu), peer)

    def connect_to(self, peer: Peer, remote: wire.Endpoint | None = None) -> None:
        """Connect the QP to `peer`; `remote` is the peer's buffer (WRITE WITH IMM only)."""
        self.ladder.connect_rc(self.qp, self.psn, peer, _access(self.mode), path=self.path)
        self.path_mtu = self.ladder.path_mtu(peer.mtu, self.path.mtu)
        self.ready(remote)

    def ready(self, remote) -> None:
        """The QP is connected: build the work requests the hot loops post. `remote` has the
        peer's buffer (`addr`, `rkey`; WRITE WITH IMM only)."""
        self.peer = remote
        self._build_wrs()

    def post_recv(self) -> None:
        try:
            self.qp.post_recv(self.recv_wr)
        except self.ladder.pv.Error as e:
            raise QPError(f"post receive: {e}") from None

    def answer_with(self, length: int) -> None:
        """Send `length` bytes from now on (a server echoes what each ping carried)."""
        self.size = length
        self._build_wrs()

    def _build_wrs(self) -> None:
        # Built once and re-posted: object creation per ping would cost more than the wire.
        wr, op = self.ladder.pv.wr, self.ladder.pv.e.ibv_wr_opcode
        sge = wr.SGE(self.mr.buf, self.size, self.mr.lkey)
        self.recv_wr = wr.RecvWR(
            wr_id=1, num_sge=1, sg=[wr.SGE(self.mr.buf, self.room, self.mr.lkey)]
        )

        def send_wr(flags: int):
            if self.mode == wire.Mode.WRITE_IMM:
                built = wr.SendWR(
                    wr_id=2, opcode=op.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[sge]
                )
                built.set_wr_rdma(self.peer.rkey, self.peer.addr)
            else:
                built = wr.SendWR(wr_id=2, opcode=op.IBV_WR_SEND, num_sge=1, sg=[sge])
            built.send_flags = flags
            return built

        # The n-th send (a client's ping `seq`, a server's answer) posts cadence[n %
        # SIGNAL_EVERY]: the signaled one first, so no flag is set or counted between two.
        self.cadence = (send_wr(IBV_SEND_SIGNALED),) + (send_wr(0),) * (SIGNAL_EVERY - 1)
        # What Client.ping takes in one step instead of a dozen attribute loads a ping.
        cq = self.polled
        self.hot = (
            (self.cadence, self.qp.post_send, self.recv_wr, self.qp.post_recv),
            (cq, self.poll_attr, cq.start_poll, cq.end_poll, cq.read_opcode, cq.read_imm_data),
            (self.mr.write, self.mr.read),
        )


def _completion_queue(ladder: Ladder, mode: wire.Mode, stamped: bool = False):
    """An extended CQ (read in place, see completions.in_place), or a plain one where pyverbs
    or the provider has no extended CQ (ibv_create_cq_ex); `stamped`: extended, with the
    completions' timestamps, or an error."""
    pv = ladder.pv
    if pv.cqex:
        wc_ex = pv.e.ibv_create_cq_wc_flags
        # An extended CQ has readers only for the fields asked for here (ibv_create_cq_ex(3));
        # reading another one calls a NULL pointer: the process dies of SIGSEGV.
        flags = wc_ex.IBV_WC_EX_WITH_BYTE_LEN
        if mode == wire.Mode.WRITE_IMM:
            flags |= wc_ex.IBV_WC_EX_WITH_IMM
        if stamped:
            flags |= IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
            return ladder._verbs(
                lambda: pv.cq.CQEX(ladder.ctx, pv.cq.CqInitAttrEx(cqe=8, wc_flags=flags)),
                "create a CQ with completion timestamps",
            )
        try:
            return pv.cq.CQEX(ladder.ctx, pv.cq.CqInitAttrEx(cqe=8, wc_flags=flags))
        except pv.Error:
            pass
    return ladder._verbs(lambda: pv.cq.CQ(ladder.ctx, 8), "create CQ")


# -- server ------------------------------------------------------------------------------
#
# A server faces the network for months (admission.py says what it bounds). One thread, the
# one serve() runs in, accepts and reads every client's first message through a selector,
# non-blocking: a connection that stays idle, sends half a message or garbage holds a table
# entry until HANDSHAKE_TIMEOUT, never a thread, and never delays another client's handshake
# (the cost of a handshake on that thread is one recv() of at most one message). Only a
# complete, valid first message gets a thread of its own, which registers memory, builds the
# QP, answers and echoes: at most --max-sessions of them. A thread per session rather than
# one loop for all: each echo loop busy-polls its CQ for latency, and a session blocked on
# its client's READY or reconnect must not hold the others.
#
# The handshake table is bounded too (MAX_PENDING): past it the oldest entry is dropped, so a
# flood of idle connections from many sources can only delay a client that is slower than
# MAX_PENDING new connections; a source holds at most --max-per-source of them.

MAX_PENDING = 64  # handshakes read at once; past it the oldest is dropped
QUIET_AFTER = 0.05  # s without a ping before a session's polling backs off (if not alone)
BACKOFF_SLEEP = 0.001  # s slept between two polls of a quiet session
LONG_QUIET = 2.0  # s without a ping after which it sleeps LONG_SLEEP between polls instead
LONG_SLEEP = 0.005
REFUSAL_LINGER = 1.0  # s a refused client has to read why before its connection is closed
# TCP keepalive on every accepted connection (tcp(7): TCP_KEEPIDLE, TCP_KEEPINTVL,
# TCP_KEEPCNT): a client host that vanished is noticed within 10 + 5 * 3 s of silence.
KEEPALIVE = (10, 5, 3)


class Idle(IbtoolError):
    """The client sent nothing for --idle-timeout seconds."""


REFUSED = "peer says: refused: "  # a server's refusal as its client's PeerError shows it


class RefusedError(IbtoolError):
    """A limit refused the client's request (admission.py has logged it, once a source and
    interval): the client is told, the log says no more."""


def serve(
    device: str,
    port: int,
    gid_index: int | None,
    bind: str,
    tcp_port: int,
    log: Log,
    max_clients: int | None = None,
    path: PathSpec = DEFAULT_PATH,
    pkey: PKey | None = None,
    limits: Limits | None = None,
) -> None:
    """Serve clients, several at once within `limits`, until interrupted (or `max_clients`
    were admitted and have left), on the service level, traffic class and P_Key index of
    `path`, the path MTU capped by it; `pkey`: that P_Key table slot, for the first line."""
    log = locked(log)
    with serving(device, port, gid_index, bind, tcp_port, log, "listening", pkey) as (
        listener,
        ladder,
    ):
        server = Acceptor(listener, ladder, log, limits, max_clients, first_endpoint)

        def one(conn: socket.socket, peer: str, ticket: Ticket, remote, deadline: float) -> None:
            try:
                guard = server.guard(ticket, deadline)
                count = _serve_client(ladder, conn, log, peer, path, guard, remote)
                log(f"client {peer} done: {count} pings answered")
            except (wire.ProtocolError, OSError) as e:
                log(f"client {peer} dropped: {getattr(e, 'message', e)}")
            except RefusedError as e:
                _try_send(conn, wire.encode_error(e.message))
            except IbtoolError as e:
                log(f"client {peer} dropped: {e.message}")
                _try_send(conn, wire.encode_error(e.message))

        server.run(one, tells=True)


def locked(log: Log) -> Log:
    """`log`, one line at a time from any thread."""
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            log(line)

    return say


def first_endpoint(buf: bytes) -> tuple[int, object]:
    """The native protocol's first message in `buf`: (bytes still needed, None) or (0, the
    client's Endpoint); garbage raises ProtocolError, an ERROR PeerError."""
    if len(buf) < wire.HEADER.size:
        return wire.HEADER.size - len(buf), None
    kind, length = wire.decode_header(bytes(buf[: wire.HEADER.size]))
    missing = wire.HEADER.size + length - len(buf)
    if missing > 0:
        return missing, None
    value = wire.decode_payload(kind, bytes(buf[wire.HEADER.size :]))
    if kind == wire.MessageType.ERROR:
        raise wire.PeerError(f"peer says: {value}")
    if kind != wire.MessageType.ENDPOINT:
        raise wire.ProtocolError(f"expected ENDPOINT, got {kind.name}")
    return 0, value


@dataclass(eq=False)
class _Pending:
    conn: socket.socket
    fd: int
    peer: str
    ticket: Ticket | None
    deadline: float
    buf: bytearray


class Guard:
    """What a session thread asks of the server: its memory, its QP rebuilds, whether to back
    off, whether to stop; `deadline`: the end of the first handshake (its accept +
    HANDSHAKE_TIMEOUT)."""

    def __init__(self, server: Acceptor, ticket: Ticket, deadline: float):
        self.server, self.ticket, self.deadline = server, ticket, deadline
        self.idle = server.admission.limits.idle_timeout
        self.stop = server.stop
        self.crowded = server.crowded
        self.build_lock = server.build_lock

    def reserve(self, nbytes: int) -> None:
        try:
            self.server.admission.reserve(self.ticket, nbytes)
        except Refused as e:
            raise RefusedError(e.tell or e.reason) from None

    def free(self) -> None:
        self.server.admission.free(self.ticket)

    def before_rebuild(self) -> None:
        """A QP rebuilt on the client's request waits its turn (admission.RECONNECT_RATE)."""
        wait = self.server.admission.rebuild_wait(self.ticket)
        if wait > 0:
            self.stop.wait(wait)


class Acceptor:
    """A server's listener, its handshake table and its session threads (see above)."""

    def __init__(self, listener: socket.socket, ladder, log: Log, limits: Limits | None,
                 max_clients: int | None, first_message):  # fmt: skip
        limits = limits or Limits()
        if limits.per_client_memory > MAX_PING_SIZE:
            limits = dataclasses.replace(limits, per_client_memory=MAX_PING_SIZE)
        self.listener, self.ladder, self.log, self.max_clients = listener, ladder, log, max_clients
        self.first_message = first_message
        self.admission = Admission(limits, log)
        self.stop = threading.Event()
        self.build_lock = threading.Lock()
        self.pending: dict[int, _Pending] = {}
        self.closing: dict[int, tuple[socket.socket, float]] = {}
        self.threads: dict[threading.Thread, socket.socket] = {}
        self.admitted = 0

    def crowded(self) -> bool:
        """More than one session: a quiet one should leave the CPU to the others."""
        return self.admission.sessions > 1

    def guard(self, ticket: Ticket, deadline: float) -> Guard:
        return Guard(self, ticket, deadline)

    def run(self, serve_one, tells: bool) -> None:
        """Accept and read first messages until stopped or `max_clients` were admitted and
        are done; `serve_one(conn, peer, ticket, first, deadline)` runs in a thread per
        session. `tells`: a refused client is told why (an ERROR message) before the close."""
        self.serve_one, self.tells = serve_one, tells
        self.sel = sel = selectors.DefaultSelector()
        self.listener.setblocking(False)
        sel.register(self.listener, selectors.EVENT_READ, None)
        listening = True
        try:
            while not self.stop.is_set():
                self._reap()
                full = self.max_clients is not None and self.admitted >= self.max_clients
                if full and listening:
                    sel.unregister(self.listener)
                    listening = False
                if full and not self.pending and not self.threads and not self.closing:
                    return
                for key, _ in sel.select(self._timeout()):
                    # An entry handled earlier in this round may have gone (dropped for a
                    # new one): only what is still in its table is looked at.
                    if key.data is None:
                        self._accept()
                    elif key.data == "closing":
                        if self.closing.get(key.fd, (None,))[0] is key.fileobj:
                            self._drain(key.fileobj)
                    elif self.pending.get(key.fd) is key.data:
                        self._read(key.data)
                self._expire()
                self.admission.refusals.flush()
        finally:
            self._shutdown()

    def _timeout(self) -> float:
        now = time.monotonic()
        ends = [p.deadline for p in self.pending.values()] + [d for _, d in self.closing.values()]
        wait = min([0.5] + [max(0.0, d - now) for d in ends])
        return wait if not self.threads else min(wait, 0.1)

    def _accept(self) -> None:
        for _ in range(64):  # a backlog at a time, then the others get their turn
            try:
                conn, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: said, then the next round
                self.log(f"accept: {e.strerror or e}")
                return
            peer = f"{addr[0]}:{addr[1]}"
            try:
                ticket = self.admission.connection(addr[0])
            except Refused as e:
                self._refuse(conn, e.tell)
                continue
            except ValueError:  # not an IP peer (cannot happen on a TCP listener)
                conn.close()
                continue
            self.admitted += 1
            _keepalive(conn)
            conn.setblocking(False)
            if len(self.pending) >= MAX_PENDING:
                oldest = min(self.pending.values(), key=lambda p: p.deadline)
                self._drop(oldest, "handshake table full: the oldest handshake dropped")
            deadline = time.monotonic() + HANDSHAKE_TIMEOUT
            pending = _Pending(conn, conn.fileno(), peer, ticket, deadline, bytearray())
            self.pending[conn.fileno()] = pending
            self.sel.register(conn, selectors.EVENT_READ, pending)
            full = self.max_clients is not None and self.admitted >= self.max_clients
            if full:
                return

    def _refuse(self, conn: socket.socket, tell: str | None) -> None:
        if not (self.tells and tell) or len(self.closing) >= MAX_PENDING:
            _close_now(conn)
            return
        try:
            conn.setblocking(False)
            conn.send(wire.encode_error(tell))
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            _close_now(conn)
            return
        # Read what the client sends until it closes: a close with its data unread would be a
        # reset, which may reach it before our reason.
        self.closing[conn.fileno()] = (conn, time.monotonic() + REFUSAL_LINGER)
        self.sel.register(conn, selectors.EVENT_READ, "closing")

    def _drain(self, conn: socket.socket) -> None:
        try:
            if conn.recv(4096):
                return
        except OSError:
            pass
        self._closed(conn)

    def _closed(self, conn: socket.socket) -> None:
        self.closing.pop(conn.fileno(), None)
        self.sel.unregister(conn)
        conn.close()

    def _read(self, p: _Pending) -> None:
        try:
            need, _ = self.first_message(p.buf)
            chunk = p.conn.recv(need)
            if not chunk:
                raise wire.PeerClosed("peer closed the connection")
            p.buf += chunk
            need, first = self.first_message(p.buf)
        except (BlockingIOError, InterruptedError):
            return
        except wire.ProtocolError as e:
            self._drop(p, e.message)
            return
        except OSError as e:
            self._drop(p, wire._lost(e).message)
            return
        if need:
            return
        self._forget(p)
        try:
            self.admission.session(p.ticket)
        except Refused as e:
            self.admission.release(p.ticket)
            if self.tells and e.tell:
                _try_send_now(p.conn, wire.encode_error(e.tell))
            p.conn.close()
            return
        p.conn.setblocking(True)
        thread = threading.Thread(
            target=self._session, args=(p, first), name=f"ping {p.peer}", daemon=True
        )
        self.threads[thread] = p.conn
        thread.start()

    def _session(self, p: _Pending, first) -> None:
        try:
            with p.conn:
                self.serve_one(p.conn, p.peer, p.ticket, first, p.deadline)
        finally:
            self.admission.release(p.ticket)

    def _forget(self, p: _Pending) -> None:
        if self.pending.get(p.fd) is p:
            del self.pending[p.fd]
            self.sel.unregister(p.conn)

    def _drop(self, p: _Pending, why: str) -> None:
        """A handshake that failed: its line (one a source and minute, admission.RefusalLog),
        its connection closed, its slot free."""
        source = p.ticket.source
        self._forget(p)
        _close_now(p.conn)
        self.admission.release(p.ticket)
        self.admission.refusals.note(
            (str(source), "dropped"),
            f"client {p.peer} dropped: {why}",
            lambda n: (
                f"dropped {n} more client{'s' if n > 1 else ''} of {source} in their "
                f"handshake in the last {self.admission.refusals.interval:g} s"
            ),
        )

    def _expire(self) -> None:
        now = time.monotonic()
        for p in [p for p in self.pending.values() if p.deadline <= now]:
            self._drop(p, "peer too slow: handshake timed out")
        for conn, _ in [c for c in self.closing.values() if c[1] <= now]:
            self._closed(conn)

    def _reap(self) -> None:
        for thread in [t for t in self.threads if not t.is_alive()]:
            del self.threads[thread]

    def _shutdown(self) -> None:
        """Every handshake dropped, every session told to stop and waited for: their QPs, CQs
        and MRs are destroyed before the ladder (and its PD) goes."""
        self.stop.set()
        for p in list(self.pending.values()):
            self._forget(p)
            _close_now(p.conn)
            self.admission.release(p.ticket)
        for conn, _ in list(self.closing.values()):
            self._closed(conn)
        for conn in list(self.threads.values()):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it
        for thread in list(self.threads):
            thread.join(30)
        self.sel.close()


def _keepalive(conn: socket.socket) -> None:
    idle, interval, count = KEEPALIVE
    with contextlib.suppress(OSError, AttributeError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


def _close_now(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.close()


def _try_send_now(conn: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(data)


@contextlib.contextmanager
def serving(device: str, port: int, gid_index: int | None, bind: str, tcp_port: int, log: Log,
            saying: str, pkey: PKey | None = None):  # fmt: skip
    """The listening socket and the port's verbs ladder of a server, said in the log as
    `saying` on ADDR:PORT, DEV/PORT, the GID index and the P_Key; both closed on the way
    out."""
    with listen(bind, tcp_port) as listener, Ladder(device, port, gid_index) as ladder:
        log(
            f"{saying} on {bind or '*'}:{listener.getsockname()[1]}, {device}/{port}"
            + (f" gid {gid_index}" if gid_index is not None else "")
            + (f", pkey {pkey.label}" if pkey is not None else "")
        )
        yield listener, ladder


def clients(listener: socket.socket, max_clients: int | None):
    """Each client's connection and its ADDR:PORT, until `max_clients` have come."""
    served = 0
    while max_clients is None or served < max_clients:
        conn, addr = listener.accept()
        served += 1
        yield conn, f"{addr[0]}:{addr[1]}"


def listen(bind: str, tcp_port: int) -> socket.socket:
    """The server's TCP socket, listening; why there is none as an error with a hint."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    where = f"{bind or '*'}:{tcp_port}"
    if bind:
        try:
            socket.getaddrinfo(bind, tcp_port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
        except socket.gaierror as e:
            raise UsageError(
                f"--bind {bind}: not an address ({e.strerror})",
                "give an address of this host, or leave --bind out to listen on all of them",
            ) from None
    try:
        return socket.create_server((bind, tcp_port), family=family, reuse_port=False)
    except OSError as e:
        # create_server's text names the address as a tuple: say it from the errno instead.
        reason = os.strerror(e.errno) if e.errno and e.errno > 0 else str(e)
        if e.errno == errno.EADDRINUSE:
            raise IbtoolError(
                f"cannot listen on {where}: {reason}",
                "another program has the port, perhaps another `ibtool ping --server` "
                "(`ss -ltnp` shows which): stop it, or give both sides another --port",
            ) from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise UsageError(
                f"--bind {bind}: not an address of this host",
                "give one of this host's addresses (`ip address`), or leave --bind out",
            ) from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise PermissionDeniedError(
                f"cannot listen on {where}: {reason}",
                "a port below 1024 needs CAP_NET_BIND_SERVICE: give both sides another --port",
            ) from None
        raise IbtoolError(f"cannot listen on {where}: {reason}") from None


def _try_send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass


def _next_endpoint(conn: socket.socket, timeout: float) -> wire.Endpoint | None:
    """The client's next (re)connect request, or None when it has left."""
    try:
        return wire.receive(conn, timeout, wire.MessageType.ENDPOINT)
    except wire.PeerClosed:
        return None


def _serve_client(
    ladder: Ladder,
    conn: socket.socket,
    log: Log,
    peer: str,
    path: PathSpec,
    guard: Guard | None = None,
    remote: wire.Endpoint | None = None,
) -> int:
    """One client's sessions until it leaves; `remote`: its first ENDPOINT, if read already
    (else read here). Each session's QP, CQ and MR are destroyed before the client is waited
    for again: a client whose QP died holds nothing while it is away."""
    if remote is None:
        remote = wire.receive(conn, _handshake_left(guard), wire.MessageType.ENDPOINT)
    answered, first = 0, True
    while remote is not None:
        if remote.size > MAX_PING_SIZE:  # before anything is registered
            raise IbtoolError(f"ping size {remote.size} exceeds {MAX_PING_SIZE} bytes")
        if guard is not None:
            if not first:
                guard.before_rebuild()
            guard.reserve(max(remote.size, 1))  # the Session's MR, before it is registered
        try:
            remote, n = _one_session(ladder, conn, log, peer, path, guard, remote, first)
        finally:
            if guard is not None:
                guard.free()
        answered += n
        first = False
        if remote is _AWAY:  # the session is closed: now wait for the client's next request
            remote = _next_endpoint(conn, RECONNECT_WAIT)
    return answered


_AWAY = object()  # a session ended, its client may ask for another


def _handshake_left(guard: Guard | None, first: bool = True) -> float:
    if guard is None or not first:
        return HANDSHAKE_TIMEOUT
    return max(0.1, guard.deadline - time.monotonic())


def _one_session(ladder: Ladder, conn: socket.socket, log: Log, peer: str, path: PathSpec,
                 guard: Guard | None, remote: wire.Endpoint, first: bool):  # fmt: skip
    """A QP for the client's request `remote`, its pings answered: (the client's next
    request, or None when it left, or _AWAY; the pings answered). Everything it built is
    destroyed before it returns."""
    if guard is not None:
        with guard.build_lock:  # the ladder's GID is shared by the session threads
            moved = ladder.follow_gid()
    else:
        moved = ladder.follow_gid()
    if moved:
        log(f"client {peer}: {moved}")
    session = Session(ladder, remote.size, remote.mode, path=path)
    try:
        try:
            session.connect(remote)
            session.post_recv()
            session.post_recv()
            wire.send(conn, wire.encode_endpoint(session.endpoint()))
            wire.receive(conn, _handshake_left(guard, first), wire.MessageType.READY)
        except (wire.PeerError, CompletionError) as e:
            log(f"client {peer}: connection not ready: {e.message}")
            return _AWAY, 0
        except IbtoolError as e:
            if isinstance(e, wire.ProtocolError):
                raise
            # Our side cannot connect now (e.g. the link is down): tell the client, which
            # retries later over the same TCP connection.
            log(f"client {peer}: cannot connect: {e.message}")
            wire.send(conn, wire.encode_error(e.message))
            return _AWAY, 0
        log(
            f"client {peer}: qpn {remote.qpn:#x} mode {remote.mode.name.lower()} size {remote.size}"
        )
        try:
            if guard is None:
                return _echo(session, conn)
            return _echo(session, conn, guard.idle, guard.stop, guard.crowded)
        except (CompletionError, QPError) as e:
            log(f"client {peer}: {e.message}")
            return _AWAY, 0
    finally:
        session.close()


def _echo(
    session: Session,
    conn: socket.socket | int | None,
    idle: float | None = None,
    stop: threading.Event | None = None,
    crowded: Callable[[], bool] | None = None,
) -> tuple[wire.Endpoint | None, int]:
    """Answer pings until the client reconnects (new ENDPOINT on `conn`) or leaves (None):
    closes `conn`, or, without one, sends nothing for `idle` seconds. Without `conn` (a
    stock client, whose TCP connection ended with the exchange) each answer is as long as
    the ping it answers. `conn` may be an rdma_cm event channel's descriptor instead: the
    loop returns (None) when an event is there to read, the caller's to handle. With a
    socket `conn` and `idle`, a client that sends nothing for `idle` seconds raises Idle.
    `stop` set: the loop returns (None) within a round.

    From a ping's completion to its answer's post is half of every round trip: everything
    is bound to locals, and the answer is posted before anything else is done.

    Several sessions in one process fight for the GIL when each busy-polls: when `crowded()`
    says another session runs, a session quiet for QUIET_AFTER polls once per BACKOFF_SLEEP
    (time.sleep releases the GIL), once per LONG_SLEEP when quiet for LONG_QUIET, and
    busy-polls again from its next ping on. The cost: the first ping after a pause waits up
    to 1 ms more (a pause under 2 s: `-i 1`), 5 ms after a longer one; a session alone
    busy-polls as before. An idle session wakes 200 times a second, not millions.
    """
    session.answered = answered = 0
    seen = -1
    last = time.monotonic()  # the last ping's round, for the back-off
    quiet_since = last + HANDSHAKE_TIMEOUT  # the first ping may take a while
    cq, attr, cadence = session.polled, session.poll_attr, session.cadence
    post_send = session.qp.post_send
    start, end, opcode_of, imm_of = cq.start_poll, cq.end_poll, cq.read_opcode, cq.read_imm_data
    echo_imm, rearm = session.with_imm, session.post_recv
    echo_length, empty, polls = conn is None, ENOENT, ECHO_ROUND
    while True:
        for _ in polls:  # as in Client.ping: an empty poll is a call and a comparison
            rc = start(attr)
            if rc != empty:
                break
        else:  # that many empty polls in a row (a few ms): look at the TCP side
            if conn is None:
                now = time.monotonic()
                if answered != seen:
                    seen, quiet_since, last = answered, now if answered else quiet_since, now
                elif now - quiet_since > idle:
                    return None, answered
            elif select.select([conn], [], [], 0)[0]:
                if not isinstance(conn, socket.socket):
                    return None, answered
                return _next_endpoint(conn, HANDSHAKE_TIMEOUT), answered
            elif idle is not None or crowded is not None:
                now = time.monotonic()
                if answered != seen:
                    seen, quiet_since, last = answered, now if answered else quiet_since, now
                elif idle is not None and now - quiet_since > idle:
                    raise Idle(f"sent nothing for {idle:g} s (--idle-timeout)")
            if stop is not None and stop.is_set():
                return None, answered
            if crowded is not None and now - last > QUIET_AFTER and crowded():
                polls = BACKOFF_ROUND
                time.sleep(BACKOFF_SLEEP if now - last < LONG_QUIET else LONG_SLEEP)
            continue
        if rc:
            raise poll_failed(rc)
        try:
            status = cq.status
            if status:
                raise CompletionError.of(status, cq.read_vendor_err(), "ping reply")
            if not opcode_of() & 128:
                continue  # a (signaled) send's completion: nothing to do
            if echo_length and cq.read_byte_len() != session.size:
                session.answer_with(cq.read_byte_len())
                cadence = session.cadence
            wr = cadence[(answered + 1) % SIGNAL_EVERY]
            if echo_imm:
                wr.imm_data = imm_of()  # as received, in network order
            # The answer (same bytes, same immediate) goes before anything else, even the
            # end of the poll: it touches the QP only, never this CQ.
            post_send(wr)
        except session.ladder.pv.Error as e:
            raise QPError(f"post the answer: {e}") from None
        finally:
            end()
        rearm()  # the spare receive posted up front covers the client's next ping
        answered += 1
        polls = ECHO_ROUND  # busy again, if it had backed off
        session.answered = answered  # what was answered, when a failure ends the loop


# -- client ------------------------------------------------------------------------------


@dataclass
class PingStats:
    sent: int = 0
    received: int = 0
    errors: int = 0
    started: float = 0.0
    elapsed: float = 0.0

    def summary(self, rtts: list[float]) -> dict:
        import statistics

        if not rtts:
            return {"min": None, "avg": None, "median": None, "max": None, "mdev": None}
        avg = statistics.fmean(rtts)
        mdev = (statistics.fmean([(r - avg) ** 2 for r in rtts])) ** 0.5
        return {
            "min": min(rtts),
            "avg": avg,
            "median": statistics.median(rtts),
            "max": max(rtts),
            "mdev": mdev,
        }


class Client:
    hw: HwClock | None = None  # --hw-timestamps; subclasses that build themselves keep None
    hw_us: float | None = None  # the last round trip on the HCA's clock
    on_note: Callable[[str], None] | None = None  # told what changed under a reconnection
    _wheel = b""  # loopback.pattern_wheel of the ping size, made by the first ping

    def __init__(
        self,
        ladder: Ladder,
        host: str,
        tcp_port: int,
        size: int,
        mode: wire.Mode,
        timeout: float,
        path: PathSpec = DEFAULT_PATH,
        hw: HwClock | None = None,
    ):
        self.ladder, self.size, self.mode, self.timeout = ladder, size, mode, timeout
        self.path, self.hw, self.hw_us = path, hw, None
        self.server = f"{host}:{tcp_port}"
        try:
            self.conn = socket.create_connection((host, tcp_port), timeout=HANDSHAKE_TIMEOUT)
        except OSError as e:
            raise IbtoolError(
                f"cannot reach the ping server at {host}:{tcp_port}: {e.strerror or e}",
                "start it there with `ibtool ping --server`",
            ) from None
        self.session: Session | None = None

    def close(self) -> None:
        if self.session:
            self.session.close()
            self.session = None
        self.conn.close()

    def connect(self) -> None:
        """(Re)build our QP and the server's, over the same TCP connection."""
        if self.session:
            self.session.close()
            self.session = None
        moved = self.ladder.follow_gid()
        if moved and self.on_note:
            self.on_note(moved)
        session = Session(self.ladder, self.size, self.mode, path=self.path, stamped=bool(self.hw))
        try:
            wire.send(self.conn, wire.encode_endpoint(session.endpoint()))
            remote = wire.receive(self.conn, HANDSHAKE_TIMEOUT, wire.MessageType.ENDPOINT)
            if remote.mode != self.mode:
                raise wire.ProtocolError(f"server answered in mode {remote.mode.name}")
            try:
                session.connect(remote)
            except IbtoolError as e:
                wire.send(self.conn, wire.encode_error(e.message))  # the server waits for a retry
                raise
            wire.send(self.conn, wire.encode(wire.MessageType.READY))
        except wire.PeerError as e:
            session.close()
            if e.message.startswith(REFUSED):
                # A limit of the server turned this client away and it closes the connection:
                # no retry can succeed, the run ends with the server's reason.
                raise SessionEnded(
                    e.message,
                    f"the ping server at {self.server} limits its clients (ibtool-ping(8), "
                    "LIMITS): try again later, or ask its operator",
                ) from None
            raise
        except BaseException as e:
            session.close()
            if isinstance(e, wire.ProtocolError) and e.hint is None:
                e.hint = self._hint(e)
            raise
        self.session = session

    def _hint(self, e: wire.ProtocolError) -> str | None:
        if isinstance(e, wire.PeerError):
            return None  # the server's own reason: the session is retried
        if isinstance(e, wire.ConnectionLost):
            return (
                f"the ping server at {self.server} stopped or dropped this client; its log says why"
            )
        return f"is what listens at {self.server} an `ibtool ping --server` of this version?"

    def ping(self, seq: int) -> float:
        """One round trip; its RTT in microseconds.

        Between the two clock reads: the post and the polling, nothing else. The payload,
        the receive for the reply and the immediate are set up before; the timeout is
        checked every POLL_ROUND empty polls; the checks of the reply come after. An empty
        poll is a call and a comparison (a `for` over a range, no counter of our own): the
        reply is seen within one such poll of its arrival, and under the testbed's emulated
        CPU each Python step is ~0.3 us of the round trip.
        """
        s = self.session
        size, timeout, clock = self.size, self.timeout, time.perf_counter
        (cadence, post_send, recv_wr, post_recv), polling, (write, read) = s.hot
        wr = cadence[seq % SIGNAL_EVERY]
        cq, attr, start, end, opcode_of, imm_of = polling
        wheel = self._wheel
        if len(wheel) < size + 256:  # the first ping, or a new size
            wheel = self._wheel = pattern_wheel(size)
        offset = seq * 31 % 256
        payload = wheel[offset : offset + size]  # pattern(seq, size)
        write(payload, size, 0)
        try:
            post_recv(recv_wr)
        except s.ladder.pv.Error as e:
            raise QPError(f"post receive: {e}") from None
        with_imm, imm = s.with_imm, 0
        if with_imm:
            wr.imm_data = imm = socket.htonl(seq & 0xFFFFFFFF)
        hw, empty, polls = self.hw, ENOENT, POLL_ROUND
        c0 = hw.now() if hw else 0  # the HCA's counter, as close to the post as it gets
        t0 = clock()
        try:
            post_send(wr)
        except s.ladder.pv.Error as e:
            raise QPError(f"ping {seq}: post send: {e}") from None
        while True:
            for _ in polls:
                rc = start(attr)
                if rc != empty:
                    break
            else:
                if clock() - t0 > timeout:
                    raise CompletionTimeout(f"ping {seq}: no reply before the timeout")
                continue
            t1 = clock()  # before the completion is read: that is not the round trip's
            if rc:
                raise poll_failed(rc)
            try:
                status = cq.status
                if status or opcode_of() & 128:  # a failure, or the reply
                    got_imm = imm_of() if with_imm and not status else imm
                    vendor_err = cq.read_vendor_err() if status else 0
                    got_len = cq.read_byte_len() if not status else size
                    stamp = cq.read_timestamp() if hw and not status else c0
                    break
            finally:
                end()  # also for a (signaled) send's completion, passed over
        if status:
            raise CompletionError.of(status, vendor_err, f"ping {seq}")
        if got_len != size:
            raise ReplySizeError(seq, got_len, size)
        if got_imm != imm:
            raise IbtoolError(f"reply carries immediate {socket.ntohl(got_imm)}, want {seq}")
        if read(size, 0) != payload:
            raise IbtoolError(f"reply {seq} payload differs from what was sent")
        self.hw_us = hw.us(stamp - c0) if hw else None
        return (t1 - t0) * 1e6


def run_client(
    client: Client,
    count: int | None,
    interval: float,
    deadline: float | None,
    on_reply: Callable[[int, float, float | None], None],
    on_loss: Callable[[int, str], None],
    stats: PingStats,
    rtts: list[float],
) -> None:
    """Ping until `count` pings, `deadline` seconds or an error that ends the run, into
    `stats` and `rtts`. A reply goes to on_reply(seq, rtt_us, hw_us) (hw_us: the HCA's
    clock, with --hw-timestamps, else None); a lost ping to on_loss(seq, reason).

    With -i 0 this loop is all that runs between two pings, and under the testbed's
    emulated CPU the wall time between them is what stalls land on: the counts are locals,
    written to `stats` on every way out, and a reply is three arguments, not an object."""
    monotonic, ping, keep = time.monotonic, client.ping, rtts.append
    started = stats.started = monotonic()
    seq = received = unsent = 0
    try:
        while count is None or seq < count:
            if deadline is not None and monotonic() - started >= deadline:
                break
            seq += 1
            t_start = monotonic() if interval > 0 else 0.0
            try:
                if client.session is None:
                    client.connect()
                rtt = ping(seq)
            except IbtoolError as e:
                if isinstance(e, wire.ProtocolError) and not isinstance(e, wire.PeerError):
                    unsent = 1  # it ends the run before this ping went out
                    raise
                stats.errors += 1
                on_loss(seq, e.message)
                if isinstance(e, SessionEnded):
                    raise
                if client.session is not None:
                    client.session.close()
                    client.session = None  # a dead QP: rebuild before the next ping
            else:
                received += 1
                keep(rtt)
                on_reply(seq, rtt, client.hw_us)
            if interval > 0 and (count is None or seq < count):
                time.sleep(max(0.0, interval - (monotonic() - t_start)))
    finally:
        stats.sent, stats.received = seq - unsent, received
        stats.elapsed = monotonic() - started
