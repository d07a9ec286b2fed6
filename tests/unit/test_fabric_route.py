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
