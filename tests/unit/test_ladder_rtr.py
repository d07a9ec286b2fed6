"""INIT->RTR on RoCE asks again when the kernel's neighbour resolution timed out.

pyverbs is not on the host: a stand-in QP raises what pyverbs raises (an error carrying the
errno as error_code) for the first N transitions. The testbed saw it for real: with netem loss
on the link, a lost ARP packet made the ping server's INIT->RTR fail with ETIMEDOUT.
"""

from __future__ import annotations

from errno import EINVAL, ETIMEDOUT
from types import SimpleNamespace

import pytest

from ibtool.errors import IbtoolError
from ibtool.model import LinkLayer
from ibtool.rdma import ladder
from ibtool.rdma.ladder import Ladder, Peer


class VerbsError(Exception):
    def __init__(self, code: int):
        super().__init__(f"Failed to modify QP state to RTR. Errno: {code}")
        self.error_code = code


class QP:
    def __init__(self, failures: int, code: int = ETIMEDOUT):
        self.failures, self.code, self.calls = failures, code, 0

    def to_rtr(self, attr):
        self.calls += 1
        if self.calls <= self.failures:
            raise VerbsError(self.code)


def ladder_on(link_layer: LinkLayer) -> Ladder:
    lad = Ladder.__new__(Ladder)  # no device: only what the transition reads
    lad.pv = SimpleNamespace(Error=VerbsError)
    lad.link_layer = link_layer
    lad.port_attr = SimpleNamespace(flags=0)
    return lad


PEER = Peer(qpn=0x11, psn=1, lid=0, gid=bytes(10) + b"\xff\xff" + bytes([192, 168, 77, 2]), mtu=3)


def rtr(lad: Ladder, qp: QP) -> None:
    lad._verbs(lambda: lad._to_rtr(qp, None, PEER), "QP INIT->RTR")


def test_a_lost_arp_answer_is_asked_again():
    qp = QP(failures=ladder.RESOLVE_TRIES - 1)
    rtr(ladder_on(LinkLayer.ETHERNET), qp)
    assert qp.calls == ladder.RESOLVE_TRIES


def test_no_answer_at_all_names_the_address_and_what_to_check():
    qp = QP(failures=99)
    with pytest.raises(IbtoolError) as err:
        rtr(ladder_on(LinkLayer.ETHERNET), qp)
    assert qp.calls == ladder.RESOLVE_TRIES
    assert "no neighbour (ARP/ND) answer" in err.value.message
    assert "ffff:c0a8:4d02" in err.value.message
    assert "ip neigh" in err.value.hint


def test_other_errors_and_infiniband_fail_at_once():
    qp = QP(failures=1, code=EINVAL)
    with pytest.raises(IbtoolError, match="Errno: 22"):
        rtr(ladder_on(LinkLayer.ETHERNET), qp)
    assert qp.calls == 1
    qp = QP(failures=1)  # InfiniBand resolves nothing at RTR: a timeout there is something else
    with pytest.raises(IbtoolError):
        rtr(ladder_on(LinkLayer.INFINIBAND), qp)
    assert qp.calls == 1
