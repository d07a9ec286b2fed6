"""Reaping one completion at a time, from a plain CQ (WC objects) and an extended CQ (read in
place): the same answers from both, failures with their vendor error, end_poll after every
successful start_poll."""

from __future__ import annotations

import errno
from types import SimpleNamespace

import pytest

from ibtool.errors import IbtoolError
from ibtool.rdma.completions import CompletionError, reader

RECV, RECV_RDMA_WITH_IMM, SEND = 128, 129, 0


class FakeCQEX:
    """start_poll/end_poll and the read_* calls of pyverbs' CQEX over a list of completions."""

    def __init__(self, completions, start_error=0):
        self.pending = list(completions)
        self.start_error = start_error
        self.open_batches = 0
        self.current = None

    def start_poll(self, attr):
        assert self.open_batches == 0, "start_poll inside an open batch"
        if self.start_error:
            return self.start_error
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


PV = SimpleNamespace(cq=SimpleNamespace(CQEX=FakeCQEX, PollCqAttr=object))


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


@pytest.mark.parametrize("make", [FakeCQ, FakeCQEX], ids=["cq", "cqex"])
def test_both_cq_kinds_give_the_same_answers(make):
    cq = make(COMPLETIONS)
    reap = reader(cq, PV)
    got = [reap() for _ in COMPLETIONS]
    assert got == EXPECTED
    assert reap() is None and reap() is None  # empty: nothing, again and again
    if isinstance(cq, FakeCQEX):
        assert cq.open_batches == 0


def test_start_poll_failure_is_an_error_not_an_empty_queue():
    reap = reader(FakeCQEX([wc()], start_error=errno.EIO), PV)
    with pytest.raises(IbtoolError, match="polling the completion queue failed"):
        reap()


def test_completion_error_from_reaped_fields_explains_the_status():
    err = CompletionError.of(12, 0x81, "ping 3")
    assert err.status == 12 and err.vendor_err == 0x81
    assert err.message.startswith("ping 3 failed: RETRY_EXC_ERR: no ACK before the retries")
    assert err.message.endswith("(vendor error 0x81)")
