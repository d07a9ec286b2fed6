"""A TCP ping server's front door: the listening socket, the handshake table, the admission
limits (admission.py) and a thread per admitted session.

A server faces the network for months (admission.py says what it bounds). One thread, the
one Acceptor.run runs in, accepts and reads every client's first message through a selector,
non-blocking: a connection that stays idle, sends half a message or garbage holds a table
entry until HANDSHAKE_TIMEOUT, never a thread, and never delays another client's handshake
(the cost of a handshake on that thread is one recv() of at most one message). Only a
complete, valid first message gets a thread of its own, which registers memory, builds the
QP, answers and echoes: at most --max-sessions of them. A thread per session rather than
one loop for all: each echo loop busy-polls its CQ for latency, and a session blocked on
its client's READY or reconnect must not hold the others.

The handshake table is bounded too (MAX_PENDING): past it the oldest entry is dropped, so a
flood of idle connections from many sources can only delay a client that is slower than
MAX_PENDING new connections; a source holds at most --max-per-source of them.

The native protocol (server.py) and rc_pingpong's (pingpong.py) are served through it; each
brings the parser of its first message and what a session thread does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import selectors
import socket
import threading
import time

from ibtool.errors import IbtoolError, PermissionDeniedError, UsageError
from ibtool.model.deferred import dataclass
from ibtool.rdma import wire
from ibtool.rdma.ladder import Ladder
from ibtool.rdma.ping.admission import Admission, Limits, Refused, Ticket
from ibtool.rdma.ping.options import ServeOptions
from ibtool.rdma.ping.session import HANDSHAKE_TIMEOUT, MAX_PING_SIZE, Log

MAX_PENDING = 64  # handshakes read at once; past it the oldest is dropped
REFUSAL_LINGER = 1.0  # s a refused client has to read why before its connection is closed
# TCP keepalive on every accepted connection (tcp(7): TCP_KEEPIDLE, TCP_KEEPINTVL,
# TCP_KEEPCNT): a client host that vanished is noticed within 10 + 5 * 3 s of silence.
KEEPALIVE = (10, 5, 3)


class RefusedError(IbtoolError):
    """A limit refused the client's request (admission.py has logged it, once a source and
    interval): the client is told, the log says no more."""


def locked(log: Log) -> Log:
    """`log`, one line at a time from any thread."""
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            log(line)

    return say


@dataclass(eq=False)
class Pending:
    """A connection whose first message is being read: its slot in the handshake table."""

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
        self.pending: dict[int, Pending] = {}
        self.closing: dict[int, tuple[socket.socket, float]] = {}
        self.threads: dict[threading.Thread, socket.socket] = {}
        self.admitted = 0

    def crowded(self) -> bool:
        """More than one session: a quiet one should leave the CPU to the others."""
        return self.admission.sessions > 1

    def run(self, serve_one, tells: bool) -> None:
        """Accept and read first messages until stopped or `max_clients` were admitted and
        are done; `serve_one(conn, peer, guard, first)` runs in a thread per
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
            pending = Pending(conn, conn.fileno(), peer, ticket, deadline, bytearray())
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

    def _read(self, p: Pending) -> None:
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
            self._drop(p, wire.connection_lost(e).message)
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

    def _session(self, p: Pending, first) -> None:
        try:
            with p.conn:
                self.serve_one(p.conn, p.peer, Guard(self, p.ticket, p.deadline), first)
        finally:
            self.admission.release(p.ticket)

    def _forget(self, p: Pending) -> None:
        if self.pending.get(p.fd) is p:
            del self.pending[p.fd]
            self.sel.unregister(p.conn)

    def _drop(self, p: Pending, why: str) -> None:
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
    """TCP keepalive on `conn` (KEEPALIVE), where the platform has the options."""
    idle, interval, count = KEEPALIVE
    with contextlib.suppress(OSError, AttributeError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


def _close_now(conn: socket.socket) -> None:
    """Close `conn`; a failing close is no news."""
    with contextlib.suppress(OSError):
        conn.close()


def _try_send_now(conn: socket.socket, data: bytes) -> None:
    """Send `data` if the socket takes it without blocking; else nothing."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(data)


@contextlib.contextmanager
def serving(options: ServeOptions, log: Log, saying: str):
    """The listening socket and the verbs ladder on `options`' device of a server, said in
    `log` as `saying` on ADDR:PORT, DEV/PORT, the GID index and the P_Key; both closed on the
    way out."""
    device, port, gid_index = options.device, options.device_port, options.gid_index
    with listen(options.bind, options.listen_port) as listener:
        with Ladder(device, port, gid_index) as ladder:
            log(
                f"{saying} on {options.bind or '*'}:{listener.getsockname()[1]}, {device}/{port}"
                + (f" gid {gid_index}" if gid_index is not None else "")
                + (f", pkey {options.pkey.label}" if options.pkey is not None else "")
            )
            yield listener, ladder


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
