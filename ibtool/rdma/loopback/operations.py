"""Loopback self-test, the RDMA operations: two RC QPs (and two UD QPs) on one port, every
operation verified.

Each operation runs `iters` times one at a time (latency: post to last completion), checking
the data every time; SEND, WRITE and READ then run pipelined `depth` deep for bandwidth
(selftest.py times them). The fabric's own rules are fabric.py's.
"""

from __future__ import annotations

import socket
import struct
import time

from ibtool.errors import IbtoolError, PermissionDeniedError
from ibtool.model.records import LinkLayer
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
from ibtool.rdma.loopback.pattern import pattern
from ibtool.rdma.loopback.results import Mismatch, OpResult

IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_WITH_IMM = 128, 129, 2
ATOMIC_SLOT = 8
CONTROLLED_QKEY = 0x80000000  # Q_Key bit 31: a controlled Q_Key (IBA; ib_verbs.h IB_QP_SET_QKEY)


def controlled_qkey_refused(qkey: int, error: IbtoolError) -> IbtoolError:
    """The kernel's refusal of a controlled Q_Key, said with what lets this process use one."""
    return IbtoolError(
        f"Q_Key {qkey:#010x} is a controlled Q_Key (bit 31 set) and the kernel refused it to "
        f"this process ({error.message}); hint: run with CAP_NET_RAW (root), choose a Q_Key "
        "below 0x80000000 with --qkey, or let every process use them with `rdma system set "
        "privileged-qkey on` (Linux 6.7 and later)"
    )


class Loopback:
    """The QPs and buffers of one self-test and its RDMA operations; a context manager that owns
    them all."""

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
    ):
        """`path`: what the QPs are built with of it (the service level, the P_Key index, for
        RC and UD); `qkey`: the UD operations' Q_Key (None: DEFAULT_QKEY, not reported for
        ud_send)."""
        self.size, self.depth, self.path = size, depth, path
        self.sl = path.sl
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
        self.connect_pair(self.qp_a, self.qp_b, rd_atomic)
        self.atomics = lad.dev_attr.atomic_caps != 0
        self._ud = None

    def connect_pair(self, qp_a, qp_b, rd_atomic: int = 1) -> None:
        """Connect two RC QPs of this port to each other, on the self-test's path."""
        lad = self.ladder
        psn_a, psn_b = new_psn(), new_psn()
        peer_b, peer_a = lad.local(qp_b, psn_b), lad.local(qp_a, psn_a)
        lad.connect_rc(qp_a, psn_a, peer_b, ACCESS_ALL_REMOTE, rd_atomic, self.path)
        lad.connect_rc(qp_b, psn_b, peer_a, ACCESS_ALL_REMOTE, rd_atomic, self.path)

    def close(self) -> None:
        try:
            self.release("mcast")  # a fabric test's group, left before the ladder goes
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

    def send_wr(self, opcode: int, mr, offset: int, length: int, wr_id: int = 0, imm: int = 0):
        """A SendWR of `opcode` for `length` bytes of `mr` from `offset`."""
        return self.wr.SendWR(
            wr_id=wr_id, opcode=opcode, num_sge=1, imm_data=imm, sg=[self._sge(mr, offset, length)]
        )

    def post_recv(self, qp, mr, offset: int, length: int, wr_id: int = 0) -> None:
        """Post a receive on `qp` into `length` bytes of `mr` from `offset`."""
        qp.post_recv(self.wr.RecvWR(wr_id=wr_id, num_sge=1, sg=[self._sge(mr, offset, length)]))

    def verify(self, mr, offset: int, expected: bytes, what: str) -> None:
        """`mr` holds `expected` at `offset`, or Mismatch names the first byte that differs."""
        got = mr.read(len(expected), offset)
        if got != expected:
            first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), len(got))
            raise Mismatch(f"{what}: data differs from byte {first} of {len(expected)}")

    # -- the operations, one iteration each ----------------------------------------------

    def send(self, i: int, deadline: float) -> None:
        data = pattern(i, self.size)
        self.mr_b.write(bytes(self.size), self.size, 0)
        self.post_recv(self.qp_b, self.mr_b, 0, self.size)
        self.mr_a.write(data, self.size, 0)
        self.qp_a.post_send(self.send_wr(self.wr_opcode.IBV_WR_SEND, self.mr_a, 0, self.size))
        poll(self.cq_a, 1, deadline, "SEND")
        (wc,) = poll(self.cq_b, 1, deadline, "RECV")
        if wc.opcode != IBV_WC_RECV or wc.byte_len != self.size:
            raise Mismatch(f"RECV completion opcode {wc.opcode} byte_len {wc.byte_len}")
        self.verify(self.mr_b, 0, data, "SEND/RECV")

    def write(self, i: int, deadline: float) -> None:
        data = pattern(i, self.size)
        self.mr_a.write(data, self.size, 0)
        wr = self.send_wr(self.wr_opcode.IBV_WR_RDMA_WRITE, self.mr_a, 0, self.size)
        wr.set_wr_rdma(self.mr_b.rkey, self.mr_b.buf)
        self.qp_a.post_send(wr)
        poll(self.cq_a, 1, deadline, "RDMA WRITE")
        self.verify(self.mr_b, 0, data, "RDMA WRITE")

    def write_imm(self, i: int, deadline: float) -> None:
        data, imm = pattern(i, self.size), (0xC0DE0000 + i) & 0xFFFFFFFF
        self.post_recv(self.qp_b, self.mr_b, self.size, 0)  # consumed by the immediate
        self.mr_a.write(data, self.size, 0)
        # imm_data is __be32 and pyverbs passes it through: convert ourselves.
        opcode = self.wr_opcode.IBV_WR_RDMA_WRITE_WITH_IMM
        wr = self.send_wr(opcode, self.mr_a, 0, self.size, imm=socket.htonl(imm))
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
        self.verify(self.mr_b, 0, data, "RDMA WRITE WITH IMM")

    def read(self, i: int, deadline: float) -> None:
        data = pattern(i, self.size)
        self.mr_b.write(data, self.size, 0)
        self.mr_a.write(bytes(self.size), self.size, 0)
        wr = self.send_wr(self.wr_opcode.IBV_WR_RDMA_READ, self.mr_a, 0, self.size)
        wr.set_wr_rdma(self.mr_b.rkey, self.mr_b.buf)
        self.qp_a.post_send(wr)
        poll(self.cq_a, 1, deadline, "RDMA READ")
        self.verify(self.mr_a, 0, data, "RDMA READ")

    def _atomic(self, opcode: int, compare_add: int, swap: int, deadline: float, what: str):
        slot = self.slot
        wr = self.send_wr(opcode, self.mr_a, slot, ATOMIC_SLOT)
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
        self.verify(self.mr_a, slot, struct.pack("<Q", start), "FETCH_AND_ADD original value")
        self.verify(self.mr_b, slot, struct.pack("<Q", start + add), "FETCH_AND_ADD result")

    def cmp_swap(self, i: int, deadline: float) -> None:
        old, new = (i % 100 + 1) * 0x0101010101010101, 0x7F7F7F7F7F7F7F7F
        slot = self.slot
        for compare, expect in ((old + 1, old), (old, new)):  # a miss, then a hit
            self.mr_b.write(struct.pack("<Q", old), ATOMIC_SLOT, slot)
            self._atomic(
                self.wr_opcode.IBV_WR_ATOMIC_CMP_AND_SWP, compare, new, deadline, "COMPARE_AND_SWAP"
            )
            self.verify(self.mr_a, slot, struct.pack("<Q", old), "COMPARE_AND_SWAP original")
            self.verify(
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
            self.ready_ud(qp_s)
            self.ready_ud(qp_r)
            ah = lad.ah(lad.local(qp_r, 0), self.sl)
            mr = lad.mr(GRH_SIZE + mtu_bytes * 2, 1)
            self._ud = (cq_s, cq_r, qp_s, qp_r, ah, mr)
        cq_s, cq_r, qp_s, qp_r, ah, mr = self._ud
        size = min(self.size, mtu_bytes)  # a UD message fits in one MTU
        data = pattern(i, size)
        recv_at = mtu_bytes
        self.post_recv(qp_r, mr, recv_at, GRH_SIZE + size)
        mr.write(data, size, 0)
        wr = self.send_wr(self.wr_opcode.IBV_WR_SEND, mr, 0, size)
        wr.set_wr_ud(ah, qp_r.qp_num, self.qkey)
        qp_s.post_send(wr)
        poll(cq_s, 1, deadline, "UD SEND")
        (wc,) = poll(cq_r, 1, deadline, "UD RECV")
        if wc.byte_len != GRH_SIZE + size:
            raise Mismatch(f"UD receive of {wc.byte_len} bytes, want {GRH_SIZE + size}")
        self.check_sl(wc, "UD RECV")
        self.verify(mr, recv_at + GRH_SIZE, data, "UD SEND/RECV")

    def check_sl(self, wc, what: str) -> None:
        """A UD completion came on the service level it was sent on (InfiniBand only)."""
        # A UD completion carries the SL the packet came on (ibv_poll_cq(3)); on InfiniBand
        # that is the one sent. RoCE has no SL on the wire: its wc.sl is the driver's guess.
        if self.sl and self.ladder.link_layer == LinkLayer.INFINIBAND and wc.sl != self.sl:
            raise Mismatch(f"{what} came on SL {wc.sl}, sent on SL {self.sl}")

    def ready_ud(self, qp, qkey: int | None = None) -> None:
        """A UD QP to RTS with `qkey` (None: the self-test's) in the P_Key slot of the path."""
        qkey = self.qkey if qkey is None else qkey
        try:
            self.ladder.ready_ud(qp, new_psn(), qkey, pkey_index=self.path.pkey_index)
        except PermissionDeniedError as e:
            if qkey & CONTROLLED_QKEY:
                raise controlled_qkey_refused(qkey, e) from None
            raise

    # -- what an operation used and proved -----------------------------------------------

    def facts(self, op: str) -> dict:
        """The -j keys of what an operation used, as far as it got (a failure has them too)."""
        if op == "ud_send" and self.qkey_given:
            return {"qkey": f"{self.qkey:#010x}"}
        return {}

    def finish(self, op: str, result: OpResult, timeout: float) -> None:
        """An operation's last checks after its rounds, and what it proved (detail, facts):
        nothing more for these; the fabric's rules (fabric.py) have some."""

    def release(self, op: str) -> None:
        """Close what an operation holds outside the ladder: nothing for these."""

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
                    self.post_recv(self.qp_b, self.mr_b, slot, size)
                wr = self.send_wr(opcode, local, slot, size, wr_id=posted)
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
