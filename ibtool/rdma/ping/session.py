"""One connection's RC ping: the CQ, MR, QP and work requests both sides post, rebuilt when
the QP dies.

The TCP connection carries the out-of-band exchange (wire.py) and stays open for the whole
run: the client's ENDPOINT message (re)builds the server's QP, so a QP that died (link down
past the retry budget) is replaced without restarting either side. Both sides busy-poll
their CQ while connected, as ibv_rc_pingpong does by default (rdma-core
libibverbs/examples/rc_pingpong.c): latency, not CPU, is the point.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from ibtool.errors import IbtoolError
from ibtool.rdma import wire
from ibtool.rdma.completions import in_place
from ibtool.rdma.ladder import (
    ACCESS_LOCAL_WRITE,
    ACCESS_REMOTE_WRITE,
    DEFAULT_PATH,
    Ladder,
    PathSpec,
    Peer,
    new_psn,
)
from ibtool.rdma.options import MAX_PING_SIZE  # noqa: F401 (what each session registers)

DEFAULT_PORT = 18520
HANDSHAKE_TIMEOUT = 5.0
SIGNAL_EVERY = 16
IBV_SEND_SIGNALED = 2
IBV_WC_EX_WITH_COMPLETION_TIMESTAMP = 1 << 7  # enum ibv_create_cq_wc_flags (verbs.h)
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

    `ladder` is a Ladder, or anything else with its `pv`, `ctx`, `pd` and `checked`: an
    rdma_cm connection (cm.Connection), which connects the QP itself and then calls ready().

    The hot loops (client.Client.ping, echo.answer_pings) use what this builds once:
    `polled` (the CQ read in place, no WC object per completion) with `poll_attr`, the bound
    post methods, and the work requests (`cadence` for sends, `recv_wr`), re-posted as they
    are. Measured under the QEMU testbed: every Python call there costs ~1-2 us, a WC object
    ~14 us, the post_send system call (rxe does the transfer in it) ~20 us.
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
        try:
            self._build(ladder, mode, stamped)
        except BaseException:
            self.close()  # what was built before the failure, not left to the context's close
            raise

    def _build(self, ladder: Ladder, mode: wire.Mode, stamped: bool) -> None:
        self.cq = self._keep(_completion_queue(ladder, mode, stamped))
        self.polled = in_place(self.cq, ladder.pv)
        self.poll_attr = ladder.pv.cq.PollCqAttr() if ladder.pv.cqex else None
        self.mr = self._keep(
            ladder.checked(
                lambda: ladder.pv.mr.MR(ladder.pd, self.room, _access(mode)),
                f"registering {self.room} bytes",
            )
        )
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
        """What this end tells its peer, the port's LID and active MTU as they are now (a
        server's ladder outlives a netdev MTU change)."""
        lad = self.ladder
        lad.refresh_port()
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
            return ladder.checked(
                lambda: pv.cq.CQEX(ladder.ctx, pv.cq.CqInitAttrEx(cqe=8, wc_flags=flags)),
                "create a CQ with completion timestamps",
            )
        try:
            return pv.cq.CQEX(ladder.ctx, pv.cq.CqInitAttrEx(cqe=8, wc_flags=flags))
        except pv.Error:
            pass
    return ladder.checked(lambda: pv.cq.CQ(ladder.ctx, 8), "create CQ")


def next_endpoint(conn: socket.socket, timeout: float) -> wire.Endpoint | None:
    """The client's next (re)connect request, or None when it has left."""
    try:
        return wire.receive(conn, timeout, wire.MessageType.ENDPOINT)
    except wire.PeerClosed:
        return None
