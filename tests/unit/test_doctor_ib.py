"""`ibtool doctor` on InfiniBand, fed records as the subnet answers them: the SM (none, silent,
not the master), a cable trained down or with errors over their thresholds, a route that stops;
what is asked of the Host and when (never on RoCE or a capture). The simulated fabric runs the
same checks on MADs (tests/fabric/test_fabric_doctor.py)."""

from __future__ import annotations

import dataclasses

from ibtool.doctor import checks, ib
from ibtool.doctor.checks import Context
from ibtool.errors import PermissionDeniedError
from ibtool.model.doctor import Facts, Verdict
from ibtool.model.fabric import (
    Cable,
    CountersRead,
    FabricNode,
    FabricPort,
    Hop,
    NodeType,
    PortCounters,
    PortSpeed,
    Route,
    SmState,
    SubnetManager,
)
from ibtool.model.records import PortState
from ibtool.views import doctor as view

PASS, WARN, FAIL, SKIP = Verdict.PASS, Verdict.WARN, Verdict.FAIL, Verdict.SKIP
X4, SDR, DDR = 2, 1, 2  # PortInfo's LinkWidth and LinkSpeed bits


def port(number: int, lid: int, width: int = X4, speed: int = SDR, speeds: int = SDR,
         state: PortState = PortState.ACTIVE) -> FabricPort:  # fmt: skip
    """A port at `width` and `speed`, enabling 4X and `speeds`, supporting 1X, 4X, SDR, DDR."""
    return FabricPort(number, 0, lid, 0, state, None, width, X4, X4 | 1,
                      PortSpeed(speed, speeds, SDR | DDR))  # fmt: skip


def node(guid: int, name: str, kind: NodeType = NodeType.SWITCH, *ports) -> FabricNode:
    return FabricNode(guid, kind, name, 36 if kind == NodeType.SWITCH else 1,
                      {p.number: p for p in ports})  # fmt: skip


HCA = node(0x10, "node001 mlx5_0", NodeType.CA, port(1, 2))
LEAF = node(0x20, "leaf01", NodeType.SWITCH, port(0, 4), port(1, 4), port(5, 4))
SPINE = node(0x30, "spine01", NodeType.SWITCH, port(0, 1), port(1, 1), port(2, 1))
LEAF2 = node(0x40, "leaf02", NodeType.SWITCH, port(0, 6), port(5, 6), port(2, 6))
PEER = node(0x50, "node005 mlx5_0", NodeType.CA, port(1, 9))


def counters(guid: int, number: int, lid: int, **values) -> PortCounters:
    return PortCounters(guid, number, lid, {"SymbolErrorCounter": 0, **values},
                        {"SymbolErrorCounter": 16, "LinkDownedCounter": 8})  # fmt: skip


def cable(near: FabricNode = HCA, far: FabricNode = LEAF, far_port: int = 1, **kw) -> Cable:
    c = Cable("mlx5_0", node(near.guid, "mlx5_0", NodeType.CA, near.ports[1]), far, far_port)
    return dataclasses.replace(c, counters=counters(far.guid, far_port, far.lid), **kw)


def route(broken: str | None = None) -> Route:
    hops = (
        Hop(HCA, HCA.ports[1], LEAF, LEAF.ports[1]),
        Hop(LEAF, LEAF.ports[5], SPINE, SPINE.ports[1]),
        Hop(SPINE, SPINE.ports[2], LEAF2, LEAF2.ports[5]),
        Hop(LEAF2, LEAF2.ports[2], PEER, PEER.ports[1]),
    )
    if broken:
        return Route((HCA, 1, 2), (FabricNode(0, NodeType.CA, "LID 9", 0, {}), 0, 9), hops[:2],
                     broken)  # fmt: skip
    return Route((HCA, 1, 2), (PEER, 1, 9), hops)


MASTER = SubnetManager(SPINE, 0, 1, 0x31, 0, SmState.MASTER, 300)


def path(**changes) -> ib.IbPath:
    base = ib.IbPath("mlx5_0/1", {}, 1, MASTER, cable=cable(), route=route(),
                     peer_counters=counters(LEAF2.guid, 2, 6))  # fmt: skip
    return dataclasses.replace(base, **changes)


LOCAL = Facts(device="mlx5_0", port=1, link_layer="InfiniBand", state="ACTIVE", lid=2)
PEER_FACTS = Facts(device="mlx5_0", port=1, link_layer="InfiniBand", state="ACTIVE", lid=9)


def run(p: ib.IbPath) -> dict:
    found = checks.run_checks(LOCAL, PEER_FACTS, Context(peer="b", fabric=p))
    return {f.check: f for f in found}


def test_a_whole_path_passes_and_the_text_shows_each_hop():
    found = checks.run_checks(LOCAL, PEER_FACTS, Context(peer="b", fabric=path()))
    names = [f.check for f in found]
    assert names[names.index("rate") + 1 : names.index("gid")] == [
        "sm", "cable", "peer_cable", "lid_route"
    ]  # fmt: skip
    by = {f.check: f for f in found}
    assert by["sm"].evidence == "SM LID 1: spine01, MASTER, priority 0, GUID 0x0000000000000031"
    assert by["cable"].evidence == (
        "mlx5_0/1 <-> leaf01/1: 4X SDR ACTIVE; no error counter of leaf01/1 over its threshold"
    )
    assert by["peer_cable"].evidence.startswith("node005 mlx5_0/1 <-> leaf02/2: 4X SDR ACTIVE")
    route_lines = view.lines([by["lid_route"]])
    assert route_lines == [
        "PASS  lid_route  LID 2 -> LID 9: 4 links through 3 switches, every link ACTIVE at what "
        "its ends enable",
        "                 1: node001 mlx5_0/1 -> leaf01/1 (LID 4), 4X SDR ACTIVE",
        "                 2: leaf01/5 -> spine01/1 (LID 1), 4X SDR ACTIVE",
        "                 3: spine01/2 -> leaf02/5 (LID 6), 4X SDR ACTIVE",
        "                 4: leaf02/2 -> node005 mlx5_0/1 (LID 9), 4X SDR ACTIVE",
    ]
    assert all(f.verdict == PASS for f in by.values() if f.check in ib.NAMES)
    # the JSON: the hops, and both cables with their far ends' counters
    data = path().to_json()
    assert [(h["out"]["node"], h["into"]["port"]) for h in data["route"]["hops"]] == [
        ("node001 mlx5_0", 1), ("leaf01", 1), ("spine01", 5), ("leaf02", 1)
    ]  # fmt: skip
    assert data["cable"]["far"]["node"] == "leaf01" and data["cable"]["errors"] == []
    assert data["peer_cable"]["near"]["node"] == "node005 mlx5_0"
    assert data["peer_cable"]["far"] == {
        "node": "leaf02", "node_guid": "0x0000000000000040", "type": "SW", "port": 2,
        "port_guid": "0x0000000000000000", "lid": 6,
    }  # fmt: skip
    assert data["sm"]["state"] == "MASTER" and data["sm_lid"] == 1


def test_on_roce_or_a_capture_nothing_is_asked_and_the_checklist_is_what_it_was():
    class Host:
        live = True

        def cables(self, via):
            raise AssertionError("a RoCE port asked for its cable")

    roce = dataclasses.replace(LOCAL, link_layer="Ethernet")
    assert ib.gather_local(Host(), roce, None, print) is None
    captured = Host()
    captured.live = False
    assert ib.gather_local(captured, LOCAL, None, print) is None
    names = [f.check for f in checks.run_checks(roce, None, Context())]
    assert not set(names) & set(ib.NAMES)


class FakeHost:
    live = True

    def __init__(self, cables=None, sm=(1, MASTER), error=None):
        self._cables = [cable()] if cables is None else cables
        self._sm, self._error, self.asked = sm, error, []

    def cables(self, via):
        self.asked.append(("cables", via))
        if self._error:
            raise self._error
        return self._cables

    def subnet_manager(self, via):
        self.asked.append(("sm", via))
        return self._sm

    def lid_route(self, lid, via):
        self.asked.append(("route", lid, via))
        return route()

    def port_counters(self, ports, via):
        self.asked.append(("counters", [(n.description, p, lid) for n, p, lid in ports], via))
        return CountersRead([counters(LEAF2.guid, 2, 6, SymbolErrorCounter=7)], [])


def test_what_is_asked_of_the_host_and_the_peers_lid_routes_it():
    host = FakeHost()
    got = ib.gather_local(host, LOCAL, lambda: {"SymbolErrorCounter": 10}, print)
    got = ib.gather_route(host, got, PEER_FACTS, None)
    assert host.asked == [
        ("cables", "mlx5_0/1"),
        ("sm", "mlx5_0/1"),
        ("route", 9, "mlx5_0/1"),
        ("counters", [("leaf02", 2, 6)], "mlx5_0/1"),  # the switch end of the peer's cable
    ]
    assert (
        got.thresholds == {"SymbolErrorCounter": 10}
        and got.peer_counters.values["SymbolErrorCounter"] == 7
    )
    assert run(got)["peer_cable"].verdict == PASS  # 7 is under its threshold of 10


def test_without_the_peers_lid_the_route_and_its_cable_say_why():
    host = FakeHost()
    mine = ib.gather_local(host, LOCAL, None, print)
    for peer, why in (
        (None, "no peer given"),
        (dataclasses.replace(PEER_FACTS, lid=None), "the peer told no LID"),
        (dataclasses.replace(PEER_FACTS, link_layer="Ethernet"), "the peer's port is Ethernet"),
    ):
        got = ib.gather_route(host, mine, peer, None)
        found = run(got)
        assert found["lid_route"].verdict == SKIP and found["lid_route"].evidence.startswith(why)
        assert found["peer_cable"].verdict == SKIP
    told = ib.gather_route(host, mine, None, "b told nothing: refused")
    assert run(told)["lid_route"].evidence == "b told nothing: refused"
    assert [a[0] for a in host.asked] == ["cables", "sm"]


def test_mads_refused_is_a_skip_on_infiniband_and_nothing_where_sysfs_did_not_say():
    denied = PermissionDeniedError(
        "cannot open /dev/infiniband/umad0: MADs need root", "run it as root"
    )
    got = ib.gather_local(FakeHost(error=denied), LOCAL, None, print)
    found = run(got)
    assert found["sm"].verdict == SKIP and found["sm"].evidence == (
        "not asked: cannot open /dev/infiniband/umad0: MADs need root (run it as root)"
    )
    assert found["cable"].verdict == SKIP and found["lid_route"].verdict == SKIP
    unknown = dataclasses.replace(LOCAL, link_layer=None)
    assert ib.gather_local(FakeHost(error=denied), unknown, None, print) is None
    assert ib.gather_local(FakeHost(cables=[]), unknown, None, print) is None  # not InfiniBand


def test_the_sm_missing_silent_or_not_the_master_fails_with_its_fix():
    f = run(path(sm_lid=0, sm=None))["sm"]
    assert (f.verdict, f.evidence) == (
        FAIL, "mlx5_0/1 has no SM LID: no subnet manager has swept the subnet through it"
    )  # fmt: skip
    assert f.fix.startswith("start a subnet manager on a node of the subnet")
    f = run(path(sm=None))["sm"]
    assert f.verdict == FAIL and "nothing there answers for its SMInfo" in f.evidence
    assert f.fix.startswith("start or restart the SM behind LID 1")
    # not asked (the port not ACTIVE): a port in INIT is one no SM has swept
    init = node(HCA.guid, "mlx5_0", NodeType.CA, port(1, 0, state=PortState.INIT))
    why = "mlx5_0/1 is not active (state 2)"
    f = run(path(sm_why=why, cable=dataclasses.replace(cable(), near=init)))["sm"]
    assert (f.verdict, f.evidence) == (
        FAIL, "mlx5_0/1 is INIT: its link is up and no subnet manager has brought it further"
    )  # fmt: skip
    assert f.fix.endswith("if one runs, it does not reach this port: look at its log")
    assert run(path(sm_why=why))["sm"].verdict == SKIP
    standby = dataclasses.replace(MASTER, state=SmState.STANDBY)
    f = run(path(sm=standby))["sm"]
    assert f.verdict == FAIL and f.evidence.endswith("STANDBY, priority 0, GUID "
                                                     "0x0000000000000031: the SM this port "
                                                     "names is not the master")  # fmt: skip


def test_a_cable_trained_narrow_fails_and_errors_over_their_thresholds_warn():
    narrow = node(HCA.guid, "node001 mlx5_0", NodeType.CA, port(1, 2, width=1))
    leaf = node(LEAF.guid, "leaf01", NodeType.SWITCH, port(0, 4), port(1, 4, width=1))
    c = dataclasses.replace(cable(narrow, leaf), counters=counters(
        LEAF.guid, 1, 4, SymbolErrorCounter=500, LinkDownedCounter=255))  # fmt: skip
    f = run(path(cable=c))["cable"]
    assert f.verdict == FAIL
    assert f.evidence == (
        "mlx5_0/1 <-> leaf01/1: 1X SDR ACTIVE; trained at 1X though both ends enable 4X; "
        "leaf01/1 SymbolErrorCounter 500; leaf01/1 LinkDownedCounter 255 (saturated: it counts "
        "no more)"
    )
    assert f.fix.startswith("a lane did not train: reseat the cable at both ends")
    assert "SymbolErrorCounter: bit errors on the wire" in f.fix
    assert f.fix.endswith("then clear leaf01/1's counters (perfquery -R 4 1) and run doctor "
                          "again: counts that grow are the cable's now")  # fmt: skip
    # under its threshold: named nowhere
    f = run(path(cable=c, thresholds={"SymbolErrorCounter": 600}))["cable"]
    assert "SymbolErrorCounter" not in f.evidence and "LinkDownedCounter 255" in f.evidence
    # its far end's counters not read: said, not judged
    silent = "leaf01 (LID 4): its performance agent did not answer"
    f = run(path(cable=dataclasses.replace(cable(), counters=None, silent=silent)))["cable"]
    assert f.verdict == PASS and f.evidence.endswith(
        "leaf01/1's error counters not read (leaf01 (LID 4): its performance agent did not answer)"
    )


def test_a_cable_whose_far_end_is_silent_fails_and_a_port_down_is_left_to_the_port_line():
    up = Cable("mlx5_0", HCA, None, why="mlx5_0/1 is up, and its far end did not answer")
    f = run(path(cable=up))["cable"]
    assert (f.verdict, f.evidence) == (FAIL, "mlx5_0/1 is up, and its far end did not answer")
    down = node(HCA.guid, "mlx5_0", NodeType.CA, port(1, 0, state=PortState.DOWN))
    f = run(path(cable=Cable("mlx5_0", down, None, why="mlx5_0/1 is DOWN")))["cable"]
    assert f.verdict == SKIP


def test_a_route_that_stops_fails_and_names_where_with_hostile_names_escaped():
    evil = dataclasses.replace(SPINE, description="spine\x1b[31m01")
    r = route("spine\x1b[31m01 has no route to LID 9 (its forwarding table says 255)")
    r = dataclasses.replace(r, hops=(r.hops[0], Hop(LEAF, LEAF.ports[5], evil, SPINE.ports[1])))
    found = run(path(route=r))
    f = found["lid_route"]
    assert f.verdict == FAIL and "\x1b" not in f.evidence + "".join(f.detail)
    assert f.evidence == (
        "LID 2 -> LID 9: 2 links through 2 switches, and it stops: spine\\x1b[31m01 has no route "
        "to LID 9 (its forwarding table says 255)"
    )
    assert f.detail[1] == "2: leaf01/5 -> spine\\x1b[31m01/1 (LID 1), 4X SDR ACTIVE"
    assert f.fix.startswith("the subnet manager programs the switches' forwarding tables")
    assert found["peer_cable"].verdict == SKIP
    assert path(route=r).to_json()["peer_cable"] is None


def test_a_hop_down_or_trained_slow_is_named_by_its_number():
    slow = dataclasses.replace(SPINE, ports={**SPINE.ports, 1: port(1, 1, speeds=SDR | DDR)})
    armed = port(5, 4, speeds=SDR | DDR, state=PortState.ARMED)
    leaf = dataclasses.replace(LEAF, ports={**LEAF.ports, 5: armed})
    r = route()
    r = dataclasses.replace(r, hops=(r.hops[0], Hop(leaf, leaf.ports[5], slow, slow.ports[1]),
                                     *r.hops[2:]))  # fmt: skip
    f = run(path(route=r))["lid_route"]
    assert f.verdict == FAIL
    assert f.evidence == (
        "LID 2 -> LID 9: 4 links through 3 switches: hop 2 not ACTIVE; runs at SDR though both "
        "ends enable DDR"
    )
    assert f.detail[1] == (
        "2: leaf01/5 -> spine01/1 (LID 1), 4X SDR ARMED: not ACTIVE; runs at SDR though both "
        "ends enable DDR"
    )
    assert f.fix.startswith("hop 2: a link the SM has not brought up (see the sm line); hop 2: "
                            "the cable or a transceiver is failing")  # fmt: skip


def test_the_peers_lid_travels_in_its_facts():
    assert Facts.from_wire(PEER_FACTS.to_wire()).lid == 9


def test_a_peer_lid_of_this_port_or_a_switch_has_no_peer_cable():
    own = Route((HCA, 1, 2), (HCA, 1, 2), ())
    assert run(path(route=own))["peer_cable"].evidence == (
        "the peer's LID is this port's own: no cable of a peer's"
    )
    to_switch = Route((HCA, 1, 2), (LEAF, 0, 4), route().hops[:1])
    found = run(path(route=to_switch))
    assert found["peer_cable"].evidence == "the peer's LID is a switch's: no cable of a peer's"
    assert found["lid_route"].verdict == PASS
