"""`ibtool fabric route`'s walk where it breaks: what a simulated fabric cannot hold still (opensm
re-routes within a second of an unlink). The switches' forwarding tables are given here, the
walk is the Host's own; the whole routes against ibtracert are in tests/fabric."""

from __future__ import annotations

import contextlib

import pytest

from ibtool.host import Host
from ibtool.model.fabric import Fabric, FabricNode, FabricPort, NodeType
from ibtool.model.records import PhysState, PortState
from ibtool.sources import mad

# node001 (LID 2) -- [1] leaf01 (LID 4) [3] -- [1] spine01 (LID 1) [2] -- [3] leaf02 (LID 6)
#   [1] -- node004 (LID 8); leaf02's port 2 is cabled to nothing.
CABLES = [((0x10, 1), (0x20, 1)), ((0x20, 3), (0x40, 1)), ((0x40, 2), (0x30, 3)),
          ((0x30, 1), (0x11, 1))]  # fmt: skip


def fabric() -> Fabric:
    far = {}
    for a, b in CABLES:
        far[a], far[b] = b, a

    def port(guid, number, lid):
        return FabricPort(number, guid + number, lid, 0, PortState.ACTIVE, PhysState.LINK_UP,
                          2, 2, 2, remote=far.get((guid, number)))  # fmt: skip

    def switch(guid, name, lid, ports):
        every = {0: port(guid, 0, lid), **{n: port(guid, n, 0) for n in ports}}
        return FabricNode(guid, NodeType.SWITCH, name, 36, every)

    def ca(guid, name, lid):
        return FabricNode(guid, NodeType.CA, name, 1, {1: port(guid, 1, lid)})

    nodes = [ca(0x10, "node001", 2), ca(0x11, "node004", 8), switch(0x20, "leaf01", 4, (1, 3)),
             switch(0x30, "leaf02", 6, (1, 2, 3)), switch(0x40, "spine01", 1, (1, 2))]  # fmt: skip
    return Fabric({n.guid: n for n in nodes}, (0x10, 1), "mlx5_0", 1)


@pytest.fixture
def tables(monkeypatch):
    """The forwarding tables, by switch LID: {LID: {destination LID: out port}}."""
    given: dict[int, dict[int, int]] = {}
    asked: list[int] = []
    start = mad.LocalPort("mlx5_0", 1, "InfiniBand", 4, 2, 1, 0x11)
    monkeypatch.setattr(mad, "local_ports", lambda warn: [start])
    monkeypatch.setattr(mad, "smp_port", lambda *a: contextlib.nullcontext("handle"))

    def lft_block(handle, lid, block, bounds, warn):
        asked.append(lid)
        if lid not in given:
            return None
        entries = bytearray([0xFF] * mad.LFT_BLOCK)
        for dlid, out in given[lid].items():
            if dlid // mad.LFT_BLOCK == block:
                entries[dlid % mad.LFT_BLOCK] = out
        return bytes(entries)

    monkeypatch.setattr(mad, "lft_block", lft_block)
    return given, asked


def walk(source, dest):
    return Host(root="/nonexistent", live=False).fabric_route(fabric(), source, dest)


def hops(route):
    return [(h.node.description, h.port.number, h.far.description, h.far_port.number)
            for h in route.hops]  # fmt: skip


def test_a_whole_route_asks_one_table_block_a_switch(tables):
    given, asked = tables
    given.update({4: {8: 3}, 1: {8: 2}, 6: {8: 1}})
    route = walk("node001", "8")
    assert route.broken is None
    assert hops(route) == [("node001", 1, "leaf01", 1), ("leaf01", 3, "spine01", 1),
                           ("spine01", 2, "leaf02", 3), ("leaf02", 1, "node004", 1)]  # fmt: skip
    assert asked == [4, 1, 6]


def test_a_switch_with_no_route_to_the_lid_ends_it_there(tables):
    given, _ = tables
    given.update({4: {8: 3}, 1: {}})  # spine01's entry for LID 8 is 255
    route = walk("node001", "node004")
    assert hops(route)[-1] == ("leaf01", 3, "spine01", 1)
    assert route.broken == "spine01 has no route to LID 8 (its forwarding table says 255)"


def test_a_table_pointing_at_a_port_with_no_cable(tables):
    given, _ = tables
    given.update({4: {8: 3}, 1: {8: 2}, 6: {8: 2}})
    assert walk("2", "8").broken == "leaf02/2 has no cable up: the route ends there"


def test_a_loop_is_found_not_followed(tables):
    given, asked = tables
    given.update({4: {8: 3}, 1: {8: 1}})  # spine01 sends LID 8 back to leaf01
    assert walk("2", "8").broken == "a loop: the route comes back to leaf01"
    assert asked == [4, 1]


def test_a_switch_that_does_not_answer_is_named(tables):
    given, _ = tables
    given.update({4: {8: 3}})
    assert walk("2", "8").broken == ("spine01 (LID 1) did not answer for its forwarding table")


def test_to_a_switch_the_route_ends_at_its_port_0(tables):
    given, _ = tables
    given.update({4: {6: 3}, 1: {6: 2}, 6: {6: 0}})
    route = walk("node001", "leaf02")
    assert route.broken is None and hops(route)[-1] == ("spine01", 2, "leaf02", 3)


def test_many_routes_ask_each_switch_s_table_block_once_for_them_all(tables):
    given, asked = tables
    given.update({4: {8: 3, 2: 1}, 1: {8: 2, 2: 1}, 6: {8: 1, 2: 3}})
    host = Host(root="/nonexistent", live=False)
    got = host.fabric_routes(fabric(), [(2, 8), (8, 2), (2, 8), (2, 99)])
    assert set(got) == {(2, 8), (8, 2)}  # LID 99 is no port of the subnet: not walked
    there = [("node001", 1, "leaf01", 1), ("leaf01", 3, "spine01", 1),
             ("spine01", 2, "leaf02", 3), ("leaf02", 1, "node004", 1)]  # fmt: skip
    back = [("node004", 1, "leaf02", 1), ("leaf02", 3, "spine01", 2),
            ("spine01", 1, "leaf01", 3), ("leaf01", 1, "node001", 1)]  # fmt: skip
    assert (hops(got[2, 8]), hops(got[8, 2])) == (there, back)
    assert sorted(asked) == [1, 4, 6]  # LIDs 2 and 8 share block 0: one SMP a switch
    # as fabric route walks each
    for (s, d), route in got.items():
        assert hops(walk(str(s), str(d))) == hops(route)


def test_a_route_among_many_breaks_where_one_alone_does(tables):
    given, _ = tables
    given.update({4: {8: 3}, 1: {}})
    (route,) = Host(root="/nonexistent", live=False).fabric_routes(fabric(), [(2, 8)]).values()
    assert route.broken == "spine01 has no route to LID 8 (its forwarding table says 255)"


def test_the_port_whose_subnet_holds_the_endpoints_is_the_one_they_answer_through(monkeypatch):
    """Two InfiniBand subnets here (one a rail each), LID 7 in both: the node GUID that
    answers says which; a RoCE port and a port down are not asked."""
    ports = [
        mad.LocalPort("mlx5_0", 1, "InfiniBand", 4, 2, 1, 0x11),
        mad.LocalPort("mlx5_1", 1, "InfiniBand", 4, 30, 1, 0x12),
        mad.LocalPort("mlx5_2", 1, "Ethernet", 4, 0, 0, 0x13),
        mad.LocalPort("mlx5_3", 1, "InfiniBand", 1, 0, 0, 0x14),
    ]
    subnets = {"mlx5_0": {7: 0x100}, "mlx5_1": {7: 0x200}}
    opened = []
    monkeypatch.setattr(mad, "check_access", lambda warn: None)
    monkeypatch.setattr(mad, "local_ports", lambda warn: ports)

    def smp_port(start, bounds, warn):
        opened.append(start.ca)
        return contextlib.nullcontext(start.ca)

    monkeypatch.setattr(mad, "smp_port", smp_port)
    monkeypatch.setattr(
        mad, "node_info",
        lambda handle, lid, bounds, warn: (
            (subnets[handle][lid], NodeType.CA, 1, 1) if lid in subnets[handle] else None
        ),
    )  # fmt: skip
    host = Host(live=True)
    assert host.fabric_port_reaching([(7, 0x200)]) == "mlx5_1/1"
    assert opened == ["mlx5_0", "mlx5_1"]
    assert host.fabric_port_reaching([(7, 0x300), (9, 0x100)]) is None
    assert Host(root="/nonexistent", live=False).fabric_port_reaching([(7, 0x200)]) is None


def test_no_rdma_core_or_no_hca_here_is_no_port_said_nowhere(monkeypatch):
    from ibtool.errors import UnsupportedError

    def none(warn):
        raise UnsupportedError("ibtool fabric needs rdma-core's libibumad.so.3")

    warned = []
    monkeypatch.setattr(mad, "check_access", lambda warn: None)
    monkeypatch.setattr(mad, "local_ports", none)
    assert Host(live=True, warn=warned.append).fabric_port_reaching([(7, 0x200)]) is None
    assert warned == []
