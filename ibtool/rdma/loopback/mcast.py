"""A multicast group on one port: two UD QPs join it through rdma_cm, a third stays out.

pyverbs has no ibv_attach_mcast (rdma-core 33 to 65, pyverbs/qp.pyx), so QPs join a group as
applications do: rdma_join_multicast on an rdma_cm id of RDMA_PS_UDP whose QP the id created
(rdma_create_qp). librdmacm attaches that QP to the group when the join completes, with the
MGID and MLID of the join's event (librdmacm/cma.c, ucma_process_join), and detaches it on
rdma_leave_multicast. On InfiniBand the kernel joins through the subnet administrator (the SM
picks the group's MLID, Q_Key and SL); on RoCE it maps the IP group to the MGID and joins the
netdev to the IP group (IGMP/MLD), which is also what brings a RoCE port's own multicast back to
it: measured on the testbed, rxe delivers a group's message to every QP attached on the sending
device, and to the attached QPs of the rxe device at the other end of the veth pair.

Each member id is bound to the port's own IP address (never a wildcard: cm.py), so rdma_cm picks
this device and port; while the test runs `rdma res show cm_id` lists the ids (ps UDP). The
sender and the QP that stays out are plain UD QPs of the loopback's own ladder, with the
group's Q_Key and partition: the only thing the outsider lacks is the join.

A member's CQ and MR belong to the id's device context and PD (librdmacm's, per device), so they
are closed in this order: leave, MR, id (with its QP), CQ, event channel. The PD goes with the
last id of the device, which is why an MR on it must go first.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import time

from ibtool.errors import IbtoolError
from ibtool.model.deferred import dataclass
from ibtool.model.records import LinkLayer
from ibtool.rdma import cm
from ibtool.rdma.completions import poll
from ibtool.rdma.ladder import GRH_SIZE, new_psn
from ibtool.sources.verbs import rdmacm

MULTICAST_QPN = 0xFFFFFF  # the destination QP number of a multicast send (IBA: the permissive QPN)
JOIN_TIMEOUT = 10.0  # an SA join on a busy fabric; RoCE answers at once
# enum ibv_qp_attr_mask (libibverbs/verbs.h)
IBV_QP_PKEY_INDEX, IBV_QP_QKEY = 1 << 4, 1 << 6
MEMBERS = 2
# What rdma_join_multicast fails with where the kernel cannot join such a group at all: the
# kernel's own ENOTSUPP (524; measured for an IPv6 group on RoCE v2 under Linux 6.1), and
# EOPNOTSUPP and ENOSYS (a port with neither RoCE nor IB multicast, drivers/infiniband/core/
# cma.c, rdma_join_multicast).
NOT_SUPPORTED = {524: "ENOTSUPP", errno.EOPNOTSUPP: "EOPNOTSUPP", errno.ENOSYS: "ENOSYS"}


class NotSupported(IbtoolError):
    """The kernel cannot join such a group on this port: the reason is the message."""


def group_address(source: str) -> str:
    """A group for this process on the family of `source`: in IPv4's local scope
    239.255.0.0/16 (RFC 2365) or IPv6's site-local transient ff15::/16, from the process id, so
    two tests running at once on one host keep apart."""
    tag = os.getpid() & 0xFFFF
    if ipaddress.ip_address(source.split("%")[0]).version == 4:
        return f"239.255.{tag >> 8}.{tag & 0xFF}"
    return f"ff15::6962:{tag:x}"


@dataclass
class Member:
    cmid: object
    cq: object
    mr: object
    qpn: int
    qkey: int
    pkey_index: int


class Group(contextlib.AbstractContextManager):
    """The group joined by MEMBERS ids on `source` (an IP address of the ladder's port), a
    sender and an outsider built on the ladder; close() leaves and destroys it all."""

    def __init__(self, ladder, source: str, size: int, deadline: float):
        self.ladder, self.source, self.size = ladder, source, size
        self.cm = rdmacm()
        self.address = group_address(source)
        self._stack = contextlib.ExitStack()
        try:
            self.members = [self._join(deadline) for _ in range(MEMBERS)]
            self._outside()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._stack.close()

    def __exit__(self, *exc):
        self.close()
        return False

    # -- joining -------------------------------------------------------------------------

    def _join(self, deadline: float) -> Member:
        cmx, stack = self.cm, self._stack
        channel = cm.EventChannel(cmx)
        stack.callback(channel.close)
        cmid = cm.checked(
            lambda: cmx.cmid.CMID(
                creator=channel.channel, port_space=cmx.e.rdma_port_space.RDMA_PS_UDP
            ),
            "create an rdma_cm id",
        )
        stack.callback(cmid.close)
        self._bind(cmid)
        pv = self.ladder.pv
        cq = self._call(lambda: pv.cq.CQ(cmid.context, 4), "create a member's CQ")
        stack.callback(cq.close)
        stack.callback(cmid.close)  # the id's QP is on `cq`: the id goes first (cm.py)
        cap = pv.qp.QPCap(max_send_wr=1, max_recv_wr=2, max_send_sge=1, max_recv_sge=1)
        init = pv.qp.QPInitAttr(
            qp_type=pv.e.ibv_qp_type.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap, sq_sig_all=1
        )
        self._call(lambda: cmid.create_qp(init), "create a member's UD QP (rdma_create_qp)")
        mr = self._call(lambda: pv.mr.MR(cmid.pd, GRH_SIZE + self.size, 1), "register an MR")
        stack.callback(mr.close)
        group = self._addrinfo(src=self.address)
        self._join_call(cmid, group)
        stack.callback(self._leave, cmid, group)
        joined = self._joined(channel, deadline)
        attr, _ = self._call(
            lambda: cmid.query_qp(IBV_QP_QKEY | IBV_QP_PKEY_INDEX), "query a member's QP"
        )
        self.ah_attr, self.qkey = joined.ah_attr, int(joined.qkey)
        return Member(cmid, cq, mr, int(cmid.qpn), int(attr.qkey), int(attr.pkey_index))

    def _join_call(self, cmid, group) -> None:
        try:
            cmid.join_multicast(addr=group)
        except self.ladder.pv.Error as e:
            code = getattr(e, "error_code", 0)
            if code in NOT_SUPPORTED:
                raise NotSupported(
                    f"the kernel does not join {self.address} on {self.ladder.device}/"
                    f"{self.ladder.port} ({NOT_SUPPORTED[code]}, errno {code})"
                    + (": try an IPv4 GID (--gid-index)" if ":" in self.address else "")
                ) from None
            raise IbtoolError(f"join {self.address}: {e}") from None

    def _bind(self, cmid) -> None:
        ai = self._addrinfo(src=self.source, flags=cm.RAI_PASSIVE)
        self._call(lambda: cmid.bind_addr(ai), f"bind an rdma_cm id to {self.source}")
        where, mine = cm.device_of(cmid), f"{self.ladder.device}/{self.ladder.port}"
        if "/" in where and where != mine:
            raise IbtoolError(
                f"rdma_cm puts {self.source} on {where}, not on {mine}",
                "the address must belong to the tested port's netdev",
            )

    def _addrinfo(self, **kw):
        cmx = self.cm
        what = f"address {kw['src']}"
        ai = cm.addr_info(cmx, what, port_space=cmx.e.rdma_port_space.RDMA_PS_UDP, **kw)
        self._stack.callback(ai.close)
        return ai

    def _joined(self, channel: cm.EventChannel, deadline: float):
        wait = max(0.0, min(JOIN_TIMEOUT, deadline - time.monotonic()))
        got = channel.next(wait)
        if got is None:
            raise cm.CmTimeout(f"join {self.address}: no answer within {wait:.0f} s")
        if got.ud is None:
            why = ""
            if self.ladder.link_layer == LinkLayer.INFINIBAND:
                why = " (the subnet manager must be up and let this partition have the group)"
            raise IbtoolError(f"join {self.address}: {got.name}{why}")
        return got.ud

    def _leave(self, cmid, group) -> None:
        # rdma_destroy_id leaves too; an explicit leave detaches the QP while the id lives.
        with contextlib.suppress(self.ladder.pv.Error):
            cmid.leave_multicast(group)

    def _call(self, fn, what: str):
        try:
            return fn()
        except self.ladder.pv.Error as e:
            raise IbtoolError(f"{what}: {e}") from None

    # -- the sender and the outsider -----------------------------------------------------

    def _outside(self) -> None:
        lad, size = self.ladder, self.size
        first = self.members[0]
        self.send_cq, self.out_cq = lad.cq(2), lad.cq(2)
        self.sender = lad.qp(self.send_cq, "ud", 1, 1)
        self.outsider = lad.qp(self.out_cq, "ud", 1, 1)
        for qp in (self.sender, self.outsider):
            self._ready(qp, first.pkey_index)
        self.ah = lad.own(
            lad.checked(lambda: lad.pv.addr.AH(lad.pd, attr=self.ah_attr), "create the group's AH")
        )
        self.mr = lad.mr(size + GRH_SIZE + size, 1)  # the payload, then the outsider's receive
        sge = lad.pv.wr.SGE(self.mr.buf + size, GRH_SIZE + size, self.mr.lkey)
        self.outsider.post_recv(lad.pv.wr.RecvWR(wr_id=0, num_sge=1, sg=[sge]))

    def _ready(self, qp, pkey_index: int) -> None:
        lad, states = self.ladder, self.ladder.pv.e.ibv_qp_state
        attr = lad.pv.qp.QPAttr(
            qp_state=states.IBV_QPS_INIT, cur_qp_state=states.IBV_QPS_RESET, port_num=lad.port
        )
        attr.pkey_index = pkey_index
        attr.qkey = self.qkey
        attr.sq_psn = new_psn()
        lad.checked(lambda: qp.to_rts(attr), "UD QP RESET->RTS")

    # -- one round -----------------------------------------------------------------------

    def round(self, data: bytes, deadline: float, verify) -> None:
        """`data` sent once to the group: every member receives it whole, the outsider not."""
        lad, size = self.ladder, len(data)
        for m in self.members:
            self._call(lambda m=m: m.cmid.post_recv(m.mr, GRH_SIZE + size), "post a receive")
        self.mr.write(data, size, 0)
        wr = lad.pv.wr.SendWR(
            opcode=lad.pv.e.ibv_wr_opcode.IBV_WR_SEND,
            num_sge=1,
            sg=[lad.pv.wr.SGE(self.mr.buf, size, self.mr.lkey)],
        )
        wr.set_wr_ud(self.ah, MULTICAST_QPN, self.qkey)
        lad.checked(lambda: self.sender.post_send(wr), "post the multicast SEND")
        poll(self.send_cq, 1, deadline, "multicast SEND")
        for n, m in enumerate(self.members, 1):
            (wc,) = poll(m.cq, 1, deadline, f"member {n}'s RECV")
            if wc.byte_len != GRH_SIZE + size:
                raise IbtoolError(
                    f"member {n} received {wc.byte_len} bytes, want {GRH_SIZE + size}"
                )
            verify(m.mr, GRH_SIZE, data, f"member {n}'s RECV")
        self.check_outsider()

    def check_outsider(self) -> None:
        n, _ = self.out_cq.poll(1)
        if n:
            raise IbtoolError(f"a QP that did not join {self.address} received its multicast")

    # -- what the report says ------------------------------------------------------------

    @property
    def mgid(self) -> str:
        return str(self.ah_attr.dgid)

    @property
    def mlid(self) -> int | None:
        if self.ladder.link_layer != LinkLayer.INFINIBAND:
            return None  # RoCE has no LIDs: the MGID (the IP group) is the address
        return int(self.ah_attr.dlid)
