"""The verbs resource ladder: context, PD, CQ, MR, QP, then RESET -> INIT -> RTR -> RTS.

Every object goes onto one ExitStack the moment it exists, so `close()` (or leaving the
`with` block by any path: exception, timeout, Ctrl-C, SIGTERM turned into an exception)
destroys them in reverse order: QPs and AHs before MRs and CQs, those before the PD and
the context. pyverbs' defaults that bite are set explicitly here (rdma-core pyverbs/qp.pyx,
addr.pyx):
QPInitAttr defaults to UD, GlobalRoute.hop_limit to 1, QPAttr leaves access flags, rd_atomic,
timeout and retry counts at 0 although to_rtr/to_rts put them in the modify mask.
"""

from __future__ import annotations

import contextlib
import random
from errno import ETIMEDOUT

from ibtool.errors import IbtoolError, PermissionDeniedError
from ibtool.model.deferred import dataclass
from ibtool.model.records import LinkLayer
from ibtool.sources.verbs import IBV_MTU_BYTES, pyverbs

GRH_SIZE = 40  # UD receives carry the GRH (or, for RoCE v2 over IPv4, the IP header) first
DEFAULT_QKEY = 0x11111111  # bit 31 clear: not a controlled Q_Key
RESOLVE_TRIES = 3  # INIT->RTR on RoCE: the kernel waits ~1 s for ARP/ND per try
ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_ATOMIC = 1, 2, 4, 8
ACCESS_ALL_REMOTE = (
    ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC
)


@dataclass(frozen=True)
class Peer:
    """What the other side of an RC connection told us (or what we are, for loopback)."""

    qpn: int
    psn: int
    lid: int
    gid: bytes
    mtu: int  # ibv_mtu code


@dataclass(frozen=True)
class PathSpec:
    """What an operator chooses of an RC connection's path: the service level (IB: the VL
    through the SL-to-VL tables; RoCE: the priority), the GRH traffic class (RoCE v2: the IP
    DS field, DSCP in its upper six bits), a cap on the path MTU (an ibv_mtu code) and the
    slot of the port's P_Key table whose partition the QP is in (its packets carry that
    P_Key; set at RESET->INIT)."""

    sl: int = 0
    traffic_class: int = 0
    mtu: int | None = None
    pkey_index: int = 0
    # The local ACK timeout's exponent: each try waits 4.096 us * 2^N for its ACK (IBTA vol.
    # 1, QP attribute Local ACK Timeout; perftest's -u), 14 = 67 ms, as rc_pingpong leaves it.
    ack_timeout: int = 14

    def describe(self, mtu: int | None = None) -> str:
        """The path as a ping's first line says it, "mtu M, sl S, tclass T (DSCP D)"; `mtu` in
        bytes, else this one's."""
        if mtu is None:
            mtu = IBV_MTU_BYTES.get(self.mtu, self.mtu)
        dscp = f" (DSCP {self.traffic_class >> 2})" if self.traffic_class else ""
        return f"mtu {mtu}, sl {self.sl}, tclass {self.traffic_class}{dscp}"


DEFAULT_PATH = PathSpec()
MTU_BYTES = IBV_MTU_BYTES  # enum ibv_mtu code -> bytes
MTU_CODES = {size: code for code, size in IBV_MTU_BYTES.items()}


def new_psn() -> int:
    return random.getrandbits(24)


def gid_text(raw: bytes) -> str:
    h = raw.hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


class Ladder(contextlib.AbstractContextManager):
    def __init__(self, device: str, port: int = 1, gid_index: int | None = None):
        self.pv = pyverbs()
        self.device, self.port = device, port
        self._stack = contextlib.ExitStack()
        try:
            self.ctx = self.own(
                self.checked(lambda: self.pv.device.Context(name=device), f"open {device}")
            )
            self.dev_attr = self.ctx.query_device()
            self.port_attr = self.checked(
                lambda: self.ctx.query_port(port), f"query {device}/{port}"
            )
            self.link_layer = LinkLayer.parse(self.port_attr.link_layer)
            self.gid_index = gid_index
            self.gid = bytes(16)
            self.gid_type: int | None = None
            if self.needs_grh:
                if gid_index is None:
                    raise IbtoolError(f"{device}/{port}: no GID index given for a RoCE port")
                g = self.ctx.query_gid(port, gid_index)
                self.gid = bytes.fromhex(str(g.gid).replace(":", ""))
                self.gid_type = self._gid_type(gid_index)
            self.pd = self.own(self.pv.pd.PD(self.ctx))
        except BaseException:
            self.close()
            raise

    def _gid_type(self, index: int) -> int | None:
        try:
            return int(self.ctx.query_gid_type(self.port, index))
        except self.pv.Error:
            return None

    def _gid_at(self, index: int) -> tuple[bytes, int | None] | None:
        try:
            g = self.ctx.query_gid(self.port, index)
        except self.pv.Error:
            return None  # an empty slot (the kernel: ENODATA)
        return bytes.fromhex(str(g.gid).replace(":", "")), self._gid_type(index)

    def follow_gid(self) -> str | None:
        """Where the GID this ladder started with went, for the next connection.

        The kernel keeps a RoCE port's GID table in step with its netdev
        (drivers/infiniband/core/roce_gid_mgmt.c): an address removed and added again, or a
        bond's failover, can delete a GID and add it back under another index. A QP built on
        the old index then fails (ENODATA: no GID there). The same GID of the same type is
        looked up again; returns what changed, to be told, or None."""
        if not self.needs_grh or self.gid_index is None:
            return None
        want = (self.gid, self.gid_type)
        if self._gid_at(self.gid_index) == want:
            return None
        for index in range(self.port_attr.gid_tbl_len):
            if index != self.gid_index and self._gid_at(index) == want:
                was, self.gid_index = self.gid_index, index
                return (
                    f"{self.device}/{self.port}: GID {gid_text(self.gid)} moved from index "
                    f"{was} to {index} (the kernel re-made the GID table)"
                )
        return None  # gone: the connection's own error says what fails

    @property
    def needs_grh(self) -> bool:
        return self.link_layer == LinkLayer.ETHERNET or bool(self.port_attr.flags & 1)

    def checked(self, fn, what: str):
        """fn(), a pyverbs error raised as an IbtoolError that says `what` failed (EPERM and
        EACCES as a PermissionDeniedError naming the device files)."""
        try:
            return fn()
        except self.pv.Error as e:
            code = getattr(e, "error_code", 0)
            if code in (1, 13):  # EPERM, EACCES
                raise PermissionDeniedError(
                    f"{what}: {e}", "check the permissions of /dev/infiniband/uverbs*"
                ) from None
            if code == 12:  # ENOMEM: pinning beyond RLIMIT_MEMLOCK (core/umem.c ib_umem_get)
                raise IbtoolError(
                    f"{what}: {e}",
                    "the locked-memory limit (ulimit -l) is too low for this: raise it "
                    "(prlimit --memlock=unlimited, or /etc/security/limits.d); ibtool doctor "
                    "shows it",
                ) from None
            raise IbtoolError(f"{what}: {e}") from None

    def own(self, obj):
        """`obj`, closed with the ladder (in reverse order of creation)."""
        self._stack.callback(obj.close)
        return obj

    def close(self) -> None:
        self._stack.close()

    def __exit__(self, *exc):
        self.close()
        return False

    # -- objects -------------------------------------------------------------------------

    def cq(self, depth: int):
        return self.own(self.checked(lambda: self.pv.cq.CQ(self.ctx, depth), "create CQ"))

    def mr(self, size: int, access: int):
        return self.own(
            self.checked(lambda: self.pv.mr.MR(self.pd, size, access), f"register a {size}-byte MR")
        )

    def qp(self, cq, qp_type: str, send_wr: int, recv_wr: int, max_inline: int = 0):
        e = self.pv.e
        cap = self.pv.qp.QPCap(
            max_send_wr=send_wr,
            max_recv_wr=recv_wr,
            max_send_sge=1,
            max_recv_sge=1,
            max_inline_data=max_inline,
        )
        kind = {"rc": e.ibv_qp_type.IBV_QPT_RC, "ud": e.ibv_qp_type.IBV_QPT_UD}[qp_type]
        init = self.pv.qp.QPInitAttr(qp_type=kind, scq=cq, rcq=cq, cap=cap, sq_sig_all=1)
        return self.own(
            self.checked(lambda: self.pv.qp.QP(self.pd, init), f"create {qp_type.upper()} QP")
        )

    def ah(self, peer: Peer, sl: int = 0):
        return self.own(
            self.checked(
                lambda: self.pv.addr.AH(self.pd, attr=self.ah_attr(peer, sl)),
                "create address handle",
            )
        )

    def ah_attr(self, peer: Peer, sl: int = 0, traffic_class: int = 0):
        a = self.pv.addr
        if self.needs_grh:
            gr = a.GlobalRoute(dgid=a.GID(gid_text(peer.gid)), sgid_index=self.gid_index)
            gr.hop_limit = 64  # pyverbs' default of 1 dies at the first router
            gr.traffic_class = traffic_class  # RoCE v2: the IP header's DS field (DSCP << 2)
            return a.AHAttr(gr=gr, is_global=1, port_num=self.port, sl=sl)
        return a.AHAttr(dlid=peer.lid, is_global=0, port_num=self.port, sl=sl)

    def refresh_port(self) -> None:
        """The port's attributes as they are now: a long-lived ladder (a ping server's, a mesh
        agent's) outlives a netdev MTU change or a new LID, and a QP built on the values of its
        start would tell its peer an MTU the port no longer has. Kept as they were when the
        port cannot be asked."""
        try:
            self.port_attr = self.ctx.query_port(self.port)
        except self.pv.Error:
            pass

    def local(self, qp, psn: int) -> Peer:
        self.refresh_port()
        return Peer(qp.qp_num, psn, self.port_attr.lid, self.gid, self.port_attr.active_mtu)

    # -- state transitions ---------------------------------------------------------------

    def path_mtu(self, peer_mtu: int, mtu: int | None = None) -> int:
        """The RC path MTU (an ibv_mtu code): the smallest of this port's active MTU, the
        peer's and the one asked for."""
        return min(self.port_attr.active_mtu, peer_mtu, mtu or peer_mtu)

    def connect_rc(
        self,
        qp,
        local_psn: int,
        peer: Peer,
        access: int,
        rd_atomic: int = 1,
        path: PathSpec = DEFAULT_PATH,
    ) -> None:
        """RESET -> INIT -> RTR -> RTS with the attributes ibv_rc_pingpong uses (rdma-core
        libibverbs/examples/rc_pingpong.c, pp_connect_ctx), on the service level, traffic
        class and MTU cap of `path`."""
        e = self.pv.e
        attr = self.pv.qp.QPAttr(
            qp_state=e.ibv_qp_state.IBV_QPS_INIT,
            cur_qp_state=e.ibv_qp_state.IBV_QPS_RESET,
            port_num=self.port,
        )
        attr.pkey_index = path.pkey_index
        attr.qp_access_flags = access
        self.checked(lambda: qp.to_init(attr), "QP RESET->INIT")
        attr.path_mtu = self.path_mtu(peer.mtu, path.mtu)
        attr.dest_qp_num = peer.qpn
        attr.rq_psn = peer.psn
        attr.max_dest_rd_atomic = rd_atomic
        attr.min_rnr_timer = 12  # 0.64 ms
        attr.ah_attr = self.ah_attr(peer, path.sl, path.traffic_class)
        self.checked(lambda: self._to_rtr(qp, attr, peer), "QP INIT->RTR")
        attr.timeout = path.ack_timeout  # 4.096 us * 2^14 = 67 ms per try by default
        attr.retry_cnt = 7
        attr.rnr_retry = 7  # retry forever while the peer has no receive posted
        attr.sq_psn = local_psn
        attr.max_rd_atomic = rd_atomic
        self.checked(lambda: qp.to_rts(attr), "QP RTR->RTS")

    def _to_rtr(self, qp, attr, peer: Peer) -> None:
        """INIT->RTR. On RoCE the kernel resolves the peer's MAC here (ARP or neighbour discovery
        for the address in its GID) and fails with ETIMEDOUT after about a second without an
        answer: one lost ARP packet (netem loss on the testbed did it) must not fail the
        connection, so the transition is asked again, RESOLVE_TRIES times in all."""
        for attempt in range(1, RESOLVE_TRIES + 1):
            try:
                return qp.to_rtr(attr)
            except self.pv.Error as e:
                if not self.needs_grh or getattr(e, "error_code", 0) != ETIMEDOUT:
                    raise
                if attempt == RESOLVE_TRIES:
                    raise IbtoolError(
                        f"QP INIT->RTR: no neighbour (ARP/ND) answer for the peer's address "
                        f"{gid_text(peer.gid)} after {RESOLVE_TRIES} tries: {e}",
                        "check that the peer's address is reachable from this port's netdev "
                        "(ip route get, ip neigh) and that its link is up",
                    ) from None

    def ready_ud(self, qp, psn: int, qkey: int = DEFAULT_QKEY, pkey_index: int = 0) -> None:
        e = self.pv.e
        attr = self.pv.qp.QPAttr(
            qp_state=e.ibv_qp_state.IBV_QPS_INIT,
            cur_qp_state=e.ibv_qp_state.IBV_QPS_RESET,
            port_num=self.port,
        )
        attr.pkey_index = pkey_index
        attr.qkey = qkey
        attr.sq_psn = psn
        self.checked(lambda: qp.to_rts(attr), "UD QP RESET->RTS")
