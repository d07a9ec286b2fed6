"""Loopback self-test, the fabric's own rules: ud_qkey (a UD send whose Q_Key is wrong is
dropped), mcast (a multicast group reaches its members and no one else, mcast.py) and apm (an
RC QP migrates to its alternate path, apm.py).

What a device or port cannot do is UNSUPPORTED with the reason, never a failure.
"""

from __future__ import annotations

import time

from ibtool.errors import IbtoolError
from ibtool.rdma.completions import poll
from ibtool.rdma.ladder import ACCESS_ALL_REMOTE, GRH_SIZE
from ibtool.rdma.loopback import apm
from ibtool.rdma.loopback.operations import CONTROLLED_QKEY, Loopback
from ibtool.rdma.loopback.pattern import pattern
from ibtool.rdma.loopback.results import Mismatch, OpResult, OpUnsupported, drop_wait

QKEY_VIOL_CNTR_MAX = 0xFFFF  # PortInfo's Q_KeyViolations is a 16-bit counter


def wrong_qkey(qkey: int) -> int:
    """A Q_Key that differs from `qkey` and is not controlled: a work request's Q_Key with
    bit 31 set tells the HCA to send with the sending QP's own Q_Key instead (IBA's rule for
    UD sends), which would be the right one."""
    return (qkey ^ 1) & ~CONTROLLED_QKEY


class FabricTest(Loopback):
    """A Loopback that also tests the fabric's rules (ud_qkey, mcast, apm); what they hold
    outside the ladder (the multicast group) is released as each ends."""

    def __init__(self, *args, mcast_source: str | None = None, **kwargs):
        """Loopback's arguments; `mcast_source`: an IP address of the port's netdev, for
        rdma_cm (None: mcast is UNSUPPORTED)."""
        self.mcast_source = mcast_source
        self._qk = None
        self._mcast = None
        self._mcast_group: str | None = None  # the group address, once one is tried
        self._apm = None
        super().__init__(*args, **kwargs)

    def ud_qkey(self, i: int, deadline: float) -> None:
        """A SEND with a wrong Q_Key, then one with the right Q_Key: the first receive must be
        the right one's. Receives are consumed in order, and a wrong-key message delivered
        late shows at the next round's start or in finish()'s wait."""
        lad = self.ladder
        mtu_bytes = 128 << lad.port_attr.active_mtu
        size = min(self.size, mtu_bytes)
        slot = GRH_SIZE + size
        if self._qk is None:
            cq_s, cq_r = lad.cq(4), lad.cq(4)
            qp_s, qp_r = lad.qp(cq_s, "ud", 2, 3), lad.qp(cq_r, "ud", 2, 3)
            self.ready_ud(qp_s)
            self.ready_ud(qp_r)
            ah = lad.ah(lad.local(qp_r, 0), self.sl)
            mr = lad.mr(size * 2 + slot * 2, 1)  # right, wrong, then two receive slots
            viol = lad.ctx.query_port(lad.port).qkey_viol_cntr
            self._qk = dict(cq_s=cq_s, cq_r=cq_r, qp_s=qp_s, qp_r=qp_r, ah=ah, mr=mr)
            self._qk.update(viol=viol, wrong=0, posted=0)
            self.post_recv(qp_r, mr, size * 2, slot, wr_id=0)  # one receive always stays posted
            self._qk["posted"] += 1
        q = self._qk
        if q.pop("fresh", False):
            q.update(viol=lad.ctx.query_port(lad.port).qkey_viol_cntr, wrong=0)
        mr, right_key, bad_key = q["mr"], self.qkey, wrong_qkey(self.qkey)
        self._no_delivery(q["cq_r"], "a UD SEND with a wrong Q_Key")
        right, wrong = pattern(i, size), pattern(i + 128, size)
        mr.write(right, size, 0)
        mr.write(wrong, size, size)
        spare = q["posted"] % 2
        self.post_recv(q["qp_r"], mr, size * 2 + spare * slot, slot, wr_id=spare)
        q["posted"] += 1
        for offset, key in ((size, bad_key), (0, right_key)):
            wr = self.send_wr(self.wr_opcode.IBV_WR_SEND, mr, offset, size)
            wr.set_wr_ud(q["ah"], q["qp_r"].qp_num, key)
            q["qp_s"].post_send(wr)
            poll(q["cq_s"], 1, deadline, "UD SEND")
        q["wrong"] += 1
        (wc,) = poll(q["cq_r"], 1, deadline, f"UD RECV of the Q_Key {right_key:#010x} SEND")
        at = size * 2 + wc.wr_id * slot + GRH_SIZE
        if mr.read(size, at) == wrong:
            raise Mismatch(
                f"a UD SEND with Q_Key {bad_key:#010x} was delivered to a QP whose Q_Key is "
                f"{right_key:#010x}"
            )
        self.check_sl(wc, "UD RECV")
        self.verify(mr, at, right, "UD SEND/RECV with the right Q_Key")

    def _no_delivery(self, cq, what: str, wait: float = 0.0) -> None:
        """Nothing on `cq` now, nor within `wait` seconds (polled: the CQ has no channel)."""
        until = time.monotonic() + wait
        while True:
            n, _ = cq.poll(1)
            if n:
                raise Mismatch(f"{what} was delivered")
            if time.monotonic() >= until:
                return

    def mcast(self, i: int, deadline: float) -> None:
        from ibtool.rdma.loopback import mcast  # rdma_cm: only for this operation

        if self._mcast is None:
            if not self.mcast_source:
                raise OpUnsupported(
                    f"no IP address on {self.ladder.device}/{self.ladder.port}'s netdev: "
                    "multicast groups are joined through rdma_cm, which finds a port by its "
                    "IP address (IPoIB on InfiniBand)"
                )
            try:
                mcast.rdmacm()
            except IbtoolError as e:
                hint = f" (hint: {e.hint})" if e.hint else ""
                raise OpUnsupported(f"{e.message}{hint}") from None
            size = min(self.size, 128 << self.ladder.port_attr.active_mtu)
            self._mcast_group = mcast.group_address(self.mcast_source)
            try:
                self._mcast = mcast.Group(self.ladder, self.mcast_source, size, deadline)
            except mcast.NotSupported as e:
                raise OpUnsupported(e.message) from None
        group = self._mcast
        group.round(pattern(i, group.size), deadline, self.verify)

    def apm(self, i: int, deadline: float) -> None:
        """Migrate a fresh RC pair to its alternate path (once), then SEND both ways on it."""
        if self._apm is None:
            self._apm = self._migrated_pair(deadline)
        qp_a, qp_b, cq_a, cq_b, mr_a, mr_b = self._apm["pair"]
        for (src, cq_s, mr_s), (dst, cq_d, mr_d) in (
            ((qp_a, cq_a, mr_a), (qp_b, cq_b, mr_b)),
            ((qp_b, cq_b, mr_b), (qp_a, cq_a, mr_a)),
        ):
            data = pattern(i, self.size)
            mr_d.write(bytes(self.size), self.size, 0)
            self.post_recv(dst, mr_d, 0, self.size)
            mr_s.write(data, self.size, 0)
            src.post_send(self.send_wr(self.wr_opcode.IBV_WR_SEND, mr_s, 0, self.size))
            poll(cq_s, 1, deadline, "SEND on the migrated path")
            poll(cq_d, 1, deadline, "RECV on the migrated path")
            self.verify(mr_d, 0, data, "SEND on the migrated path")

    def _migrated_pair(self, deadline: float) -> dict:
        lad = self.ladder
        reason = apm.unsupported_reason(lad)
        if reason:
            raise OpUnsupported(reason)
        cq_a, cq_b = lad.cq(4), lad.cq(4)
        mr_a, mr_b = lad.mr(self.size, ACCESS_ALL_REMOTE), lad.mr(self.size, ACCESS_ALL_REMOTE)
        qp_a, qp_b = lad.qp(cq_a, "rc", 2, 2), lad.qp(cq_b, "rc", 2, 2)
        self.connect_pair(qp_a, qp_b)
        try:
            alt = apm.load_alt_path(lad, qp_a, lad.local(qp_b, 0), self.sl, self.path.pkey_index)
            apm.load_alt_path(lad, qp_b, lad.local(qp_a, 0), self.sl, self.path.pkey_index)
        except apm.NotSupported as e:
            raise OpUnsupported(e.message) from None
        armed = apm.wait_armed(lad, (qp_a, qp_b), deadline)
        apm.migrate(lad, qp_a)
        return dict(pair=(qp_a, qp_b, cq_a, cq_b, mr_a, mr_b), alt=alt, armed=armed)

    # -- what an operation used and proved -----------------------------------------------

    def facts(self, op: str) -> dict:
        """The -j keys of what an operation used, as far as it got (a failure has them too)."""
        if op == "ud_qkey":
            return {"qkey": f"{self.qkey:#010x}", "wrong_qkey": f"{wrong_qkey(self.qkey):#010x}"}
        if op == "apm":
            flags = self.ladder.dev_attr.device_cap_flags
            return {"auto_path_mig": bool(flags & apm.IB_DEVICE_AUTO_PATH_MIG)}
        if op == "mcast" and self._mcast is None and self._mcast_group:
            return {"group": self._mcast_group}
        if op == "mcast" and self._mcast is not None:
            g = self._mcast
            return {
                "group": g.address,
                "mgid": g.mgid,
                "mlid": None if g.mlid is None else f"{g.mlid:#06x}",
                "qkey": f"{g.qkey:#010x}",
                "members": len(g.members),
            }
        return super().facts(op)

    def finish(self, op: str, result: OpResult, timeout: float) -> None:
        """An operation's last checks after its rounds, and what it proved (detail, facts)."""
        done = {
            "ud_qkey": self._finish_ud_qkey,
            "mcast": self._finish_mcast,
            "apm": self._finish_apm,
        }.get(op)
        if done is not None:
            done(result, drop_wait(timeout))

    def _finish_ud_qkey(self, result: OpResult, wait: float) -> None:
        q, lad = self._qk, self.ladder
        self._no_delivery(q["cq_r"], "a UD SEND with a wrong Q_Key", wait)
        right, bad, n = self.qkey, wrong_qkey(self.qkey), q["wrong"]
        before, after = q["viol"], lad.ctx.query_port(lad.port).qkey_viol_cntr
        if before >= QKEY_VIOL_CNTR_MAX:
            counted, delta = "port qkey_viol_cntr saturated (0xffff)", None
        else:
            delta = after - before
            counted = f"port qkey_viol_cntr +{delta}"
            if delta < n:
                counted += (
                    " (saturated at 0xffff)"
                    if after >= QKEY_VIOL_CNTR_MAX
                    else " (this driver does not count them all there)"
                )
        result.detail = (
            f"receiver's Q_Key {right:#010x}: {n} SENDs with {right:#010x} delivered, {n} with "
            f"{bad:#010x} dropped; {counted}"
        )
        result.facts.update(dropped=n, qkey_viol_cntr_delta=delta)

    def _finish_mcast(self, result: OpResult, wait: float) -> None:
        g = self._mcast
        until = time.monotonic() + wait
        while True:
            g.check_outsider()
            if time.monotonic() >= until:
                break
        lad = self.ladder
        mlid = "" if g.mlid is None else f", MLID {g.mlid:#06x}"
        result.detail = (
            f"group {g.address} (MGID {g.mgid}{mlid}, Q_Key {g.qkey:#010x}) joined through "
            f"rdma_cm by {len(g.members)} UD QPs on {lad.device}/{lad.port}: every SEND to it "
            "reached both, a QP that did not join got none"
        )

    def _finish_apm(self, result: OpResult, wait: float) -> None:
        st, lad = self._apm, self.ladder
        alt, peer_state = st["alt"], apm.mig_state(lad, st["pair"][1])
        peer = apm.MIG_STATES.get(peer_state, str(peer_state))
        result.detail = (
            f"alternate path ({alt.describe()}, alt_timeout {alt.timeout}) armed by the HCA in "
            f"{st['armed'] * 1000:.1f} ms; QP migrated to it (MIGRATED), SENDs verified both "
            f"ways after; the peer QP is {peer}"
        )
        result.facts.update(
            alt_port=alt.port,
            alt_lid=None if alt.lid is None else f"{alt.lid:#x}",
            armed_ms=round(st["armed"] * 1000, 3),
            path_mig_state="MIGRATED",
            peer_path_mig_state=peer,
        )

    def release(self, op: str) -> None:
        """Close what an operation holds outside the ladder: the multicast group (left, its
        rdma_cm ids destroyed) as soon as its operation ends."""
        if op == "mcast" and self._mcast is not None:
            group, self._mcast = self._mcast, None
            group.close()
        if op == "ud_qkey" and self._qk is not None:
            self._qk["fresh"] = True  # a second ud_qkey of the run counts afresh
