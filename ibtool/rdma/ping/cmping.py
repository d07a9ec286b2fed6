"""`ibtool ping --cm`: ibtool's own RC ping (session.py) connected through rdma_cm, both sides.

No TCP side channel: the client resolves the server's IP address and route with rdma_cm (the
kernel picks device, port and GID) and what the TCP exchange carries (ping mode and size, and
for WRITE WITH IMM each side's buffer) rides in the connection's private data (wire.py,
encode_cm). The QP is session.Session's own, on the id's device and PD, connected by rdma_cm
(cm.Connection.connect_qp), so the hot loops are the native ping's: client.Client.ping and
echo.answer_pings.

    client: REQ  [REQUEST mode size (buffer)]  -> server: QP to RTS, receives posted
    server: REP  [ACCEPT  mode size (buffer)]  -> client: QP to RTS, rdma_establish (RTU)
    server: REJ  [REFUSE reason]                  when the request is not one it can serve

The server serves one client at a time; a client leaves with rdma_disconnect (DREQ), which the
server sees as RDMA_CM_EVENT_DISCONNECTED. Each request passes the server's limits first
(Gate: admission.py's, by the address the kernel tells), before anything is built for it;
this module's Gate serves `--compat rping`'s server (rping.py) too.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

from ibtool.errors import IbtoolError, UnsupportedError
from ibtool.rdma import cm, wire
from ibtool.rdma.hwclock import HwClock
from ibtool.rdma.ladder import DEFAULT_PATH, PathSpec
from ibtool.rdma.ping import client
from ibtool.rdma.ping.admission import Admission, Limits, Refused, source_of
from ibtool.rdma.ping.echo import answer_pings
from ibtool.rdma.ping.options import ServeOptions
from ibtool.rdma.ping.serial import serve_clients
from ibtool.rdma.ping.session import MAX_PING_SIZE, Log, Session, SessionEnded

BUSY = "while another client is served (one at a time)"  # a refusal's reason in the log


class CmRefused(IbtoolError):
    """The remote CM answered the request with a REJ: its RDMA stack is there."""


class CmUnreachable(IbtoolError):
    """No RDMA path to the address, or no answer to the request."""


def _require_private_data(rdmacm) -> None:
    cmid = rdmacm.cmid
    if not (hasattr(cmid.CMEvent, "private_data") and hasattr(cmid.ConnParam, "set_private_data")):
        raise UnsupportedError(
            "ibtool ping --cm needs rdma_cm connection private data, which this pyverbs lacks",
            "upgrade python3-pyverbs to rdma-core 42 or later, or ping over TCP (leave --cm out)",
        )


def _param(conn: cm.Connection, qp, data: bytes):
    # No RDMA READ or atomics: 0 responder resources and initiator depth, so the CM grants the
    # QP remote write only (ib_cm.c, cm_init_qp_init_attr). Retries as rping.c's.
    param = conn.cm.cmid.ConnParam(
        resources=0, depth=0, retry=7, rnr_retry=7, qp_num=qp.qp_num, data_len=len(data)
    )
    param.set_private_data(data)
    return param


def _offer(session: Session) -> wire.CmOffer:
    if session.mode == wire.Mode.WRITE_IMM:
        return wire.CmOffer(session.mode, session.size, session.mr.buf, session.mr.rkey)
    return wire.CmOffer(session.mode, session.size)


# -- client ------------------------------------------------------------------------------------


class Client(client.Client):
    """client.Client's round trip (ping()) on a QP that rdma_cm connected."""

    def __init__(
        self,
        host: str,
        port: int,
        size: int,
        mode: wire.Mode,
        timeout: float,
        path: PathSpec = DEFAULT_PATH,
        hw_timestamps: bool = False,
    ):
        """`path`: the operator's service level, traffic class and MTU cap (cm.connect_qp);
        after connecting, `used` is the path the QP is on. `hw_timestamps`: time each ping on
        the HCA's clock too (hwclock.HwClock), that of the device rdma_cm chose, made anew
        with each connection (a reconnection may land on another device)."""
        self.host, self.port, self.size, self.mode, self.timeout = host, port, size, mode, timeout
        self.path = self.used = path
        self.hw_timestamps = hw_timestamps
        self.server = cm.peer_name(host, port)
        self.session: Session | None = None
        self.conn: cm.Connection | None = None
        self.device = "?"
        _require_private_data(cm.rdmacm())
        self.connect()  # up front: a server not there is one error, not a loss per ping
        self.connected_once = True

    connected_once = False

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()  # the session first (Connection.keep), then the id
            self.conn = None
        self.session = None

    def connect(self) -> None:
        self.close()
        try:
            conn = cm.resolve(self.host, self.port)
        except IbtoolError as e:
            raise self._ended(
                CmUnreachable(f"{self.server} is unreachable: {e.message}", e.hint)
            ) from None
        try:
            hw = HwClock(conn) if self.hw_timestamps else None
            session = Session(conn, self.size, self.mode, stamped=hw is not None)
            conn.keep(session.close)
            data = wire.encode_cm(wire.CmMessage.REQUEST, _offer(session))
            param = _param(conn, session.qp, data)
            conn.checked(lambda: conn.cmid.connect(param), f"connect to {self.server}")
            offer = self._response(conn)
            used = conn.connect_qp(session.qp, self.path)
            conn.checked(conn.cmid.establish, "complete the connection (rdma_establish)")
            conn.established = True
            conn.keep(conn.disconnect)
            session.ready(offer)
            self.device = conn.device
        except BaseException:
            conn.close()
            raise
        self.conn, self.session, self.used, self.hw = conn, session, used, hw

    def _ended(self, e: IbtoolError) -> IbtoolError:
        """A reconnect (after a QP died) that cannot be made ends the run, as a lost ping."""
        if self.connected_once:
            return SessionEnded(e.message, e.hint)
        return e

    def _response(self, conn: cm.Connection) -> wire.CmOffer:
        got = conn.channel.next(cm.CONNECT_TIMEOUT)
        if got is None:
            raise self._ended(
                CmUnreachable(
                    f"{self.server} is unreachable: no answer to the connection request within "
                    f"{cm.CONNECT_TIMEOUT:.0f} s",
                    "is the peer up, and its RDMA port ACTIVE (rdma link)?",
                )
            )
        if got.child is not None:
            cm.reject_request(got.child)
        types = conn.cm.e.rdma_cm_event_type
        if got.kind == types.RDMA_CM_EVENT_CONNECT_RESPONSE:
            try:
                offer = wire.decode_cm(got.private_data, wire.CmMessage.ACCEPT, self.size)
                if (offer.mode, offer.size) != (self.mode, self.size):
                    raise wire.ProtocolError(
                        f"the server accepted mode {offer.mode.name} size {offer.size}, "
                        f"asked for {self.mode.name} size {self.size}"
                    )
            except wire.ProtocolError as e:
                raise wire.ProtocolError(
                    f"{self.server} accepted the connection, but: {e.message}",
                    f"is what listens at {self.server} `ibtool ping --server --cm` of this "
                    "version?",
                ) from None
            return offer
        if got.kind == types.RDMA_CM_EVENT_REJECTED:
            raise self._ended(self._rejected(got))
        raise self._ended(
            CmUnreachable(
                f"{self.server} is unreachable: the connection request failed ({got.name})",
                "the address resolved but no CM answered: is the peer up, and its RDMA port "
                "ACTIVE (rdma link)?",
            )
        )

    def _rejected(self, got: cm.Event) -> IbtoolError:
        try:
            reason = wire.decode_cm(got.private_data, wire.CmMessage.REFUSE, 0)
        except wire.ProtocolError:
            # A REJ without ibtool's data: the remote CM's own (no listener on the port: IBTA
            # reject reason 8, invalid service ID) or another program's listener.
            return CmRefused(
                f"{self.server} refused the connection ({got.name}): its RDMA stack answered, "
                f"but no ibtool ping server listens on port {self.port}",
                "start `ibtool ping --server --cm --bind ADDR` there, or give the --port it "
                "listens on",
            )
        return CmRefused(f"the ping server at {self.server} refused this client: {cm.told(reason)}")

    def ping(self, seq: int) -> float:
        # Between pings, not in the timed part: the server's disconnect ends the run with its
        # reason instead of a timeout per ping.
        try:
            self.conn.check_events()
        except cm.Disconnected as e:
            raise cm.Disconnected(
                f"the ping server at {self.server} disconnected ({e.message})",
                "it stopped, or dropped this client: its log says why",
            ) from None
        return super().ping(seq)


# -- the limits of an rdma_cm server ----------------------------------------------------------


class Gate:
    """What an rdma_cm server (this one, rping.py's) lets in, by the limits of admission.py:
    each connection request's source (cm.Listener.source: the kernel's word) and its memory
    (`memory(conn)`: the bytes it would register), before anything is built for it. A
    request turned down gets a REJ with the reason (an ibtool client prints it) and its id is
    destroyed; the log says it once a source, reason and minute (admission.RefusalLog). A
    request while a client is served passes the same checks, then is turned down as busy."""

    def __init__(self, listener: cm.Listener, limits: Limits | None, log: Log,
                 memory: Callable[[cm.Connection], int]):  # fmt: skip
        limits = limits or Limits()
        if limits.per_client_memory > MAX_PING_SIZE:
            limits = dataclasses.replace(limits, per_client_memory=MAX_PING_SIZE)
        self.listener, self.memory = listener, memory
        self.admission = Admission(limits, log)

    def admit(self, conn: cm.Connection) -> bytes | None:
        """cm.Listener.request's `admit`: None lets `conn` in (its slot and memory given back
        when it closes), else the REJ's private data."""
        conn.source = source = self.listener.source(conn.cmid)
        try:
            ticket = self._ticket(source)
        except Refused as e:
            return _refusal(e)
        try:
            self.admission.session(ticket)
            self.admission.reserve(ticket, self.memory(conn))
        except Refused as e:
            self.admission.release(ticket)
            return _refusal(e)
        conn.keep(lambda: self.admission.release(ticket))  # after its MRs are deregistered
        conn.on_request = lambda child: self.turn_down(child, conn.busy)
        return None

    def _ticket(self, source: cm.Source):
        if source.address is None:
            return self.admission.unknown(source.unknown)
        return self.admission.connection(source.address)

    def turn_down(self, child, busy: bytes = b"") -> None:
        """A request (its child id) while a client is served: refused by the limits, with
        their reason, or else as busy; its id destroyed either way."""
        source = self.listener.source(child)
        try:
            if source.address is not None or self.admission.limits.allow:
                self.admission.release(self._ticket(source))
        except Refused as e:
            data = _refusal(e)
        else:
            self.admission.refused(_address(source), BUSY, source.unknown)
            data = busy or wire.encode_cm(
                wire.CmMessage.REFUSE, "busy: serving another client, one at a time"
            )
        with contextlib.suppress(Exception):
            child.reject(data)
        cm.reject_request(child)

    def tick(self) -> None:
        """Say the repeats of the refusals whose minute is over."""
        self.admission.refusals.flush()


def _refusal(e: Refused) -> bytes:
    return wire.encode_cm(wire.CmMessage.REFUSE, e.tell or f"refused: connection {e.reason}")


def _address(source: cm.Source):
    """The address of `source` as admission.py keys it; None where it is unknown."""
    return None if source.address is None else source_of(source.address)


def asked_memory(conn: cm.Connection) -> int:
    """The bytes a request's Session would register: its ping size (0 for a request that is
    no ibtool's: _serve_client refuses it, nothing registered)."""
    try:
        offer = wire.decode_cm(conn.private_data, wire.CmMessage.REQUEST, MAX_PING_SIZE)
    except wire.ProtocolError:
        return 0
    return max(offer.size, 1)


# -- server ------------------------------------------------------------------------------------


def serve(options: ServeOptions) -> None:
    """Serve clients one after another until interrupted (or `options.max_clients` were
    served), the answers on the service level, traffic class and MTU cap of `options.path`
    (cm.connect_qp); a client that sends no ping for `options.idle` seconds (--idle-timeout;
    None: no bound) is dropped, so that one idle client cannot hold the server. Each request
    passes `options.limits` first (Gate). rdma_cm picks the device and the P_Key by the
    address: the options that would choose them are refused."""
    options.refuse("the rdma_cm ping server", "device", "device_port", "gid_index", "pkey")
    log, path, idle = options.log, options.path, options.idle
    rdmacm = cm.rdmacm()
    _require_private_data(rdmacm)
    with cm.Listener(options.bind, options.listen_port) as listener:
        if listener.channel.fd is None:
            raise UnsupportedError(
                "cannot watch the rdma_cm events: the event channel's descriptor was not found "
                f"in /proc/self/fd (no {cm.RDMA_CM_DEVICE})",
                "ping over TCP instead (leave --cm out)",
            )
        gate = Gate(listener, options.limits, log, asked_memory)
        log(f"listening on {listener.where} (rdma_cm), {listener.device}")
        serve_clients(
            lambda: listener.request(gate.admit, gate.tick),
            options.max_clients,
            log,
            lambda conn, who: _serve_client(listener, conn, log, who, path, idle),
        )


def _serve_client(
    listener: cm.Listener,
    conn: cm.Connection,
    log: Log,
    who: str,
    path: PathSpec,
    idle: float | None = None,
) -> int:
    try:
        offer = wire.decode_cm(conn.private_data, wire.CmMessage.REQUEST, MAX_PING_SIZE)
    except wire.ProtocolError as e:
        _refuse(conn, e.message)
        raise
    conn.busy = wire.encode_cm(wire.CmMessage.REFUSE, f"busy: serving {who}, one at a time")
    session = Session(conn, offer.size, offer.mode)
    conn.keep(session.close)
    used = conn.connect_qp(session.qp, path)
    session.ready(offer)
    session.post_recv()
    session.post_recv()  # the spare: the client's next ping may come before the echo's re-post
    data = wire.encode_cm(wire.CmMessage.ACCEPT, _offer(session))
    param = _param(conn, session.qp, data)
    conn.checked(lambda: conn.cmid.accept(param), "accept the connection")
    conn.await_established("accept", who)
    mode = offer.mode.name.lower().replace("_", "-")  # as --mode spells it
    log(f"{who} connected on {conn.device}: mode {mode} size {offer.size}, {used.describe()}")
    answered = 0
    while True:
        # answer_pings returns when a CM event is there: the client's disconnect, or a request of
        # another client (turned down by check_events: one client at a time).
        _, n = answer_pings(session, listener.channel.fd, idle)
        answered += n
        try:
            conn.check_events()
        except cm.Disconnected:
            return answered


def _refuse(conn: cm.Connection, reason: str) -> None:
    """Reject the request with our reason in the REJ (rdma_reject); the id goes with conn."""
    with contextlib.suppress(conn.pv.Error):
        conn.cmid.reject(wire.encode_cm(wire.CmMessage.REFUSE, reason))
