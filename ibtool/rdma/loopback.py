"""Loopback self-test: two RC QPs (and two UD QPs) on one port, every operation verified.

Each operation runs `iters` times one at a time (latency: post to last completion), checking
the data every time; SEND, WRITE and READ then run pipelined `depth` deep for bandwidth.

The fabric's own rules are tested too: ud_qkey (a UD send whose Q_Key is wrong is dropped),
mcast (a multicast group reaches its members and no one else, mcast.py) and apm (an RC QP
migrates to its alternate path, apm.py). What a device or port cannot do is UNSUPPORTED with the
reason, never a failure.
"""

from __future__ import annotations

import enum
import socket
import statistics
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ibtool.errors import IbtoolError, PermissionDeniedError
from ibtool.model.records import LinkLayer
from ibtool.rdma import apm
from ibtool.rdma.completions import CompletionError, CompletionTimeout, poll
from ibtool.rdma.ladder import (
    ACCESS_ALL_REMOTE,
    DEFAULT_PATH,
    DEFAULT_QKEY,
    GRH_SIZE,
    Ladder,
    PathSpec,
    new_psn,
)

OPS = (
    "send",
    "write",
    "write_imm",
    "read",
    "fetch_add",
    "cmp_swap",
    "ud_send",
    "ud_qkey",
    "mcast",
    "apm",
)
BANDWIDTH_OPS = ("send", "write", "read")
ATOMIC_OPS = ("fetch_add", "cmp_swap")
IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_WITH_IMM = 128, 129, 2
ATOMIC_SLOT = 8
CONTROLLED_QKEY = 0x80000000  # Q_Key bit 31: a controlled Q_Key (IBA; ib_verbs.h IB_QP_SET_QKEY)
QKEY_VIOL_CNTR_MAX = 0xFFFF  # PortInfo's Q_KeyViolations is a 16-bit counter


class Status(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    TIMEOUT = "TIMEOUT"
    UNSUPPORTED = "UNSUPPORTED"


@dataclass
class OpResult:
    op: str
    status: Status
    size: int
    iters: int = 0
    latencies_us: list[float] = field(default_factory=list, repr=False)
    bandwidth_mbps: float | None = None  # MB/s (10^6 bytes), pipelined
    error: str | None = None
    detail: str | None = None  # what the operation proved, in words (ud_qkey, mcast, apm)
    facts: dict = field(default_factory=dict)  # the same as -j keys of its own

    def percentile(self, p: float) -> float | None:
        if not self.latencies_us:
            return None
        ordered = sorted(self.latencies_us)
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]

    @property
    def summary(self) -> dict:
        lat = self.latencies_us
        return {
            "min": min(lat) if lat else None,
            "p50": self.percentile(50),
            "p99": self.percentile(99),
            "max": max(lat) if lat else None,
            "mean": statistics.fmean(lat) if lat else None,
        }


_BASE = bytes((i * 7 + 1) & 0xFF for i in range(256)) * 2


def pattern(seed: int, size: int) -> bytes:
    """A payload that differs from the previous iteration's, so stale data cannot pass."""
    start = (seed * 31) % 256
    block = _BASE[start : start + 256]
    return (block * (size // 256 + 1))[:size]


def pattern_wheel(size: int) -> bytes:
    """What every pattern(seed, size) is a slice of, from (seed * 31) % 256 on: a hot loop
    slices it instead of building each payload."""
    return _BASE[:256] * (size // 256 + 2)


class Mismatch(IbtoolError):
    pass


class OpUnsupported(IbtoolError):
    """The device, port or library cannot run this operation: UNSUPPORTED, the reason said."""


def drop_wait(timeout: float) -> float:
    """How long a message that must not arrive is waited for: 1/100 of an iteration's
    timeout, at least 5 ms (a UD delivery takes well under 1 ms on hardware, ~2 ms on rxe
    under emulation)."""
    return min(timeout, max(0.005, timeout / 100))


def wrong_qkey(qkey: int) -> int:
    """A Q_Key that differs from `qkey` and is not controlled: a work request's Q_Key with
    bit 31 set tells the HCA to send with the sending QP's own Q_Key instead (IBA's rule for
    UD sends), which would be the right one."""
    return (qkey ^ 1) & ~CONTROLLED_QKEY


def controlled_qkey_refused(qkey: int, error: IbtoolError) -> IbtoolError:
    return IbtoolError(
        f"Q_Key {qkey:#010x} is a controlled Q_Key (bit 31 set) and the kernel refused it to "
        f"this process ({error.message}); hint: run with CAP_NET_RAW (root), choose a Q_Key "
        "below 0x80000000 with --qkey, or let every process use them with `rdma system set "
        "privileged-qkey on` (Linux 6.7 and later)"
    )


class Loopback:
    """The QPs and buffers of one self-test; a context manager that owns them all."""

    def __init__(
        self,
        device: str,
        port: int,
        gid_index: int | None,
        size: int,
        depth: int,
        path: PathSpec = DEFAULT_PATH,
        *,
        qkey: int | None = None,
        mcast_source: str | None = None,
    ):
        """`path`: what the QPs are built with of it (the service level, the P_Key index, for
        RC and UD); `qkey`: the UD operations' Q_Key (None: DEFAULT_QKEY, not reported for
        ud_send); `mcast_source`: an IP address of the port's netdev, for rdma_cm (None: mcast
        is UNSUPPORTED)."""
        self.size, self.depth, self.path = size, depth, path
        self.sl, self.mcast_source = path.sl, mcast_source
        self.qkey_given = qkey is not None
        self.qkey = DEFAULT_QKEY if qkey is None else qkey
        self.ladder = Ladder(device, port, gid_index)
        try:
            self._build()
        except BaseException:
            self.ladder.close()
            raise

    def _build(self) -> None:
        lad, size = self.ladder, self.size
        self.wr = lad.pv.wr
        self.wr_opcode = lad.pv.e.ibv_wr_opcode
        # The atomic target sits after `depth` payload slots, 8-byte aligned as atomics need.
        self.slot = (size + 7) // 8 * 8 * self.depth
        span = self.slot + ATOMIC_SLOT
        self.cq_a, self.cq_b = lad.cq(self.depth * 2 + 4), lad.cq(self.depth * 2 + 4)
        self.mr_a, self.mr_b = lad.mr(span, ACCESS_ALL_REMOTE), lad.mr(span, ACCESS_ALL_REMOTE)
        rd_atomic = max(1, min(16, lad.dev_attr.max_qp_rd_atom, lad.dev_attr.max_qp_init_rd_atom))
        self.qp_a = lad.qp(self.cq_a, "rc", self.depth + 1, self.depth + 1)
        self.qp_b = lad.qp(self.cq_b, "rc", self.depth + 1, self.depth + 1)
        self._connect_pair(self.qp_a, self.qp_b, rd_atomic)
        self.atomics = lad.dev_attr.atomic_caps != 0
        self._ud = None
        self._qk = None
        self._mcast = None
        self._mcast_group: str | None = None  # the group address, once one is tried
        self._apm = None

    def _connect_pair(self, qp_a, qp_b, rd_atomic: int = 1) -> None:
        lad = self.ladder
        psn_a, psn_b = new_psn(), new_psn()
        peer_b, peer_a = lad.local(qp_b, psn_b), lad.local(qp_a, psn_a)
        lad.connect_rc(qp_a, psn_a, peer_b, ACCESS_ALL_REMOTE, rd_atomic, self.path)
        lad.connect_rc(qp_b, psn_b, peer_a, ACCESS_ALL_REMOTE, rd_atomic, self.path)

    def close(self) -> None:
        try:
            self.release("mcast")
        finally:
            self.ladder.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- building blocks -----------------------------------------------------------------

    def _sge(self, mr, offset: int, length: int):
        return self.wr.SGE(mr.buf + offset, length, mr.lkey)

    def _send_wr(self, opcode: int, mr, offset: int, length: int, wr_id: int = 0, imm: int = 0):
        return self.wr.SendWR(
            wr_id=wr_id, opcode=opcode, num_sge=1, imm_data=imm, sg=[self._sge(mr, offset, length)]
        )

    def _recv(self, qp, mr, offset: int, length: int, wr_id: int = 0) -> None:
        qp.post_recv(self.wr.RecvWR(wr_id=wr_id, num_sge=1, sg=[self._sge(mr, offset, length)]))

    def _verify(self, mr, offset: int, expected: bytes, what: str) -> None:
        got = mr.read(len(expected), offset)
        if got != expected:
            first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), len(got))
            raise Mismatch(f"{what}: data differs from byte {first} of {len(expected)}")

    # -- the operations, one iteration each ----------------------------------------------

    def send(self, i: int, deadline: float) -> None:
        data = pattern(i, self.size)
        self.mr_b.write(bytes(self.size), self.size, 0)
        self._recv(self.qp_b, self.mr_b, 0, self.size)
        self.mr_a.write(data, self.size, 0)
        self.qp_a.post_send(self._send_wr(self.wr_opcode.IBV_WR_SEND, self.mr_a, 0, self.size))
        poll(self.cq_a, 1, deadline, "SEND")
        (wc,) = poll(self.cq_b, 1, deadline, "RECV")
        if wc.opcode != IBV_WC_RECV or wc.byte_len != self.size:
            raise Mismatch(f"RECV completion opcode {wc.opcode} byte_len {wc.byte_len}")
        self._verify(self.mr_b, 0, data, "SEND/RECV")

    def write(self, i: int, deadline: float) -> None:
        data = pattern(i, self.size)
        self.mr_a.write(data, self.size, 0)
        wr = self._send_wr(self.wr_opcode.IBV_WR_RDMA_WRITE, self.mr_a, 0, self.size)
        wr.set_wr_rdma(self.mr_b.rkey, self.mr_b.buf)
        self.qp_a.post_send(wr)
        poll(self.cq_a, 1, deadline, "RDMA WRITE")
        self._verify(self.mr_b, 0, data, "RDMA WRITE")

    def write_imm(self, i: int, deadline: float) -> None:
        data, imm = pattern(i, self.size), (0xC0DE0000 + i) & 0xFFFFFFFF
        self._recv(self.qp_b, self.mr_b, self.size, 0)  # consumed by the immediate
        self.mr_a.write(data, self.size, 0)
        # imm_data is __be32 and pyverbs passes it through: convert ourselves.
        opcode = self.wr_opcode.IBV_WR_RDMA_WRITE_WITH_IMM
        wr = self._send_wr(opcode, self.mr_a, 0, self.size, imm=socket.htonl(imm))
        wr.set_wr_rdma(self.mr_b.rkey, self.mr_b.buf)
        self.qp_a.post_send(wr)
        poll(self.cq_a, 1, deadline, "RDMA WRITE WITH IMM")
        (wc,) = poll(self.cq_b, 1, deadline, "RECV of WRITE WITH IMM")
        if wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM or not wc.wc_flags & IBV_WC_WITH_IMM:
            raise Mismatch(
                f"receiver completion opcode {wc.opcode} flags {wc.wc_flags:#x}, "
                f"want RECV_RDMA_WITH_IMM with IBV_WC_WITH_IMM"
            )
        if socket.ntohl(wc.imm_data) != imm:
            raise Mismatch(f"immediate {socket.ntohl(wc.imm_data):#010x}, sent {imm:#010x}")
        self._verify(self.mr_b, 0, data, "RDMA WRITE WITH IMM")

    def read(self, i: int, deadline: float) -> None:
        data = pattern(i, self.size)
        self.mr_b.write(data, self.size, 0)
        self.mr_a.write(bytes(self.size), self.size, 0)
        wr = self._send_wr(self.wr_opcode.IBV_WR_RDMA_READ, self.mr_a, 0, self.size)
        wr.set_wr_rdma(self.mr_b.rkey, self.mr_b.buf)
        self.qp_a.post_send(wr)
        poll(self.cq_a, 1, deadline, "RDMA READ")
        self._verify(self.mr_a, 0, data, "RDMA READ")

    def _atomic(self, opcode: int, compare_add: int, swap: int, deadline: float, what: str):
        slot = self.slot
        wr = self._send_wr(opcode, self.mr_a, slot, ATOMIC_SLOT)
        wr.set_wr_atomic(self.mr_b.rkey, self.mr_b.buf + slot, compare_add, swap)
        self.qp_a.post_send(wr)
        poll(self.cq_a, 1, deadline, what)
        return slot

    def fetch_add(self, i: int, deadline: float) -> None:
        # Byte-replicated operands: the result does not depend on how the HCA orders bytes.
        start, add = (i % 100 + 1) * 0x0101010101010101, 0x0101010101010101
        slot = self.slot
        self.mr_b.write(struct.pack("<Q", start), ATOMIC_SLOT, slot)
        self._atomic(self.wr_opcode.IBV_WR_ATOMIC_FETCH_AND_ADD, add, 0, deadline, "FETCH_AND_ADD")
        self._verify(self.mr_a, slot, struct.pack("<Q", start), "FETCH_AND_ADD original value")
        self._verify(self.mr_b, slot, struct.pack("<Q", start + add), "FETCH_AND_ADD result")

    def cmp_swap(self, i: int, deadline: float) -> None:
        old, new = (i % 100 + 1) * 0x0101010101010101, 0x7F7F7F7F7F7F7F7F
        slot = self.slot
        for compare, expect in ((old + 1, old), (old, new)):  # a miss, then a hit
            self.mr_b.write(struct.pack("<Q", old), ATOMIC_SLOT, slot)
            self._atomic(
                self.wr_opcode.IBV_WR_ATOMIC_CMP_AND_SWP, compare, new, deadline, "COMPARE_AND_SWAP"
            )
            self._verify(self.mr_a, slot, struct.pack("<Q", old), "COMPARE_AND_SWAP original")
            self._verify(
                self.mr_b,
                slot,
                struct.pack("<Q", expect),
                "COMPARE_AND_SWAP " + ("swap" if expect == new else "no-swap on mismatch"),
            )

    def ud_send(self, i: int, deadline: float) -> None:
        lad = self.ladder
        mtu_bytes = 128 << lad.port_attr.active_mtu
        if self._ud is None:
            cq_s, cq_r = lad.cq(4), lad.cq(4)
            qp_s, qp_r = lad.qp(cq_s, "ud", 2, 2), lad.qp(cq_r, "ud", 2, 2)
            self._ready_ud(qp_s)
            self._ready_ud(qp_r)
            ah = lad.ah(lad.local(qp_r, 0), self.sl)
            mr = lad.mr(GRH_SIZE + mtu_bytes * 2, 1)
            self._ud = (cq_s, cq_r, qp_s, qp_r, ah, mr)
        cq_s, cq_r, qp_s, qp_r, ah, mr = self._ud
        size = min(self.size, mtu_bytes)  # a UD message fits in one MTU
        data = pattern(i, size)
        recv_at = mtu_bytes
        self._recv(qp_r, mr, recv_at, GRH_SIZE + size)
        mr.write(data, size, 0)
        wr = self._send_wr(self.wr_opcode.IBV_WR_SEND, mr, 0, size)
        wr.set_wr_ud(ah, qp_r.qp_num, self.qkey)
        qp_s.post_send(wr)
        poll(cq_s, 1, deadline, "UD SEND")
        (wc,) = poll(cq_r, 1, deadline, "UD RECV")
        if wc.byte_len != GRH_SIZE + size:
            raise Mismatch(f"UD receive of {wc.byte_len} bytes, want {GRH_SIZE + size}")
        self._check_sl(wc, "UD RECV")
        self._verify(mr, recv_at + GRH_SIZE, data, "UD SEND/RECV")

    def _check_sl(self, wc, what: str) -> None:
        # A UD completion carries the SL the packet came on (ibv_poll_cq(3)); on InfiniBand
        # that is the one sent. RoCE has no SL on the wire: its wc.sl is the driver's guess.
        if self.sl and self.ladder.link_layer == LinkLayer.INFINIBAND and wc.sl != self.sl:
            raise Mismatch(f"{what} came on SL {wc.sl}, sent on SL {self.sl}")

    def _ready_ud(self, qp, qkey: int | None = None) -> None:
        qkey = self.qkey if qkey is None else qkey
        try:
            self.ladder.ready_ud(qp, new_psn(), qkey, pkey_index=self.path.pkey_index)
        except PermissionDeniedError as e:
            if qkey & CONTROLLED_QKEY:
                raise controlled_qkey_refused(qkey, e) from None
            raise

    # -- the fabric's rules --------------------------------------------------------------

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
            self._ready_ud(qp_s)
            self._ready_ud(qp_r)
            ah = lad.ah(lad.local(qp_r, 0), self.sl)
            mr = lad.mr(size * 2 + slot * 2, 1)  # right, wrong, then two receive slots
            viol = lad.ctx.query_port(lad.port).qkey_viol_cntr
            self._qk = dict(cq_s=cq_s, cq_r=cq_r, qp_s=qp_s, qp_r=qp_r, ah=ah, mr=mr)
            self._qk.update(viol=viol, wrong=0, posted=0)
            self._recv(qp_r, mr, size * 2, slot, wr_id=0)  # one receive always stays posted
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
        self._recv(q["qp_r"], mr, size * 2 + spare * slot, slot, wr_id=spare)
        q["posted"] += 1
        for offset, key in ((size, bad_key), (0, right_key)):
            wr = self._send_wr(self.wr_opcode.IBV_WR_SEND, mr, offset, size)
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
        self._check_sl(wc, "UD RECV")
        self._verify(mr, at, right, "UD SEND/RECV with the right Q_Key")

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
        from ibtool.rdma import mcast  # rdma_cm: only for this operation

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
        group.round(pattern(i, group.size), deadline, self._verify)

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
            self._recv(dst, mr_d, 0, self.size)
            mr_s.write(data, self.size, 0)
            src.post_send(self._send_wr(self.wr_opcode.IBV_WR_SEND, mr_s, 0, self.size))
            poll(cq_s, 1, deadline, "SEND on the migrated path")
            poll(cq_d, 1, deadline, "RECV on the migrated path")
            self._verify(mr_d, 0, data, "SEND on the migrated path")

    def _migrated_pair(self, deadline: float) -> dict:
        lad = self.ladder
        reason = apm.unsupported_reason(lad)
        if reason:
            raise OpUnsupported(reason)
        cq_a, cq_b = lad.cq(4), lad.cq(4)
        mr_a, mr_b = lad.mr(self.size, ACCESS_ALL_REMOTE), lad.mr(self.size, ACCESS_ALL_REMOTE)
        qp_a, qp_b = lad.qp(cq_a, "rc", 2, 2), lad.qp(cq_b, "rc", 2, 2)
        self._connect_pair(qp_a, qp_b)
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
        if op == "ud_send" and self.qkey_given:
            return {"qkey": f"{self.qkey:#010x}"}
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
        return {}

    def finish(self, op: str, result: OpResult, timeout: float) -> None:
        """An operation's last checks after its rounds, and what it proved (detail, facts)."""
        done = getattr(self, f"_finish_{op}", None)
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

    def _drain(self, cq, what: str) -> int:
        n, wcs = cq.poll(num_entries=self.depth)
        for wc in wcs:
            if wc.status != 0:
                raise CompletionError(wc, what)
        return n

    # -- pipelined bandwidth -------------------------------------------------------------

    def bandwidth(self, op: str, iters: int, deadline: float) -> float:
        """MB/s with up to `depth` operations in flight."""
        wr_op, size = self.wr_opcode, self.size
        opcode = {
            "send": wr_op.IBV_WR_SEND,
            "write": wr_op.IBV_WR_RDMA_WRITE,
            "read": wr_op.IBV_WR_RDMA_READ,
        }[op]
        local, remote = self.mr_a, self.mr_b
        posted = done = received = 0
        start = time.perf_counter()
        while done < iters or (op == "send" and received < iters):
            while posted < iters and posted - done < self.depth:
                slot = (posted % self.depth) * size
                if op == "send":
                    self._recv(self.qp_b, self.mr_b, slot, size)
                wr = self._send_wr(opcode, local, slot, size, wr_id=posted)
                if op != "send":
                    wr.set_wr_rdma(remote.rkey, remote.buf + slot)
                self.qp_a.post_send(wr)
                posted += 1
            sent = self._drain(self.cq_a, f"{op} bandwidth")
            # The receiver's CQ is drained as we go: it must not overflow either.
            got = self._drain(self.cq_b, "RECV (bandwidth)") if op == "send" else 0
            done, received = done + sent, received + got
            if not (sent or got) and time.monotonic() > deadline:
                raise CompletionTimeout(f"{op} bandwidth: {done} of {iters} completed")
        elapsed = time.perf_counter() - start
        return size * iters / elapsed / 1e6


def run_op(lb: Loopback, op: str, iters: int, timeout: float, bandwidth_iters: int = 0) -> OpResult:
    result = OpResult(op, Status.PASS, lb.size)
    if op in ATOMIC_OPS and not lb.atomics:
        result.status, result.error = Status.UNSUPPORTED, "device reports atomic_caps NONE"
        return result
    step: Callable[[int, float], None] = getattr(lb, op)
    try:
        step(iters, time.monotonic() + timeout)  # warm-up: first-touch faults, ARP, caches
        for i in range(iters):
            deadline = time.monotonic() + timeout
            t0 = time.perf_counter()
            step(i, deadline)
            result.latencies_us.append((time.perf_counter() - t0) * 1e6)
            result.iters += 1
        if bandwidth_iters and op in BANDWIDTH_OPS:
            result.bandwidth_mbps = lb.bandwidth(
                op, bandwidth_iters, time.monotonic() + timeout * 4
            )
        lb.finish(op, result, timeout)
    except OpUnsupported as e:
        result.status, result.error = Status.UNSUPPORTED, e.message
    except CompletionTimeout as e:
        result.status, result.error = Status.TIMEOUT, e.message
    except (CompletionError, Mismatch) as e:
        result.status, result.error = Status.FAIL, e.message
    except IbtoolError as e:
        result.status, result.error = Status.FAIL, e.message
    finally:
        try:
            result.facts = {**lb.facts(op), **result.facts}
        finally:
            lb.release(op)
    return result


def run(
    device: str,
    port: int,
    gid_index: int | None,
    ops: Iterable[str],
    size: int,
    iters: int,
    timeout: float,
    depth: int = 16,
    path: PathSpec = DEFAULT_PATH,
    **fabric,
) -> list[OpResult]:
    """`fabric`: Loopback's keyword arguments (qkey, mcast_source)."""
    with Loopback(device, port, gid_index, size, depth, path, **fabric) as lb:
        return [run_op(lb, op, iters, timeout, bandwidth_iters=max(iters, depth * 8)) for op in ops]
