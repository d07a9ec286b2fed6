"""Work completions: polling with a deadline, and failed completions explained in words."""

from __future__ import annotations

import os
import time
from errno import ENOENT

from ibtool.errors import IbtoolError
from ibtool.model.deferred import dataclass

# ibv_wc_status: (name, what usually causes it). The names are libibverbs'; the causes are
# what an operator checks first.
WC_STATUS = {
    0: ("SUCCESS", ""),
    1: (
        "LOC_LEN_ERR",
        "a posted buffer is too small for the data (receive shorter than the "
        "SEND, or a UD receive without 40 bytes of GRH room)",
    ),
    2: (
        "LOC_QP_OP_ERR",
        "the work request is invalid for this QP's state or type (too many "
        "SGEs, too much inline data)",
    ),
    3: ("LOC_EEC_OP_ERR", "RD transport EE context error"),
    4: (
        "LOC_PROT_ERR",
        "the lkey or address does not match a registered MR of this PD, or "
        "the MR lacks LOCAL_WRITE",
    ),
    5: (
        "WR_FLUSH_ERR",
        "the QP went to the error state and flushed this request: look for "
        "the first completion that failed with another status",
    ),
    6: ("MW_BIND_ERR", "memory window bind failed"),
    7: ("BAD_RESP_ERR", "the responder answered with an unexpected transport opcode"),
    8: ("LOC_ACCESS_ERR", "local access violation"),
    9: (
        "REM_INV_REQ_ERR",
        "the responder rejected the request: missing access flag, "
        "max_dest_rd_atomic of 0, or a length beyond its limits",
    ),
    10: (
        "REM_ACCESS_ERR",
        "bad rkey, an address outside the remote MR, or the remote MR lacks "
        "REMOTE_WRITE/READ/ATOMIC",
    ),
    11: (
        "REM_OP_ERR",
        "the responder could not complete the operation (its receive queue entry failed)",
    ),
    12: (
        "RETRY_EXC_ERR",
        "no ACK before the retries ran out: peer gone, wrong GID/QPN/PSN/MTU, "
        "link down, or a lossy fabric",
    ),
    13: (
        "RNR_RETRY_EXC_ERR",
        "the peer had no receive posted (receiver not ready) and the RNR retries ran out",
    ),
    14: ("LOC_RDD_VIOL_ERR", "RD domain violation"),
    15: ("REM_INV_RD_REQ_ERR", "invalid RD request"),
    16: ("REM_ABORT_ERR", "the remote side aborted the operation"),
    17: ("INV_EECN_ERR", "invalid EE context number"),
    18: ("INV_EEC_STATE_ERR", "invalid EE context state"),
    19: ("FATAL_ERR", "the device or driver hit a fatal error: check dmesg"),
    20: ("RESP_TIMEOUT_ERR", "the response timed out"),
    21: ("GENERAL_ERR", "a transport error the device could not classify"),
    22: ("TM_ERR", "tag matching error"),
    23: ("TM_RNDV_INCOMPLETE", "tag matching rendezvous incomplete"),
}


def explain(status: int) -> str:
    name, cause = WC_STATUS.get(status, (f"STATUS_{status}", "unknown completion status"))
    return f"{name}: {cause}" if cause else name


class CompletionError(IbtoolError):
    def __init__(self, wc, what: str):
        self.status = wc.status
        self.vendor_err = wc.vendor_err
        super().__init__(f"{what} failed: {explain(wc.status)} (vendor error {wc.vendor_err:#x})")

    @classmethod
    def of(cls, status: int, vendor_err: int, what: str) -> CompletionError:
        """The same error from fields read in place (no WC object there)."""
        return cls(_Failed(status, vendor_err), what)


@dataclass(frozen=True)
class _Failed:
    status: int
    vendor_err: int


class CompletionTimeout(IbtoolError):
    pass


def poll(cq, count: int, deadline: float, what: str) -> list:
    """Collect `count` completions before `deadline` (time.monotonic), busy-polling.

    Busy-polling keeps latency honest (no interrupt or scheduler wake-up in the measurement).
    A failed completion raises CompletionError with the status explained.
    """
    wcs: list = []
    while len(wcs) < count:
        n, got = cq.poll(num_entries=count - len(wcs))
        if n:
            for wc in got:
                if wc.status != 0:
                    raise CompletionError(wc, what)
            wcs.extend(got)
        elif time.monotonic() > deadline:
            raise CompletionTimeout(f"{what}: {len(wcs)} of {count} completions before the timeout")
    return wcs


def in_place(cq, pv):
    """`cq` as the hot loops read it: the extended-CQ calls (start_poll(attr) -> 0 or ENOENT,
    .status, read_opcode(), read_imm_data(), read_vendor_err(), read_byte_len(), end_poll())
    that read a completion where it lies. A plain CQ (a provider without ibv_create_cq_ex)
    gets the same calls from PlainCQ.

    CQ.poll builds a 13-field WC object per completion, measured at ~14 us under the QEMU
    testbed, twice per ping round trip; these calls cost ~1-2 us each there.
    """
    return cq if pv.cqex and isinstance(cq, pv.cq.CQEX) else PlainCQ(cq)


def poll_failed(rc: int) -> IbtoolError:
    """start_poll's answer other than 0 and ENOENT."""
    return IbtoolError(f"polling the completion queue failed: {os.strerror(rc)}")


class PlainCQ:
    """A plain CQ behind the extended CQ's polling calls (see in_place)."""

    def __init__(self, cq):
        self._poll = cq.poll
        self._wc = None

    def start_poll(self, attr) -> int:
        n, wcs = self._poll(1)
        if not n:
            return ENOENT
        self._wc = wcs[0]
        return 0

    @property
    def status(self) -> int:
        return self._wc.status

    def read_opcode(self) -> int:
        return self._wc.opcode

    def read_imm_data(self) -> int:
        return self._wc.imm_data

    def read_vendor_err(self) -> int:
        return self._wc.vendor_err

    def read_byte_len(self) -> int:
        return self._wc.byte_len

    def end_poll(self) -> None:
        self._wc = None
