"""`ibtool ping --server`: the native protocol's sessions, one client's QPs rebuilt on request.

Each admitted client (acceptor.py) gets a thread that builds a Session for its ENDPOINT,
answers with its own, waits for READY and echoes (echo.py) until the client reconnects or
leaves; a client whose QP died holds nothing while it is away.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

from ibtool.errors import IbtoolError
from ibtool.rdma import wire
from ibtool.rdma.completions import CompletionError
from ibtool.rdma.ladder import Ladder, PathSpec
from ibtool.rdma.ping.acceptor import Acceptor, Guard, RefusedError, locked, serving
from ibtool.rdma.ping.echo import answer_pings
from ibtool.rdma.ping.options import ServeOptions
from ibtool.rdma.ping.session import (
    HANDSHAKE_TIMEOUT,
    MAX_PING_SIZE,
    Log,
    QPError,
    Session,
    next_endpoint,
)

RECONNECT_WAIT = 600.0  # how long a server keeps a client whose QP died before it returns


def serve(
    options: ServeOptions,
    *,
    facts: Callable[[], bytes] | None = None,
    stop: threading.Event | None = None,
    listening: Callable[[], None] | None = None,
) -> None:
    """Serve clients, several at once within `options.limits`, until interrupted (or
    `options.max_clients` were admitted and have left), on the service level, traffic class
    and P_Key index of `options.path`, the path MTU capped by it; a client that sends nothing
    for the limits' idle_timeout is dropped (`options.idle` is not taken: one bound, not two).
    `facts`: what answers an `ibtool doctor` query (this side's facts as JSON), None to refuse
    such queries; `stop`: set, the server stops as on an interrupt (an `ibtool mesh` agent's
    end); `listening`: called once the socket listens and the port's verbs are open."""
    options.require("the ping server", "device", "device_port")
    options.refuse("the ping server", "idle")
    log, path, limits = locked(options.log), options.path, options.limits
    with serving(options, log, "listening") as (listener, ladder):
        server = Acceptor(listener, ladder, log, limits, options.max_clients, first_endpoint)
        if stop is not None:
            server.stop = stop
        if listening is not None:
            listening()

        def one(conn: socket.socket, peer: str, guard: Guard, remote) -> None:
            if remote is wire.MessageType.FACTS_QUERY:
                answer_facts(conn, peer, log, facts)
                return
            try:
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


def answer_facts(conn: socket.socket, peer: str, log: Log, facts: Callable[[], bytes] | None):
    """An `ibtool doctor` query: this side's facts, then the close; nothing is built."""
    if facts is None:
        _try_send(conn, wire.encode_error("this server does not answer doctor queries"))
        log(f"client {peer}: doctor query refused")
        return
    try:
        answer = wire.encode(wire.MessageType.FACTS, facts())
    except (IbtoolError, OSError, ValueError) as e:
        why = getattr(e, "message", None) or str(e)
        _try_send(conn, wire.encode_error(f"facts not read: {why}"))
        log(f"client {peer}: doctor query failed: {why}")
        return
    _try_send(conn, answer)
    log(f"client {peer}: doctor query answered")


def first_endpoint(buf: bytes) -> tuple[int, object]:
    """The native protocol's first message in `buf`: (bytes still needed, None) or (0, the
    client's Endpoint, or MessageType.FACTS_QUERY for `ibtool doctor`); garbage raises
    ProtocolError, an ERROR PeerError."""
    if len(buf) < wire.HEADER.size:
        return wire.HEADER.size - len(buf), None
    kind, length = wire.decode_header(bytes(buf[: wire.HEADER.size]))
    missing = wire.HEADER.size + length - len(buf)
    if missing > 0:
        return missing, None
    value = wire.decode_payload(kind, bytes(buf[wire.HEADER.size :]))
    if kind == wire.MessageType.ERROR:
        raise wire.PeerError(f"peer says: {value}")
    if kind == wire.MessageType.FACTS_QUERY:
        return 0, kind
    if kind != wire.MessageType.ENDPOINT:
        raise wire.ProtocolError(f"expected ENDPOINT, got {kind.name}")
    return 0, value


def _try_send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass


def _serve_client(ladder: Ladder, conn: socket.socket, log: Log, peer: str, path: PathSpec,
                  guard: Guard, remote: wire.Endpoint | None) -> int:  # fmt: skip
    """One client's sessions until it leaves; `remote`: its first ENDPOINT, read by the
    Acceptor. Each session's QP, CQ and MR are destroyed before the client is waited for
    again: a client whose QP died holds nothing while it is away."""
    answered, first = 0, True
    while remote is not None:
        if remote.size > MAX_PING_SIZE:  # before anything is registered
            raise IbtoolError(f"ping size {remote.size} exceeds {MAX_PING_SIZE} bytes")
        if not first:
            guard.before_rebuild()
        guard.reserve(max(remote.size, 1))  # the Session's MR, before it is registered
        try:
            remote, n = _one_session(ladder, conn, log, peer, path, guard, remote, first)
        finally:
            guard.free()
        answered += n
        first = False
        if remote is _AWAY:  # the session is closed: now wait for the client's next request
            remote = next_endpoint(conn, RECONNECT_WAIT)
    return answered


_AWAY = object()  # a session ended, its client may ask for another


def _handshake_left(guard: Guard, first: bool) -> float:
    if not first:
        return HANDSHAKE_TIMEOUT
    return max(0.1, guard.deadline - time.monotonic())


def _one_session(ladder: Ladder, conn: socket.socket, log: Log, peer: str, path: PathSpec,
                 guard: Guard, remote: wire.Endpoint, first: bool):  # fmt: skip
    """A QP for the client's request `remote`, its pings answered: (the client's next
    request, or None when it left, or _AWAY; the pings answered). Everything it built is
    destroyed before it returns."""
    with guard.build_lock:  # the ladder's GID is shared by the session threads
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
            return answer_pings(session, conn, guard.idle, guard.stop, guard.crowded)
        except (CompletionError, QPError) as e:
            log(f"client {peer}: {e.message}")
            return _AWAY, 0
    finally:
        session.close()
