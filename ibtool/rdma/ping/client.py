"""`ibtool ping HOST`: the native client, its round trip, and the run that counts the pings.

pingpong.py, rping.py and cmping.py bring clients of their own protocols to run_client.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from errno import ENOENT

from ibtool.errors import IbtoolError
from ibtool.model.deferred import dataclass
from ibtool.rdma import wire
from ibtool.rdma.completions import CompletionError, CompletionTimeout, poll_failed
from ibtool.rdma.hwclock import HwClock
from ibtool.rdma.ladder import DEFAULT_PATH, Ladder, PathSpec
from ibtool.rdma.loopback.pattern import pattern_wheel
from ibtool.rdma.ping.admission import REFUSED
from ibtool.rdma.ping.session import (
    HANDSHAKE_TIMEOUT,
    SIGNAL_EVERY,
    QPError,
    ReplySizeError,
    Session,
    SessionEnded,
)

POLL_ROUND = range(256)  # a client's empty polls between two looks at the clock


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
        source: str | None = None,
        connect_timeout: float = HANDSHAKE_TIMEOUT,
    ):
        """`source`: the address this side connects from (a mesh endpoint's own), else the
        kernel's choice; `connect_timeout`: seconds for the TCP connection."""
        self.ladder, self.size, self.mode, self.timeout = ladder, size, mode, timeout
        self.path, self.hw, self.hw_us = path, hw, None
        self.server = f"{host}:{tcp_port}"
        try:
            self.conn = socket.create_connection(
                (host, tcp_port),
                timeout=connect_timeout,
                source_address=(source, 0) if source else None,
            )
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
