"""`ibtool mesh` names the cable on InfiniBand (ibtool.mesh.cables): the mesh's own analysis on
pairs shaped by one broken cable of a two-level fat tree, the subnet a Host double answers for
(its scan, the routes, the counters); the walk of the routes opensm really programs is in
tests/fabric/test_fabric_mesh.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ibtool.errors import PermissionDeniedError
from ibtool.mesh import cables, last
from ibtool.mesh.analysis import analyse
from ibtool.mesh.schedule import plan
from ibtool.model.fabric import (
    CountersRead,
    Fabric,
    FabricNode,
    FabricPort,
    Hop,
    NodeType,
    PortCounters,
    Route,
)
from ibtool.model.mesh import Endpoint, MeshResult, PairState, PairTable, Settings
from ibtool.model.records import PhysState, PortState
from ibtool.views import mesh as view

LEAVES, PER_LEAF, SPINES = 4, 3, 2
HOSTS = LEAVES * PER_LEAF


def _tree() -> Fabric:
    """Spines 0x100.., leaves 0x200.., hosts 0x1000..; a leaf's hosts on its first ports, then
    a port a spine; a spine's port N to leaf N. LIDs: spines 1-2, leaves 3-6, hosts 7 up."""
    far: dict[tuple[int, int], tuple[int, int]] = {}

    def cable(a, b):
        far[a], far[b] = b, a

    for x in range(LEAVES):
        for h in range(PER_LEAF):
            cable((0x1000 + x * PER_LEAF + h, 1), (0x200 + x, h + 1))
        for s in range(SPINES):
            cable((0x200 + x, PER_LEAF + s + 1), (0x100 + s, x + 1))

    def port(guid, number, lid=0):
        return FabricPort(number, guid + number, lid, 0, PortState.ACTIVE, PhysState.LINK_UP,
                          2, 2, 2, remote=far.get((guid, number)))  # fmt: skip

    def switch(guid, name, lid, ports):
        every = {0: port(guid, 0, lid), **{n: port(guid, n) for n in range(1, ports + 1)}}
        return FabricNode(guid, NodeType.SWITCH, name, 36, every)

    nodes = [switch(0x100 + s, f"spine{s + 1:02d}", 1 + s, LEAVES) for s in range(SPINES)]
    nodes += [switch(0x200 + x, f"leaf{x + 1:02d}", 3 + x, PER_LEAF + SPINES)
              for x in range(LEAVES)]  # fmt: skip
    nodes += [FabricNode(0x1000 + h, NodeType.CA, f"node{h + 1:03d} mlx5_0", 1,
                         {1: port(0x1000 + h, 1, 7 + h)}) for h in range(HOSTS)]  # fmt: skip
    return Fabric({n.guid: n for n in nodes}, (0x1000, 1), "mlx5_0", 1)


FABRIC = _tree()
BROKEN = {(0x202, PER_LEAF + 2), (0x101, 3)}  # leaf03/5 <-> spine02/3


def _walk(src: int, dst: int) -> Route:
    """Host src's LID to host dst's, down through spine (dst % SPINES) across leaves."""
    n = FABRIC.nodes

    def hop(a, pa):
        fg, fp = n[a].ports[pa].remote
        return Hop(n[a], n[a].ports[pa], n[fg], n[fg].ports[fp]), fg

    la, lb = src // PER_LEAF, dst // PER_LEAF
    first, _ = hop(0x1000 + src, 1)
    hops = [first]
    if la != lb:
        s = dst % SPINES
        hops += [hop(0x200 + la, PER_LEAF + s + 1)[0], hop(0x100 + s, lb + 1)[0]]
    hops.append(hop(0x200 + lb, dst % PER_LEAF + 1)[0])
    a, b = n[0x1000 + src], n[0x1000 + dst]
    return Route((a, 1, a.ports[1].lid), (b, 1, b.ports[1].lid), tuple(hops))


def _crosses(route: Route) -> bool:
    return any({(h.node.guid, h.port.number), (h.far.guid, h.far_port.number)} == BROKEN
               for h in route.hops)  # fmt: skip


class Subnet:
    """A Host's subnet questions, answered from FABRIC; what it was asked, kept."""

    def __init__(self, reaching="mlx5_0/1", symbols=0):
        self.reaching, self.symbols, self.asked = reaching, symbols, []

    def fabric_port_reaching(self, targets, bounds=None):
        self.asked.append(("reaching", len(targets)))
        if isinstance(self.reaching, Exception):
            raise self.reaching
        return self.reaching

    def fabric(self, via=None, bounds=None):
        self.asked.append(("fabric", via))
        return FABRIC

    def fabric_routes(self, fabric, pairs, bounds=None):
        self.asked.append(("routes", len(pairs)))
        by_lid = {7 + h: h for h in range(HOSTS)}
        return {(s, d): _walk(by_lid[s], by_lid[d]) for s, d in pairs}

    def fabric_counters(self, fabric, bounds=None, ports=None, clean=None, data=True, pace=None):
        self.asked.append(("counters", sorted((n.description, p) for n, p, _ in ports)))
        found = [
            PortCounters(node.guid, p, lid,
                         {"SymbolErrorCounter": self.symbols if node.guid == 0x101 else 0},
                         {"SymbolErrorCounter": 16})
            for node, p, lid in ports
        ]  # fmt: skip
        return CountersRead(found, [])


def _mesh(link_layer="InfiniBand", bad=_crosses) -> MeshResult:
    """Every ordered pair of the hosts' port 1 probed once; none of a pair's 20 pings answered
    where `bad` says its pings' route or its answers' fails."""
    eps = [
        Endpoint(f"node{h + 1:03d}", "mlx5_0", 1, 0, f"192.0.2.{h + 1}", "ACTIVE", link_layer,
                 lid=7 + h if link_layer == "InfiniBand" else None,
                 guid=0x1000 + h if link_layer == "InfiniBand" else None)
        for h in range(HOSTS)
    ]  # fmt: skip
    schedule = plan(eps, False, None)
    table = PairTable(schedule.rounds, len(eps))
    for r in range(schedule.rounds):
        for s, d in schedule.pairs(r):
            lost = bad(_walk(s, d)) or bad(_walk(d, s))
            table.record(r, s, d, PairState.PROBED, 20, 0 if lost else 20,
                         None if lost else 9.0, None if lost else 11.0, None if lost else 14.0,
                         False, None)  # fmt: skip
    settings = Settings(20, 64, "send", 100.0, 2.0, False, 10.0, 18521, "local")
    result = MeshResult(settings, eps, table, schedule.rounds, {})
    analyse(result, schedule)
    return result


def _counts() -> tuple[int, int]:
    pairs = [(a, b) for a in range(HOSTS) for b in range(HOSTS) if a != b]
    failing = sum(1 for a, b in pairs if _crosses(_walk(a, b)) or _crosses(_walk(b, a)))
    return failing, len(pairs) - failing


def test_the_broken_cable_is_named_first_with_its_counts_and_errors():
    result, said = _mesh(), []
    host = Subnet(symbols=340)
    cables.name_cables(host, result, said.append, thresholds={"SymbolErrorCounter": 10})
    failing, passing = _counts()
    v = result.verdicts[0]
    assert (v.culprit.value, v.level.name, v.subject) == ("cable", "FAIL", "leaf03/5 <-> spine02/3")
    assert v.why.startswith(f"on {failing} of {failing} failing paths, 0 of {passing} passing")
    assert v.why.endswith("; spine02/3: SymbolErrorCounter 340 > 10")
    assert v.next == (
        "ibtool fabric --via mlx5_0/1 route 13 12",
        "ibtool fabric --via mlx5_0/1 errors",
    )
    # node007 (LID 13, leaf03) to node006's LID 12: up through spine02, the cable
    assert _crosses(_walk(6, 5))
    # the paths whose every failing pair crosses it are said in it, not on their own
    assert not [w for w in result.verdicts if w.culprit.value == "path"]
    assert said == []
    # one scan, one walk of every route once each way, the cable's two ends' counters
    assert [a[0] for a in host.asked] == ["reaching", "fabric", "routes", "counters"]
    assert host.asked[2] == ("routes", HOSTS * (HOSTS - 1))
    assert host.asked[3] == ("counters", [("leaf03", 5), ("spine02", 3)])
    line = next(x for x in view.verdict_lines(result.verdicts) if " cable " in f" {x}")
    assert line.startswith("FAIL cable leaf03/5 <-> spine02/3: on ")
    got = json.loads("".join(view.json_chunks(result)))["verdicts"]
    (c,) = [x["cable"] for x in got if x["culprit"] == "cable"]
    assert [e["name"] for e in c["ends"]] == ["leaf03/5", "spine02/3"]
    assert c["ends"][1]["guid"] == "0x0000000000000101"
    assert (c["failing"], c["failing_walked"], c["failing_total"]) == (failing,) * 3
    assert (c["passing"], c["passing_walked"], c["passing_total"]) == (0, passing, passing)
    assert c["errors"] == [{"end": "spine02/3", "counter": "SymbolErrorCounter", "value": 340,
                            "threshold": 10, "saturated": False}]  # fmt: skip
    assert c["via"] == "mlx5_0/1" and c["ties"] == [] and c["unread"] == []
    assert all("cable" not in x for x in got if x["culprit"] != "cable")


def test_the_last_mesh_keeps_the_cable_verdict_for_the_dashboard(tmp_path):
    result = _mesh()
    cables.name_cables(Subnet(), result, [].append, thresholds={})
    last.save(result, str(tmp_path / "mesh.json"))
    kept = last.load(str(tmp_path / "mesh.json"))
    assert (kept.verdicts[0].culprit.value, kept.verdicts[0].subject) == (
        "cable",
        "leaf03/5 <-> spine02/3",
    )
    assert kept.verdicts[0].why == result.verdicts[0].why


def test_passing_pairs_past_the_cap_are_walked_as_an_even_sample(monkeypatch):
    monkeypatch.setattr(cables, "PASSING_MAX", 40)
    result, host = _mesh(), Subnet()
    cables.name_cables(host, result, [].append, thresholds={})
    failing, passing = _counts()
    v = result.verdicts[0]
    assert v.why.startswith(
        f"on {failing} of {failing} failing paths, 0 of 40 passing (walked of {passing})"
    )
    assert v.why.endswith("; no error counter over its threshold at either end")


def test_past_four_times_the_cap_the_passing_pairs_are_counted_not_looked_at(monkeypatch):
    monkeypatch.setattr(cables, "PASSING_MAX", 4)  # a stride of 11 over the 144 slots
    failing, passing = _counts()
    result = _mesh()
    cables.name_cables(Subnet(), result, [].append, thresholds={})
    v = result.verdicts[0]
    assert v.why.startswith(f"on {failing} of {failing} failing paths, 0 of 4 passing (walked")
    assert (v.cable.passing_total, v.cable.estimated) == (passing, False)  # every end IB: exact
    # one endpoint RoCE (a storage NIC meshed too): its pairs are not walked, and the
    # passing ones are counted in the share of the sample's that are walkable
    result = _mesh()
    result.endpoints[11] = dataclasses.replace(result.endpoints[11], link_layer="Ethernet")
    cables.name_cables(Subnet(), result, [].append, thresholds={})
    v = result.verdicts[0]
    assert v.cable.estimated and " (walked of about " in v.why
    assert 0.7 * passing < v.cable.passing_total < passing


def test_roce_endpoints_ask_the_subnet_nothing_and_say_nothing():
    result = _mesh("Ethernet")
    before = list(result.verdicts)
    host = Subnet()
    cables.name_cables(host, result, pytest.fail, thresholds={})
    assert result.verdicts == before and host.asked == []


def test_no_port_of_their_subnet_here_says_nothing():
    result = _mesh()
    before = list(result.verdicts)
    host = Subnet(reaching=None)
    cables.name_cables(host, result, pytest.fail, thresholds={})
    assert result.verdicts == before and [a[0] for a in host.asked] == ["reaching"]


def test_a_healthy_mesh_asks_nothing():
    result = _mesh(bad=lambda route: False)
    host = Subnet()
    cables.name_cables(host, result, pytest.fail, thresholds={})
    assert result.verdicts == [] and host.asked == []


def test_umad_devices_not_ours_are_said_once_and_the_mesh_stands():
    result = _mesh()
    before = list(result.verdicts)
    said: list[str] = []
    denied = PermissionDeniedError("cannot open /dev/infiniband/umad0: MADs need root")
    cables.name_cables(Subnet(reaching=denied), result, said.append, thresholds={})
    assert result.verdicts == before
    assert said == ["mesh: no cable named: cannot open /dev/infiniband/umad0: MADs need root"]


def test_a_dead_host_is_its_endpoint_s_verdict_and_no_cable():
    result = _mesh(bad=lambda route: route.source[0].guid == 0x1007 or route.dest[0].guid == 0x1007)
    before = list(result.verdicts)
    assert [v.subject for v in before] == ["node008/mlx5_0/1"]
    cables.name_cables(Subnet(), result, pytest.fail, thresholds={})
    assert result.verdicts == before


def test_infiniband_diags_thresholds_are_read_as_ibqueryerrors_reads_them(tmp_path):
    f = tmp_path / "error_thresholds"
    f.write_text("# site\nSymbolErrorCounter=0x10\n")
    assert cables.read_thresholds(str(f)) == {"SymbolErrorCounter": 16}
    f.write_text("Nonsense=1\n")
    assert cables.read_thresholds(str(f)) == {}
    assert cables.read_thresholds(str(tmp_path / "none")) == {}
