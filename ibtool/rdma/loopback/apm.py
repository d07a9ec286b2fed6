"""Automatic path migration (APM) of an RC QP: an alternate path loaded, armed, migrated to.

The verbs of it (libibverbs/verbs.h, ibv_modify_qp(3)): an RTS->RTS modify with IBV_QP_ALT_PATH
(alt_ah_attr, alt_port_num, alt_pkey_index, alt_timeout) and IBV_QP_PATH_MIG_STATE = IBV_MIG_REARM
loads the alternate path; the HCA checks it and moves the QP to IBV_MIG_ARMED (ibv_query_qp shows
it); software then forces the switch with path_mig_state = IBV_MIG_MIGRATED (the HCA does the same
by itself when the primary path fails). The alternate path becomes the primary one.

Who can: a device that reports IB_DEVICE_AUTO_PATH_MIG (device_cap_flags bit 4), on an InfiniBand
port. Linux's verbs core refuses an alternate path on any other port with EINVAL whatever the
device reports ("Today the core code can only handle alternate paths and APM for IB. Ban them in
roce mode.", drivers/infiniband/core/verbs.c, _ib_modify_qp): rxe reports the flag and gets
that EINVAL, measured on the testbed.
"""

from __future__ import annotations

import time
from dataclasses import replace
from errno import EINVAL

from ibtool.errors import IbtoolError
from ibtool.model.deferred import dataclass
from ibtool.model.records import LinkLayer

# enum ibv_qp_attr_mask, enum ibv_mig_state (libibverbs/verbs.h)
IBV_QP_ALT_PATH = 1 << 14
IBV_QP_PATH_MIG_STATE = 1 << 18
IBV_MIG_MIGRATED, IBV_MIG_REARM, IBV_MIG_ARMED = 0, 1, 2
MIG_STATES = {IBV_MIG_MIGRATED: "MIGRATED", IBV_MIG_REARM: "REARM", IBV_MIG_ARMED: "ARMED"}
IB_DEVICE_AUTO_PATH_MIG = 1 << 4  # enum ibv_device_cap_flags
ALT_TIMEOUT = 14  # 4.096 us * 2^14 = 67 ms per try, as the primary path's (ladder.connect_rc)
ARM_POLL = 0.001  # seconds between two looks at a QP the HCA is arming


class NotSupported(IbtoolError):
    """This device or port cannot migrate paths: the reason is the message."""


@dataclass(frozen=True)
class AltPath:
    """The alternate path loaded into a QP: what the report says of it."""

    port: int
    lid: int | None  # InfiniBand: the destination LID of the alternate path
    path_bits: int  # the source path bits (a second LID of the port when its LMC allows)
    timeout: int

    def describe(self) -> str:
        where = f"port {self.port}"
        if self.lid is not None:
            where += f", LID {self.lid:#x}"
            where += f" (path bits {self.path_bits})" if self.path_bits else " (the primary's)"
        return where


def unsupported_reason(ladder) -> str | None:
    """Why this port cannot do APM as far as the device says, or None when it says it can."""
    if not ladder.dev_attr.device_cap_flags & IB_DEVICE_AUTO_PATH_MIG:
        return (
            f"{ladder.device} does not report automatic path migration "
            "(device_cap_flags lacks AUTO_PATH_MIG)"
        )
    return None


def mig_state(ladder, qp) -> int:
    attr, _ = ladder.checked(lambda: qp.query(IBV_QP_PATH_MIG_STATE), "query the QP")
    return int(attr.path_mig_state)


def load_alt_path(ladder, qp, peer, sl: int = 0, pkey_index: int = 0) -> AltPath:
    """Load the alternate path to `peer` into an RTS `qp` and ask the HCA to arm it (REARM).

    On InfiniBand a port with an LMC above 0 answers 2^LMC LIDs, which the subnet manager may
    route differently: the alternate path then leaves from and goes to the port's second LID
    (source path bits 1), a path apart from the primary one through the fabric. With LMC 0 it
    is the primary path again, which still proves the HCA's migration machinery."""
    infiniband = ladder.link_layer == LinkLayer.INFINIBAND
    bits = 1 if infiniband and ladder.port_attr.lmc > 0 else 0
    target = replace(peer, lid=peer.lid + bits)
    attr = ladder.pv.qp.QPAttr()
    ah = ladder.ah_attr(target, sl)
    ah.src_path_bits = bits
    attr.alt_ah_attr = ah
    attr.alt_port_num = ladder.port
    attr.alt_pkey_index = pkey_index
    attr.alt_timeout = ALT_TIMEOUT
    attr.path_mig_state = IBV_MIG_REARM
    try:
        qp.modify(attr, IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE)
    except ladder.pv.Error as e:
        if getattr(e, "error_code", 0) == EINVAL and not infiniband:
            kind = "RoCE" if ladder.link_layer == LinkLayer.ETHERNET else "non-InfiniBand"
            raise NotSupported(
                f"the kernel refused an alternate path on {ladder.device}/{ladder.port}, a "
                f"{kind} port (EINVAL): Linux takes alternate paths on InfiniBand ports only, "
                "though the device reports AUTO_PATH_MIG"
            ) from None
        raise IbtoolError(f"load the alternate path (RTS->RTS, REARM): {e}") from None
    return AltPath(ladder.port, target.lid if infiniband else None, bits, ALT_TIMEOUT)


def wait_armed(ladder, qps, deadline: float) -> float:
    """Seconds until the HCA armed every QP's alternate path; an error at `deadline`."""
    start = time.monotonic()
    waiting = list(qps)
    while waiting:
        waiting = [qp for qp in waiting if mig_state(ladder, qp) != IBV_MIG_ARMED]
        if not waiting:
            break
        if time.monotonic() > deadline:
            state = MIG_STATES.get(mig_state(ladder, waiting[0]), "?")
            raise IbtoolError(
                f"the HCA did not arm the alternate path: path_mig_state is still {state} "
                f"after {time.monotonic() - start:.1f} s"
            )
        time.sleep(ARM_POLL)
    return time.monotonic() - start


def migrate(ladder, qp) -> None:
    """Switch an ARMED QP to its alternate path, as the HCA would on a path failure."""
    attr = ladder.pv.qp.QPAttr()
    attr.path_mig_state = IBV_MIG_MIGRATED
    ladder.checked(lambda: qp.modify(attr, IBV_QP_PATH_MIG_STATE), "migrate (path_mig_state)")
    state = mig_state(ladder, qp)
    if state != IBV_MIG_MIGRATED:
        raise IbtoolError(
            f"forced migration left path_mig_state {MIG_STATES.get(state, state)}, not MIGRATED"
        )
