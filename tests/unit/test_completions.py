"""Completions read in place: an extended CQ as it is, a plain CQ (WC objects) behind the same
calls; the same answers from both, failures with their vendor error."""

from __future__ import annotations

import errno
from types import SimpleNamespace

import pytest

from ibtool.errors import IbtoolError
from ibtool.rdma.completions import CompletionError, PlainCQ, in_place, poll_failed

RECV, RECV_RDMA_WITH_IMM, SEND = 128, 129, 0


class FakeCQEX:
    """start_poll/end_poll and the read_* calls of pyverbs' CQEX over a list of completions."""

    def __init__(self, completions):
        self.pending = list(completions)
        self.open_batches = 0
        self.current = None

    def start_poll(self, attr):
        assert self.open_batches == 0, "start_poll inside an open batch"
        if not self.pending:
            return errno.ENOENT
        self.current = self.pending.pop(0)
        self.open_batches += 1
        return 0

    def end_poll(self):
        assert self.open_batches == 1
        self.open_batches -= 1

    @property
    def status(self):
        return self.current["status"]

    def read_opcode(self):
        return self.current["opcode"]

    def read_imm_data(self):
        return self.current["imm_data"]

    def read_vendor_err(self):
        return self.current["vendor_err"]


class FakeCQ:
    def __init__(self, completions):
        self.pending = list(completions)

    def poll(self, num_entries=1):
        if not self.pending:
            return 0, []
        return 1, [SimpleNamespace(**self.pending.pop(0))]


PV = SimpleNamespace(cq=SimpleNamespace(CQEX=FakeCQEX, PollCqAttr=object), cqex=True)
NO_CQEX = SimpleNamespace(cq=SimpleNamespace(), cqex=False)  # a pyverbs without extended CQs


def wc(status=0, opcode=RECV, imm_data=0, vendor_err=0):
    return {"status": status, "opcode": opcode, "imm_data": imm_data, "vendor_err": vendor_err}


COMPLETIONS = [
    wc(opcode=SEND),
    wc(opcode=RECV, imm_data=0xDEAD),  # no immediate with a plain RECV: reported as 0
    wc(opcode=RECV_RDMA_WITH_IMM, imm_data=0x01000000),
    wc(status=12, opcode=77, imm_data=5, vendor_err=0x81),
]
EXPECTED = [
    (0, SEND, 0, 0),
    (0, RECV, 0, 0),
    (0, RECV_RDMA_WITH_IMM, 0x01000000, 0),
    (12, 0, 0, 0x81),
]


def read_all(cq):
    """What the hot loops read, completion by completion, until the queue is empty."""
    got = []
    while cq.start_poll(object()) == 0:
        try:
            status = cq.status
            if status:
                got.append((status, 0, 0, cq.read_vendor_err()))
            else:
                opcode = cq.read_opcode()
                imm = cq.read_imm_data() if opcode == RECV_RDMA_WITH_IMM else 0
                got.append((0, opcode, imm, 0))
        finally:
            cq.end_poll()
    return got


def test_an_extended_cq_is_used_as_it_is_a_plain_one_through_plaincq():
    cqex, cq = FakeCQEX([]), FakeCQ([])
    assert in_place(cqex, PV) is cqex
    assert isinstance(in_place(cq, PV), PlainCQ)
    assert isinstance(in_place(cq, NO_CQEX), PlainCQ)


@pytest.mark.parametrize("make", [FakeCQ, FakeCQEX], ids=["cq", "cqex"])
def test_both_cq_kinds_give_the_same_answers(make):
    cq = make(COMPLETIONS)
    polled = in_place(cq, PV)
    assert read_all(polled) == EXPECTED
    assert polled.start_poll(object()) == errno.ENOENT  # empty: nothing, again and again
    assert polled.start_poll(object()) == errno.ENOENT
    if isinstance(cq, FakeCQEX):
        assert cq.open_batches == 0


def test_a_failed_start_poll_reads_as_an_error():
    err = poll_failed(errno.EIO)
    assert isinstance(err, IbtoolError)
    assert err.message == "polling the completion queue failed: Input/output error"


def test_completion_error_from_reaped_fields_explains_the_status():
    err = CompletionError.of(12, 0x81, "ping 3")
    assert err.status == 12 and err.vendor_err == 0x81
    assert err.message.startswith("ping 3 failed: RETRY_EXC_ERR: no ACK before the retries")
    assert err.message.endswith("(vendor error 0x81)")
