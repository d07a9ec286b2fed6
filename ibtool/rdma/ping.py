"""RC ping-pong between two processes or hosts: `ibtool ping HOST` and `ibtool ping --server`.

The TCP connection carries the out-of-band exchange (wire.py) and stays open for the whole
session: the client's ENDPOINT message (re)builds the server's QP, so a QP that died (link
down past the retry budget) is replaced without restarting either side. Both sides busy-poll
their CQ while connected, as ibv_rc_pingpong does by default: latency, not CPU, is the point.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from ibtool.errors import IbtoolError
from ibtool.rdma import wire
from ibtool.rdma.completions import CompletionError, poll_receive
from ibtool.rdma.ladder import ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE, Ladder, Peer, new_psn
from ibtool.rdma.loopback import IBV_WC_RECV_RDMA_WITH_IMM, pattern

DEFAULT_PORT = 18520
HANDSHAKE_TIMEOUT = 5.0
SIGNAL_EVERY = 16
IBV_SEND_SIGNALED = 2
RECONNECT_WAIT = 600.0  # how long a server keeps a client whose QP died before it returns
MAX_PING_SIZE = 1 << 20
Log = Callable[[str], None]


def _access(mode: wire.Mode) -> int:
    # Narrowest rights: SEND needs none for the peer; WRITE WITH IMM needs remote write.
    return ACCESS_LOCAL_WRITE | (ACCESS_REMOTE_WRITE if mode == wire.Mode.WRITE_IMM else 0)


class Session:
    """One side's CQ, MR and QP for one connection; rebuilt when the QP dies."""

    def __init__(self, ladder: Ladder, size: int, mode: wire.Mode):
        self.ladder, self.size, self.mode = ladder, size, mode
        self._objects: list = []
        self.cq = self._keep(ladder.pv.cq.CQ(ladder.ctx, 8))
        self.mr = self._keep(ladder.pv.mr.MR(ladder.pd, size, _access(mode)))
        # Sends are unsignaled but every SIGNAL_EVERY-th: a completion per ping would cost a
        # poll round on the critical path. The queue has room for the unreaped ones.
        cap = ladder.pv.qp.QPCap(
            max_send_wr=2 * SIGNAL_EVERY, max_recv_wr=2, max_send_sge=1, max_recv_sge=1
        )
        init = ladder.pv.qp.QPInitAttr(
            qp_type=ladder.pv.e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0
        )
        self._sends = 0
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
            lad.port_attr.active_mtu,
            lad.gid,
            self.mr.buf,
            self.mr.rkey,
            max(self.size, 1),
            self.mode,
        )

    def connect(self, peer: wire.Endpoint) -> None:
        self.peer = peer
        self.ladder.connect_rc(
            self.qp,
            self.psn,
            Peer(peer.qpn, peer.psn, peer.lid, peer.gid, peer.mtu),
            _access(self.mode),
        )
        self._build_wrs()

    def post_recv(self) -> None:
        self.qp.post_recv(self._recv_wr)

    def post_message(self, seq: int) -> None:
        if self.mode == wire.Mode.WRITE_IMM:
            self._send_wr.imm_data = socket.htonl(seq)
        self._sends += 1
        self._send_wr.send_flags = IBV_SEND_SIGNALED if self._sends % SIGNAL_EVERY == 0 else 0
        self.qp.post_send(self._send_wr)

    def _build_wrs(self) -> None:
        # Built once and re-posted: object creation per ping would cost more than the wire.
        wr, e = self.ladder.pv.wr, self.ladder.pv.e
        sge = wr.SGE(self.mr.buf, self.size, self.mr.lkey)
        self._recv_wr = wr.RecvWR(wr_id=1, num_sge=1, sg=[sge])
        if self.mode == wire.Mode.WRITE_IMM:
            self._send_wr = wr.SendWR(
                wr_id=2, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[sge]
            )
            self._send_wr.set_wr_rdma(self.peer.rkey, self.peer.addr)
        else:
            self._send_wr = wr.SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge])


# -- server ------------------------------------------------------------------------------


def serve(
    device: str,
    port: int,
    gid_index: int | None,
    bind: str,
    tcp_port: int,
    log: Log,
    max_clients: int | None = None,
) -> None:
    """Serve clients one after another until interrupted (or `max_clients` were served)."""
    with (
        Ladder(device, port, gid_index) as ladder,
        socket.create_server(
            (bind, tcp_port),
            family=socket.AF_INET6 if ":" in bind else socket.AF_INET,
            reuse_port=False,
        ) as listener,
    ):
        log(
            f"listening on {bind or '*'}:{tcp_port}, {device}/{port}"
            + (f" gid {gid_index}" if gid_index is not None else "")
        )
        served = 0
        while max_clients is None or served < max_clients:
            conn, addr = listener.accept()
            served += 1
            with conn:
                peer = f"{addr[0]}:{addr[1]}"
                try:
                    count = _serve_client(ladder, conn, log, peer)
                    log(f"client {peer} done: {count} pings answered")
                except (wire.ProtocolError, OSError) as e:
                    log(f"client {peer} dropped: {getattr(e, 'message', e)}")
                except IbtoolError as e:
                    log(f"client {peer} dropped: {e.message}")
                    _try_send(conn, wire.encode_error(e.message))


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


def _serve_client(ladder: Ladder, conn: socket.socket, log: Log, peer: str) -> int:
    remote = wire.receive(conn, HANDSHAKE_TIMEOUT, wire.MessageType.ENDPOINT)
    answered = 0
    while remote is not None:
        if remote.size > MAX_PING_SIZE:
            raise IbtoolError(f"ping size {remote.size} exceeds {MAX_PING_SIZE} bytes")
        session = Session(ladder, remote.size, remote.mode)
        try:
            try:
                session.connect(remote)
                session.post_recv()
                session.post_recv()
                conn.sendall(wire.encode_endpoint(session.endpoint()))
                wire.receive(conn, HANDSHAKE_TIMEOUT, wire.MessageType.READY)
            except (wire.PeerError, CompletionError) as e:
                log(f"client {peer}: connection not ready: {e.message}")
                remote = _next_endpoint(conn, RECONNECT_WAIT)
                continue
            except IbtoolError as e:
                if isinstance(e, wire.ProtocolError):
                    raise
                # Our side cannot connect now (e.g. the link is down): tell the client, which
                # retries later over the same TCP connection.
                log(f"client {peer}: cannot connect: {e.message}")
                conn.sendall(wire.encode_error(e.message))
                remote = _next_endpoint(conn, RECONNECT_WAIT)
                continue
            log(
                f"client {peer}: qpn {remote.qpn:#x} mode {remote.mode.name.lower()} "
                f"size {remote.size}"
            )
            try:
                remote, n = _echo(session, conn)
                answered += n
            except CompletionError as e:
                log(f"client {peer}: {e.message}")
                remote = _next_endpoint(conn, RECONNECT_WAIT)
        finally:
            session.close()
    return answered


def _echo(session: Session, conn: socket.socket) -> tuple[wire.Endpoint | None, int]:
    """Answer pings until the client reconnects (new ENDPOINT) or leaves (None)."""
    answered, spins = 0, 0
    poll_cq, reply, rearm = session.cq.poll, session.post_message, session.post_recv
    while True:
        n, wcs = poll_cq(1)  # bound once: this loop is half of every round trip
        if n:
            wc = wcs[0]
            if wc.status != 0:
                raise CompletionError(wc, "ping reply")
            if wc.opcode & 128:  # a ping: answer first (same bytes/imm), then re-arm; the
                # spare receive posted up front covers the client's next ping meanwhile
                reply(socket.ntohl(wc.imm_data) if wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM else 0)
                rearm()
                answered += 1
            spins = 0
            continue
        spins += 1
        if spins >= 2000:  # every ~2000 empty polls, look at the TCP side
            spins = 0
            if select.select([conn], [], [], 0)[0]:
                return _next_endpoint(conn, HANDSHAKE_TIMEOUT), answered


# -- client ------------------------------------------------------------------------------


@dataclass
class Reply:
    seq: int
    rtt_us: float


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
    def __init__(
        self, ladder: Ladder, host: str, tcp_port: int, size: int, mode: wire.Mode, timeout: float
    ):
        self.ladder, self.size, self.mode, self.timeout = ladder, size, mode, timeout
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
        session = Session(self.ladder, self.size, self.mode)
        try:
            self.conn.sendall(wire.encode_endpoint(session.endpoint()))
            remote = wire.receive(self.conn, HANDSHAKE_TIMEOUT, wire.MessageType.ENDPOINT)
            if remote.mode != self.mode:
                raise wire.ProtocolError(f"server answered in mode {remote.mode.name}")
            try:
                session.connect(remote)
            except IbtoolError as e:
                self.conn.sendall(wire.encode_error(e.message))  # the server waits for a retry
                raise
            self.conn.sendall(wire.encode(wire.MessageType.READY))
        except BaseException:
            session.close()
            raise
        self.session = session

    def ping(self, seq: int) -> float:
        """One round trip; its RTT in microseconds."""
        s = self.session
        payload = pattern(seq, self.size)
        s.mr.write(payload, self.size, 0)
        s.post_recv()
        deadline = time.monotonic() + self.timeout
        t0 = time.perf_counter()
        s.post_message(seq & 0xFFFFFFFF)
        recv = poll_receive(s.cq, deadline, f"ping {seq}")
        rtt = (time.perf_counter() - t0) * 1e6
        if self.mode == wire.Mode.WRITE_IMM and socket.ntohl(recv.imm_data) != seq & 0xFFFFFFFF:
            raise IbtoolError(f"reply carries immediate {socket.ntohl(recv.imm_data)}, want {seq}")
        if s.mr.read(self.size, 0) != payload:
            raise IbtoolError(f"reply {seq} payload differs from what was sent")
        return rtt


def run_client(
    client: Client,
    count: int | None,
    interval: float,
    deadline: float | None,
    on_reply: Callable[[Reply], None],
    on_loss: Callable[[int, str], None],
    stats: PingStats,
    rtts: list[float],
) -> None:
    stats.started = time.monotonic()
    seq = 0
    try:
        while count is None or seq < count:
            if deadline is not None and time.monotonic() - stats.started >= deadline:
                break
            seq += 1
            stats.sent += 1
            t_start = time.monotonic()
            try:
                if client.session is None:
                    client.connect()
                rtt = client.ping(seq)
            except IbtoolError as e:
                if isinstance(e, wire.ProtocolError) and not isinstance(e, wire.PeerError):
                    raise
                stats.errors += 1
                on_loss(seq, e.message)
                if client.session is not None:
                    client.session.close()
                    client.session = None  # a dead QP: rebuild before the next ping
            else:
                stats.received += 1
                rtts.append(rtt)
                on_reply(Reply(seq, rtt))
            if (count is None or seq < count) and interval > 0:
                time.sleep(max(0.0, interval - (time.monotonic() - t_start)))
    finally:
        stats.elapsed = time.monotonic() - stats.started
