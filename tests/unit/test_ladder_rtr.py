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
from ibtool.model.records import LinkLayer
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
    lad.checked(lambda: lad._to_rtr(qp, None, PEER), "QP INIT->RTR")


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


# -- the GID table re-made under a run ---------------------------------------------------------

V4 = "0000:0000:0000:0000:0000:ffff:c0a8:4e01"
LINK_LOCAL = "fe80:0000:0000:0000:2cb5:56ff:fea9:4698"


class Context:
    """query_gid/query_gid_type as pyverbs answers them: an empty slot is an error (ENODATA)."""

    def __init__(self, table: dict[int, tuple[str, int]]):
        self.table = table

    def query_gid(self, port: int, index: int):
        if index not in self.table:
            raise VerbsError(61)
        return SimpleNamespace(gid=self.table[index][0])

    def query_gid_type(self, port: int, index: int):
        self.query_gid(port, index)
        return self.table[index][1]


def ladder_with(table: dict[int, tuple[str, int]], index: int) -> Ladder:
    lad = ladder_on(LinkLayer.ETHERNET)
    lad.device, lad.port, lad.ctx = "rxebond", 1, Context(table)
    lad.port_attr = SimpleNamespace(flags=0, gid_tbl_len=16)
    lad.gid_index = index
    lad.gid = bytes.fromhex(table[index][0].replace(":", ""))
    lad.gid_type = table[index][1]
    return lad


def test_a_gid_still_where_it_was_is_left_alone():
    lad = ladder_with({0: (LINK_LOCAL, 2), 1: (V4, 2)}, 1)
    assert lad.follow_gid() is None
    assert lad.gid_index == 1


def test_a_gid_the_kernel_moved_is_followed_to_its_new_index():
    """What a bond failover did in the testbed: the table re-made, the IPv4 GID elsewhere."""
    table = {0: (LINK_LOCAL, 2), 1: (V4, 2)}
    lad = ladder_with(table, 1)
    table.clear()
    table.update({1: (LINK_LOCAL, 2), 2: (V4, 1), 3: (V4, 2)})  # v1 first: the type decides
    assert lad.follow_gid() == (
        "rxebond/1: GID 0000:0000:0000:0000:0000:ffff:c0a8:4e01 moved from index 1 to 3 "
        "(the kernel re-made the GID table)"
    )
    assert lad.gid_index == 3
    assert lad.follow_gid() is None


def test_a_gid_gone_from_the_table_leaves_the_index_for_the_connection_to_fail_on():
    table = {0: (LINK_LOCAL, 2), 1: (V4, 2)}
    lad = ladder_with(table, 1)
    del table[1]
    assert lad.follow_gid() is None
    assert lad.gid_index == 1
