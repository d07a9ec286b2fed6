"""Fake pyverbs module trees shaped like Debian's python3-pyverbs, over an in-memory device.

The layouts are what each release's own root showed (Python 3.9 to 3.14):

- rdma-core 33 (bullseye) and 44 (bookworm): `pyverbs.enums` and `pyverbs.cm_enums` only; every
  enum is an IntEnum class and each member is also a flat module name (Cython 0.29); CMID has no
  `reject` in 33;
- rdma-core 56 (trixie): both `enums`/`libibverbs_enums` and `cm_enums`/`librdmacm_enums`, two
  copies of the same IntFlag classes (Cython 3.0), flat names too;
- rdma-core 65 (sid): `libibverbs_enums`/`librdmacm_enums` only, built with Cython 3.1: the
  classes alone, no flat names but IBV_LINK_LAYER_*; `pyverbs.__version__` exists.

The device behind them executes work requests as soon as they are posted: RC SEND, RDMA WRITE
(with immediate), RDMA READ, the two atomics and UD SEND, with the completions libibverbs
would give, so the data path runs end to end and verifies its own data. The fabric's rules are
the kernel's and the HCA's: a UD message whose Q_Key differs from the receiving QP's is dropped
and counted in the port's qkey_viol_cntr; a UD SEND to the multicast QPN reaches the QPs
attached to its MGID, which an rdma_cm id (RDMA_PS_UDP) attaches its QP to when it joins; an
alternate path (APM) is refused on a non-InfiniBand port with EINVAL, as Linux's verbs core
does, and otherwise armed by the "HCA" when the port's `arms` says so.
"""

from __future__ import annotations

import enum
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from errno import EADDRNOTAVAIL, EAGAIN, EINVAL, ENOENT, EOPNOTSUPP, EPERM
from types import ModuleType, SimpleNamespace

# uapi numbers (libibverbs/verbs.h, librdmacm/rdma_cma.h); a member missing here is not used.
IBV_ENUMS = {
    "ibv_qp_type": {"IBV_QPT_RC": 2, "IBV_QPT_UC": 3, "IBV_QPT_UD": 4},
    "ibv_qp_state": {"IBV_QPS_RESET": 0, "IBV_QPS_INIT": 1, "IBV_QPS_RTR": 2, "IBV_QPS_RTS": 3},
    "ibv_wr_opcode": {
        "IBV_WR_RDMA_WRITE": 0,
        "IBV_WR_RDMA_WRITE_WITH_IMM": 1,
        "IBV_WR_SEND": 2,
        "IBV_WR_SEND_WITH_IMM": 3,
        "IBV_WR_RDMA_READ": 4,
        "IBV_WR_ATOMIC_CMP_AND_SWP": 5,
        "IBV_WR_ATOMIC_FETCH_AND_ADD": 6,
    },
    "ibv_create_cq_wc_flags": {
        "IBV_WC_EX_WITH_BYTE_LEN": 1,
        "IBV_WC_EX_WITH_IMM": 2,
        "IBV_WC_EX_WITH_QP_NUM": 4,
    },
    "ibv_wc_opcode": {
        "IBV_WC_SEND": 0,
        "IBV_WC_RDMA_WRITE": 1,
        "IBV_WC_RDMA_READ": 2,
        "IBV_WC_COMP_SWAP": 3,
        "IBV_WC_FETCH_ADD": 4,
        "IBV_WC_RECV": 128,
        "IBV_WC_RECV_RDMA_WITH_IMM": 129,
    },
    "ibv_wc_flags": {"IBV_WC_GRH": 1, "IBV_WC_WITH_IMM": 2},
    "ibv_send_flags": {"IBV_SEND_FENCE": 1, "IBV_SEND_SIGNALED": 2, "IBV_SEND_INLINE": 8},
}
IBV_FLAT_ONLY = {  # plain module constants in every release
    "IBV_LINK_LAYER_UNSPECIFIED": 0,
    "IBV_LINK_LAYER_INFINIBAND": 1,
    "IBV_LINK_LAYER_ETHERNET": 2,
}
CM_ENUMS = {
    "rdma_port_space": {
        "RDMA_PS_IPOIB": 0x0002,
        "RDMA_PS_TCP": 0x0106,
        "RDMA_PS_UDP": 0x0111,
        "RDMA_PS_IB": 0x013F,
    },
    "rdma_cm_event_type": {
        name: number
        for number, name in enumerate(
            (
                "RDMA_CM_EVENT_ADDR_RESOLVED",
                "RDMA_CM_EVENT_ADDR_ERROR",
                "RDMA_CM_EVENT_ROUTE_RESOLVED",
                "RDMA_CM_EVENT_ROUTE_ERROR",
                "RDMA_CM_EVENT_CONNECT_REQUEST",
                "RDMA_CM_EVENT_CONNECT_RESPONSE",
                "RDMA_CM_EVENT_CONNECT_ERROR",
                "RDMA_CM_EVENT_UNREACHABLE",
                "RDMA_CM_EVENT_REJECTED",
                "RDMA_CM_EVENT_ESTABLISHED",
                "RDMA_CM_EVENT_DISCONNECTED",
                "RDMA_CM_EVENT_DEVICE_REMOVAL",
                "RDMA_CM_EVENT_MULTICAST_JOIN",
                "RDMA_CM_EVENT_MULTICAST_ERROR",
            )
        )
    },
}


TICK = 1000  # counter ticks per step of the fake HCA clock: 1 us at 1 GHz


@dataclass(frozen=True)
class Layout:
    enum_modules: tuple[str, ...]
    cm_enum_modules: tuple[str, ...]
    flat_names: bool
    enum_base: type
    cmid_reject: bool
    version: str | None = None


LAYOUTS = {
    "rdma-core-33": Layout(("enums",), ("cm_enums",), True, enum.IntEnum, False),
    "rdma-core-44": Layout(("enums",), ("cm_enums",), True, enum.IntEnum, True),
    "rdma-core-56": Layout(
        ("enums", "libibverbs_enums"), ("cm_enums", "librdmacm_enums"), True, enum.IntFlag, True
    ),
    "rdma-core-65": Layout(
        ("libibverbs_enums",), ("librdmacm_enums",), False, enum.IntFlag, True, "65.0"
    ),
}
PYVERBS_MODULES = (
    "pyverbs_error",
    "device",
    "pd",
    "cq",
    "mr",
    "qp",
    "wr",
    "addr",
    "cmid",
    "enums",
    "libibverbs_enums",
    "cm_enums",
    "librdmacm_enums",
)
GRH_SIZE = 40
WR = IBV_ENUMS["ibv_wr_opcode"]
WC = IBV_ENUMS["ibv_wc_opcode"]
ACCESS_REMOTE_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_ATOMIC = 2, 4, 8
WC_REM_INV_REQ_ERR, WC_REM_ACCESS_ERR, WC_RETRY_EXC_ERR = 9, 10, 12
MULTICAST_QPN = 0xFFFFFF
RDMA_UDP_QKEY = 0x01234567  # the Q_Key the kernel gives an RDMA_PS_UDP id's QP
QP_ALT_PATH, QP_PATH_MIG_STATE = 1 << 14, 1 << 18
MIG_MIGRATED, MIG_REARM, MIG_ARMED = 0, 1, 2


# -- the device ------------------------------------------------------------------------------


@dataclass
class FakePort:
    link_layer: int  # 1 InfiniBand, 2 Ethernet
    lid: int = 0
    gids: dict[int, str] = field(default_factory=dict)
    active_mtu: int = 3  # ibv_mtu: 1024
    timestamp_mask: int = 0  # the device's completion_timestamp_mask (mlx5: 2^64 - 1)
    core_clock_khz: int = 0  # its hca_core_clock
    cap_flags: int = 0  # the device's device_cap_flags (bit 4: AUTO_PATH_MIG)
    lmc: int = 0
    arms: bool = True  # the HCA arms a loaded alternate path (REARM -> ARMED)
    qkey_viol_cntr: int = 0


class Fabric:
    """The ports, memory and QPs every fake object of one install shares."""

    def __init__(self):
        self.ports: dict[tuple[str, int], FakePort] = {}
        self.qps: dict[int, FakeQP] = {}
        self.mrs: list[FakeMR] = []
        self.cqex_fails = False  # a provider without ibv_create_cq_ex
        self.groups: dict[str, set[int]] = {}  # MGID -> QP numbers attached
        self.cm_ids: set = set()  # rdma_cm ids not destroyed
        self.ignores_qkey = False  # a broken device: delivers whatever the Q_Key
        self.floods_mcast = False  # a broken device: a multicast reaches every UD QP
        self.join_errno = 0  # what rdma_join_multicast fails with (0: it does not)
        self.mlid = 0xC001  # the MLID an InfiniBand subnet manager gives a group
        self.ipoib: dict[str, tuple[str, int]] = {}  # IPoIB address -> (device, port)
        self.controlled_qkeys = True  # the process may use Q_Keys with bit 31 (CAP_NET_RAW)
        self.rtr_sls: list[int] = []  # the SL of each RC QP's path, as INIT->RTR gave it
        self.wc_sl: int | None = None  # a broken device: UD completions on this SL
        self.clock = 0  # the HCA's counter: moves TICK at each reading and each receive
        self._next_addr, self._next_qpn, self._next_key = 0x7F0000001000, 0x11, 0x100

    def add_port(self, device: str, port: int, **attrs) -> None:
        self.ports[(device, port)] = FakePort(**attrs)

    def allocate(self, length: int) -> tuple[int, int]:
        addr, key = self._next_addr, self._next_key
        self._next_addr += (length // 4096 + 2) * 4096
        self._next_key += 1
        return addr, key

    def tick(self) -> int:
        self.clock += TICK
        return self.clock

    def new_qpn(self) -> int:
        self._next_qpn += 1
        return self._next_qpn

    def memory(self, addr: int, length: int, rkey: int | None = None):
        for mr in self.mrs:
            if mr.buf <= addr and addr + length <= mr.buf + mr.length:
                if rkey is not None and rkey != mr.rkey:
                    break
                return mr, addr - mr.buf
        return None, 0

    def read(self, addr: int, length: int) -> bytes:
        mr, offset = self.memory(addr, length)
        return bytes(mr.data[offset : offset + length])

    def write(self, addr: int, data: bytes) -> None:
        mr, offset = self.memory(addr, len(data))
        mr.data[offset : offset + len(data)] = data


def _wc(**fields) -> SimpleNamespace:
    base = dict(
        wr_id=0, status=0, opcode=0, vendor_err=0, byte_len=0, imm_data=0, wc_flags=0, ts=0, sl=0
    )
    return SimpleNamespace(**{**base, **fields})


class PyverbsError(Exception):
    pass


class PyverbsRDMAError(PyverbsError):
    def __init__(self, message: str, error_code: int = 0):
        super().__init__(f"{message}. Errno: {error_code}")
        self.error_code = error_code


class _Closable:
    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class FakeContext(_Closable):
    fabric: Fabric

    def __init__(self, name: str | None = None):
        if not any(device == name for device, _ in self.fabric.ports):
            raise PyverbsRDMAError(f"Failed to find device {name}")
        self.name = name

    def query_device(self):
        flags = next(p.cap_flags for (d, _), p in self.fabric.ports.items() if d == self.name)
        return SimpleNamespace(
            max_qp_rd_atom=16, max_qp_init_rd_atom=16, atomic_caps=1, device_cap_flags=flags
        )

    def query_device_ex(self):
        p = next(p for (d, _), p in self.fabric.ports.items() if d == self.name)
        return SimpleNamespace(
            completion_timestamp_mask=p.timestamp_mask, hca_core_clock=p.core_clock_khz
        )

    def query_rt_values_ex(self, comp_mask: int = 1):
        return 0, self.fabric.tick()  # as mlx5: the raw counter in the nanoseconds field

    def query_port(self, port: int):
        p = self.fabric.ports[(self.name, port)]
        return SimpleNamespace(
            link_layer=p.link_layer,
            flags=0,
            lid=p.lid,
            lmc=p.lmc,
            active_mtu=p.active_mtu,
            state=4,
            qkey_viol_cntr=p.qkey_viol_cntr,
            gid_tbl_len=max(p.gids, default=-1) + 1 if p.gids else 0,
        )

    def query_gid(self, port: int, index: int):
        gids = self.fabric.ports[(self.name, port)].gids
        if index not in gids:  # the kernel's ENODATA for an empty slot (ib_query_gid)
            raise PyverbsRDMAError(f"Failed to query gid {index} of port {port}", 61)
        return FakeGID(gids[index])

    def query_gid_type(self, port: int, index: int):
        self.query_gid(port, index)
        return 2  # IBV_GID_TYPE_SYSFS_ROCE_V2


class FakePD(_Closable):
    def __init__(self, ctx):
        self.ctx = ctx


def _yield_gil() -> None:
    # A ping test runs client and server as two threads of one process, each busy-polling its
    # CQ. An empty poll gives the other thread the interpreter, or one thread can hold it for
    # tens of seconds (measured: a 3-ping test took 20 to 110 s, spread over pings).
    time.sleep(0)


class FakeCQ(_Closable):
    def __init__(self, ctx, cqe: int = 100, *args):
        self.wcs: deque = deque()

    def push(self, wc) -> None:
        self.wcs.append(wc)

    def poll(self, num_entries: int = 1):
        if not self.wcs:
            _yield_gil()
            return 0, []
        got = [self.wcs.popleft() for _ in range(min(num_entries, len(self.wcs)))]
        return len(got), got


class FakeCqInitAttrEx:
    def __init__(self, cqe: int = 100, wc_flags: int = 0, **kwargs):
        self.cqe, self.wc_flags = cqe, wc_flags


class FakePollCqAttr:
    pass


class FakeCQEX(FakeCQ):
    fabric: Fabric

    def __init__(self, ctx, init_attr: FakeCqInitAttrEx):
        if self.fabric.cqex_fails:
            raise PyverbsRDMAError("Failed to create extended CQ", EOPNOTSUPP)
        super().__init__(ctx, init_attr.cqe)
        self.wc_flags, self.current = int(init_attr.wc_flags), None

    def start_poll(self, attr) -> int:
        assert isinstance(attr, FakePollCqAttr)
        if not self.wcs:
            _yield_gil()
            return ENOENT
        self.current = self.wcs.popleft()
        return 0

    def end_poll(self) -> None:
        self.current = None

    @property
    def status(self) -> int:
        return self.current.status

    def read_opcode(self) -> int:
        return self.current.opcode

    def read_vendor_err(self) -> int:
        return self.current.vendor_err

    def read_timestamp(self) -> int:
        assert self.wc_flags & 1 << 7  # IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, as for the others
        return self.current.ts

    def read_byte_len(self) -> int:
        # As libibverbs: without IBV_WC_EX_WITH_BYTE_LEN the reader is NULL (SIGSEGV there).
        assert self.wc_flags & IBV_ENUMS["ibv_create_cq_wc_flags"]["IBV_WC_EX_WITH_BYTE_LEN"]
        return self.current.byte_len

    def read_imm_data(self) -> int:
        # Only a CQ created with IBV_WC_EX_WITH_IMM carries the immediate.
        assert self.wc_flags & IBV_ENUMS["ibv_create_cq_wc_flags"]["IBV_WC_EX_WITH_IMM"]
        return self.current.imm_data


class FakeMR(_Closable):
    fabric: Fabric

    def __init__(self, pd, length: int, access: int):
        self.length, self.access = length, access
        self.buf, self.lkey = self.fabric.allocate(length)
        self.rkey = self.lkey
        self.data = bytearray(length)
        self.fabric.mrs.append(self)

    def read(self, length: int, offset: int) -> bytes:
        return bytes(self.data[offset : offset + length])

    def write(self, data: bytes, length: int, offset: int = 0) -> None:
        self.data[offset : offset + length] = data[:length]

    def close(self) -> None:
        if self in self.fabric.mrs:
            self.fabric.mrs.remove(self)


class _Attrs:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FakeQPCap(_Attrs):
    pass


class FakeQPAttr(_Attrs):
    pass


class FakeQPInitAttr(_Attrs):
    pass


class FakeAHAttr(_Attrs):
    def __init__(self, sl=0, **kwargs):
        super().__init__(sl=sl, **kwargs)


class FakeGID:
    def __init__(self, val: str | None = None):
        self.gid = val or "0000:0000:0000:0000:0000:0000:0000:0000"

    def __str__(self) -> str:
        return self.gid


class FakeGlobalRoute:
    def __init__(self, dgid=None, flow_label=0, sgid_index=0, hop_limit=1, traffic_class=0):
        self.dgid, self.sgid_index, self.hop_limit = dgid, sgid_index, hop_limit


class FakeAH(_Closable):
    def __init__(self, pd, attr=None, **kwargs):
        self.attr = attr


class FakeSGE:
    def __init__(self, addr: int, length: int, lkey: int):
        self.addr, self.length, self.lkey = addr, length, lkey


class FakeRecvWR:
    def __init__(self, wr_id: int = 0, num_sge: int = 0, sg=None):
        self.wr_id, self.sg = wr_id, list(sg or [])


class FakeSendWR:
    def __init__(self, wr_id=0, opcode=WR["IBV_WR_SEND"], num_sge=0, imm_data=0, sg=None):
        self.wr_id, self.opcode, self.imm_data, self.sg = wr_id, opcode, imm_data, list(sg or [])
        self.send_flags = 2  # pyverbs' default: IBV_SEND_SIGNALED
        self.remote = self.atomic = self.ud = None

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        self.remote = (rkey, addr)

    def set_wr_atomic(self, rkey: int, addr: int, compare_add: int, swap: int = 0) -> None:
        self.remote, self.atomic = (rkey, addr), (compare_add, swap)

    def set_wr_ud(self, ah, rqpn: int, rqkey: int) -> None:
        self.ud = (ah, rqpn, rqkey)


class FakeQP(_Closable):
    fabric: Fabric

    def __init__(self, pd, init_attr, qp_attr=None):
        self.type = int(init_attr.qp_type)
        assert self.type in (2, 4), f"QP type {init_attr.qp_type!r}"
        self.scq, self.rcq, self.sq_sig_all = init_attr.scq, init_attr.rcq, init_attr.sq_sig_all
        self.device = pd.ctx.name
        self.qp_num = self.fabric.new_qpn()
        self.state, self.recvs, self.attr = 0, deque(), None
        self.mig_state, self.alt = MIG_MIGRATED, None
        self.fabric.qps[self.qp_num] = self

    def close(self) -> None:
        self.fabric.qps.pop(self.qp_num, None)
        for members in self.fabric.groups.values():
            members.discard(self.qp_num)

    @property
    def port(self) -> FakePort:
        return self.fabric.ports[(self.device, self.attr.port_num)]

    def modify(self, attr, mask: int) -> None:
        # The RTS->RTS modifies of path migration (the only ones made through modify()).
        if self.state != 3:
            raise PyverbsRDMAError("Failed to modify QP", EINVAL)
        if mask & QP_ALT_PATH:
            if self.port.link_layer != 1:  # Linux's verbs core: alternate paths on IB only
                raise PyverbsRDMAError("Failed to modify QP", EINVAL)
            self.alt = attr.alt_ah_attr
        if mask & QP_PATH_MIG_STATE:
            wanted = int(attr.path_mig_state)
            if wanted == MIG_REARM and self.alt is not None:
                self.mig_state = MIG_ARMED if self.port.arms else MIG_REARM
            elif wanted == MIG_MIGRATED and self.mig_state == MIG_ARMED:
                self.mig_state, self.alt = MIG_MIGRATED, None
            else:
                raise PyverbsRDMAError("Failed to modify QP", EINVAL)

    def query(self, mask: int):
        attr = FakeQPAttr(
            qp_state=self.state,
            path_mig_state=self.mig_state,
            qkey=getattr(self.attr, "qkey", 0),
            pkey_index=getattr(self.attr, "pkey_index", 0),
        )
        return attr, FakeQPInitAttr()

    def to_init(self, attr) -> None:
        if (int(attr.qp_state), int(attr.cur_qp_state)) != (1, 0):
            raise PyverbsRDMAError("Failed to modify QP state to INIT", EINVAL)
        self.state, self.attr = 1, attr

    def to_rtr(self, attr) -> None:
        self.fabric.rtr_sls.append(attr.ah_attr.sl)
        self.state, self.attr = 2, attr

    def to_rts(self, attr) -> None:
        # uverbs modify_qp: a controlled Q_Key needs CAP_NET_RAW (or privileged-qkey on)
        if self.type == 4 and attr.qkey & 0x80000000 and not self.fabric.controlled_qkeys:
            raise PyverbsRDMAError("Failed to modify QP state to init", EPERM)
        self.state, self.attr = 3, attr

    def post_recv(self, wr: FakeRecvWR) -> None:
        self.recvs.append(wr)

    def post_send(self, wr: FakeSendWR) -> None:
        if self.state != 3:
            raise PyverbsRDMAError("Failed to post send", EINVAL)
        opcode, sge = int(wr.opcode), wr.sg[0]
        if self.type == 4:
            self._send_ud(wr, sge)
            return
        else:
            peer = self.fabric.qps.get(self.attr.dest_qp_num)
            if peer is None:  # destroyed: no ACK ever comes, the RC retries run out
                self.scq.push(_wc(wr_id=wr.wr_id, status=WC_RETRY_EXC_ERR))
                return
        status, wc_opcode = self._execute(opcode, wr, sge, peer)
        if status or self.sq_sig_all or wr.send_flags & 2:
            self.scq.push(_wc(wr_id=wr.wr_id, status=status, opcode=wc_opcode))

    def _send_ud(self, wr: FakeSendWR, sge: FakeSGE) -> None:
        f = self.fabric
        ah, qpn, qkey = wr.ud
        if qpn == MULTICAST_QPN:
            attached = f.groups.get(str(ah.attr.dgid), set())
            targets = [q for n, q in f.qps.items() if n in attached or f.floods_mcast]
            targets = [q for q in targets if q.type == 4 and q is not self]
        else:
            targets = [f.qps[qpn]]
        data = f.read(sge.addr, sge.length)
        for peer in targets:
            if qkey != peer.attr.qkey and not f.ignores_qkey:
                peer.port.qkey_viol_cntr = min(0xFFFF, peer.port.qkey_viol_cntr + 1)
                continue
            if not peer.recvs:  # UD: no receive posted, the message is gone
                continue
            recv = peer.recvs.popleft()
            f.write(recv.sg[0].addr + GRH_SIZE, data)
            peer.rcq.push(
                _wc(
                    wr_id=recv.wr_id,
                    opcode=WC["IBV_WC_RECV"],
                    byte_len=GRH_SIZE + len(data),
                    ts=f.tick(),
                    sl=ah.attr.sl if f.wc_sl is None else f.wc_sl,
                )
            )
        if self.sq_sig_all or wr.send_flags & 2:
            self.scq.push(_wc(wr_id=wr.wr_id, opcode=WC["IBV_WC_SEND"]))

    def _execute(self, opcode: int, wr: FakeSendWR, sge: FakeSGE, peer: FakeQP):
        f = self.fabric
        needs = {
            WR["IBV_WR_RDMA_WRITE"]: ACCESS_REMOTE_WRITE,
            WR["IBV_WR_RDMA_WRITE_WITH_IMM"]: ACCESS_REMOTE_WRITE,
            WR["IBV_WR_RDMA_READ"]: ACCESS_REMOTE_READ,
            WR["IBV_WR_ATOMIC_CMP_AND_SWP"]: ACCESS_REMOTE_ATOMIC,
            WR["IBV_WR_ATOMIC_FETCH_AND_ADD"]: ACCESS_REMOTE_ATOMIC,
        }.get(opcode, 0)
        if needs and not peer.attr.qp_access_flags & needs:
            return WC_REM_INV_REQ_ERR, 0
        if wr.remote and f.memory(wr.remote[1], sge.length, rkey=wr.remote[0])[0] is None:
            return WC_REM_ACCESS_ERR, 0
        data = f.read(sge.addr, sge.length)
        if opcode in (WR["IBV_WR_SEND"], WR["IBV_WR_RDMA_WRITE_WITH_IMM"]):
            recv = peer.recvs.popleft()
            if opcode == WR["IBV_WR_SEND"]:
                grh = GRH_SIZE if self.type == 4 else 0
                f.write(recv.sg[0].addr + grh, data)
                peer.rcq.push(_wc(opcode=WC["IBV_WC_RECV"], byte_len=grh + len(data), ts=f.tick()))
                return 0, WC["IBV_WC_SEND"]
            f.write(wr.remote[1], data)
            peer.rcq.push(
                _wc(
                    opcode=WC["IBV_WC_RECV_RDMA_WITH_IMM"],
                    byte_len=len(data),
                    imm_data=wr.imm_data,
                    ts=f.tick(),
                    wc_flags=IBV_ENUMS["ibv_wc_flags"]["IBV_WC_WITH_IMM"],
                )
            )
            return 0, WC["IBV_WC_RDMA_WRITE"]
        if opcode == WR["IBV_WR_RDMA_WRITE"]:
            f.write(wr.remote[1], data)
            return 0, WC["IBV_WC_RDMA_WRITE"]
        if opcode == WR["IBV_WR_RDMA_READ"]:
            f.write(sge.addr, f.read(wr.remote[1], sge.length))
            return 0, WC["IBV_WC_RDMA_READ"]
        (original,) = struct.unpack("<Q", f.read(wr.remote[1], 8))
        compare_add, swap = wr.atomic
        if opcode == WR["IBV_WR_ATOMIC_FETCH_AND_ADD"]:
            result, wc_opcode = (original + compare_add) % 2**64, WC["IBV_WC_FETCH_ADD"]
        elif opcode == WR["IBV_WR_ATOMIC_CMP_AND_SWP"]:
            result = swap if original == compare_add else original
            wc_opcode = WC["IBV_WC_COMP_SWAP"]
        else:
            raise PyverbsRDMAError(f"opcode {opcode!r} is not one this device knows", EINVAL)
        f.write(wr.remote[1], struct.pack("<Q", result))
        f.write(sge.addr, struct.pack("<Q", original))
        return 0, wc_opcode


class FakeCMID(_Closable):
    """An rdma_cm id that binds to a fake port's IPv4 address and joins multicast groups
    (RDMA_PS_UDP, its own UD QP); connections are what the fake fabric cannot make."""

    fabric: Fabric

    def __init__(self, creator=None, port_space=0, **kwargs):
        self.channel, self.port_space = creator, port_space
        self.context = self.pd = self.qp = None
        self.joined: dict[str, str] = {}  # group address -> MGID
        self.fabric.cm_ids.add(self)

    def _no_rdma_cm(self, *args, **kwargs):
        raise PyverbsRDMAError("the fake fabric has no rdma_cm", EOPNOTSUPP)

    listen = accept = resolve_addr = resolve_route = connect = _no_rdma_cm
    disconnect = post_send = post_read = post_write = _no_rdma_cm

    def bind_addr(self, ai) -> None:
        mapped = _mapped_gid(ai.src)
        where = self.fabric.ipoib.get(ai.src)
        roce = (k for k, p in self.fabric.ports.items() if mapped in p.gids.values())
        where = where or next(roce, None)
        if where is None:
            raise PyverbsRDMAError("Failed to Bind ID", EADDRNOTAVAIL)
        self.dev_name, self.port_num = where
        self.context = bound_context(self.fabric)(name=self.dev_name)
        self.pd = FakePD(self.context)

    def create_qp(self, init_attr) -> None:
        self.qp = type("QP", (FakeQP,), {"fabric": self.fabric})(self.pd, init_attr)
        self.qp.state = 3
        self.qp.attr = FakeQPAttr(port_num=self.port_num, qkey=RDMA_UDP_QKEY, pkey_index=0)

    @property
    def qpn(self) -> int:
        return self.qp.qp_num

    def query_qp(self, mask: int):
        return self.qp.query(mask)

    def post_recv(self, mr, length=None) -> None:
        self.qp.post_recv(FakeRecvWR(sg=[FakeSGE(mr.buf, length or mr.length, mr.lkey)]))

    def join_multicast(self, addr=None, mc_attr=None, context=0) -> None:
        if self.fabric.join_errno:
            raise PyverbsRDMAError("Failed to Join multicast", self.fabric.join_errno)
        mgid = _mapped_gid(addr.src)
        self.fabric.groups.setdefault(mgid, set()).add(self.qp.qp_num)
        self.joined[addr.src] = mgid
        infiniband = self.fabric.ports[(self.dev_name, self.port_num)].link_layer == 1
        ah = FakeAHAttr(
            dgid=mgid, dlid=self.fabric.mlid if infiniband else 0, is_global=1, port_num=1
        )
        event = FakeCMEvent(CM_ENUMS["rdma_cm_event_type"]["RDMA_CM_EVENT_MULTICAST_JOIN"])
        event.ud = SimpleNamespace(qp_num=MULTICAST_QPN, qkey=RDMA_UDP_QKEY, ah_attr=ah)
        self.channel.events.append(event)

    def leave_multicast(self, addr) -> None:
        mgid = self.joined.pop(addr.src)
        self.fabric.groups[mgid].discard(self.qp.qp_num)

    def close(self) -> None:
        if self.qp is not None:
            self.qp.close()
            self.qp = None
        self.fabric.cm_ids.discard(self)


def _mapped_gid(address: str) -> str:
    """The GID text of an IPv4 address (::ffff:a.b.c.d), as a RoCE v2 GID table holds it."""
    import ipaddress

    h = ipaddress.IPv6Address(f"::ffff:{address}").packed.hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def bound_context(fabric: Fabric):
    return type("Context", (FakeContext,), {"fabric": fabric})


class FakeCMEventChannel(_Closable):
    def __init__(self):
        self.events: deque = deque()


class FakeCMEvent:
    """An event; made by pyverbs' CMEvent(channel), which takes the channel's next one."""

    NAMES = {v: k for k, v in CM_ENUMS["rdma_cm_event_type"].items()}

    def __init__(self, event_type: int):
        self.event_type, self.ud = event_type, None

    @classmethod
    def of(cls, channel: FakeCMEventChannel):
        if not channel.events:  # the real one would block: say so instead
            raise PyverbsRDMAError("Failed to create CMEvent (none queued)", EAGAIN)
        return channel.events.popleft()

    def event_str(self) -> str:
        return self.NAMES[self.event_type]

    def ack_cm_event(self) -> None:
        pass


class FakeAddrInfo(_Closable):
    def __init__(self, src=None, dst=None, src_service=None, dst_service=None, **kwargs):
        self.src, self.dst = src, dst


def _ud_param(event: FakeCMEvent):
    return event.ud


def _cm_reject(self, private_data=None) -> None:
    pass


class _Empty:
    def __init__(self, *args, **kwargs):
        pass


# -- the module trees ------------------------------------------------------------------------


def _module(name: str, **attrs) -> ModuleType:
    m = ModuleType(name)
    m.__dict__.update(attrs)
    return m


def _enum_module(name: str, tables: dict, layout: Layout, flat_only: dict) -> ModuleType:
    m = _module(name, **flat_only)
    for cls_name, members in tables.items():
        cls = layout.enum_base(cls_name, members)
        setattr(m, cls_name, cls)
        if layout.flat_names:  # __members__: IntFlag iteration skips multi-bit values
            m.__dict__.update(cls.__members__)
    return m


def install(
    monkeypatch,
    layout: str | None,
    *,
    rdmacm: bool = True,
    cqex: bool = True,
    drop: tuple[str, ...] = (),
) -> Fabric:
    """Put a fake pyverbs of `layout` (a LAYOUTS key; None: no pyverbs at all) in sys.modules.

    rdmacm=False: pyverbs.cmid and the rdma_cm enum modules fail to import. cqex=False: a
    pyverbs without extended CQs. drop: "module.attribute" names taken away, as an older
    release would lack them.
    """
    for name in [n for n in sys.modules if n == "pyverbs" or n.startswith("pyverbs.")]:
        monkeypatch.delitem(sys.modules, name)
    fabric = Fabric()
    if layout is None:
        monkeypatch.setitem(sys.modules, "pyverbs", None)
        return fabric
    lay = LAYOUTS[layout]

    def bound(cls):  # a subclass that knows this install's fabric
        return type(cls.__name__[4:], (cls,), {"fabric": fabric})

    errors = _module(
        "pyverbs.pyverbs_error", PyverbsError=PyverbsError, PyverbsRDMAError=PyverbsRDMAError
    )
    cq = _module("pyverbs.cq", CQ=FakeCQ)
    if cqex:
        cq.__dict__.update(
            CQEX=bound(FakeCQEX), CqInitAttrEx=FakeCqInitAttrEx, PollCqAttr=FakePollCqAttr
        )
    cmid_attrs = {"fabric": fabric, **({"reject": _cm_reject} if lay.cmid_reject else {})}
    cmid_class = type("CMID", (FakeCMID,), cmid_attrs)
    modules = {
        "pyverbs_error": errors,
        "device": _module("pyverbs.device", Context=bound(FakeContext)),
        "pd": _module("pyverbs.pd", PD=FakePD),
        "cq": cq,
        "mr": _module("pyverbs.mr", MR=bound(FakeMR)),
        "qp": _module(
            "pyverbs.qp",
            QP=bound(FakeQP),
            QPAttr=FakeQPAttr,
            QPInitAttr=FakeQPInitAttr,
            QPCap=FakeQPCap,
        ),
        "wr": _module("pyverbs.wr", SendWR=FakeSendWR, RecvWR=FakeRecvWR, SGE=FakeSGE),
        "addr": _module(
            "pyverbs.addr", AH=FakeAH, AHAttr=FakeAHAttr, GlobalRoute=FakeGlobalRoute, GID=FakeGID
        ),
        "cmid": _module(
            "pyverbs.cmid",
            CMID=cmid_class,
            CMEventChannel=FakeCMEventChannel,
            CMEvent=FakeCMEvent.of,
            AddrInfo=FakeAddrInfo,
            UDParam=_ud_param,
            ConnParam=_Empty,
        ),
    }
    for name in lay.enum_modules:
        modules[name] = _enum_module(f"pyverbs.{name}", IBV_ENUMS, lay, IBV_FLAT_ONLY)
    for name in lay.cm_enum_modules:
        modules[name] = _enum_module(f"pyverbs.{name}", CM_ENUMS, lay, {})
    if not rdmacm:
        for name in ("cmid", *lay.cm_enum_modules):
            modules[name] = None
    for dotted in drop:
        module, attr = dotted.split(".")
        delattr(modules[module], attr)

    package = _module("pyverbs", __path__=[])  # a package whose other submodules do not exist
    if lay.version:
        package.__version__ = lay.version
    monkeypatch.setitem(sys.modules, "pyverbs", package)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, f"pyverbs.{name}", module)
        if module is not None:
            setattr(package, name, module)
    return fabric
