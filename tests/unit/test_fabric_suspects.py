"""The cable the failing paths have in common (`ibtool mesh` on InfiniBand): the rule on paths
made here, a two-level fat tree routed as opensm's up/down routing would (each destination LID
down through one spine); the walk of the routes opensm really programmed is in tests/fabric."""

from __future__ import annotations

import itertools

from ibtool.model.fabric import FabricNode, FabricPort, Hop, LinkEnd, NodeType
from ibtool.model.fabric.suspects import MAX_CABLES, cable_name, suspect_cables
from ibtool.model.records import PhysState, PortState

LEAVES, PER_LEAF, SPINES = 4, 3, 2


def _port(guid: int, number: int) -> FabricPort:
    return FabricPort(number, guid + number, 0, 0, PortState.ACTIVE, PhysState.LINK_UP)


def _node(guid: int, kind: NodeType, name: str, ports: int) -> FabricNode:
    return FabricNode(guid, kind, name, ports, {n: _port(guid, n) for n in range(1, ports + 1)})


SPINE = [_node(0x100 + s, NodeType.SWITCH, f"spine{s + 1:02d}", 36) for s in range(SPINES)]
LEAF = [_node(0x200 + x, NodeType.SWITCH, f"leaf{x + 1:02d}", 36) for x in range(LEAVES)]
HOST = [_node(0x1000 + h, NodeType.CA, f"node{h + 1:03d} mlx5_0", 1)
        for h in range(LEAVES * PER_LEAF)]  # fmt: skip


def _hop(a: FabricNode, pa: int, b: FabricNode, pb: int) -> Hop:
    return Hop(a, a.ports[pa], b, b.ports[pb])


def leaf_of(h: int) -> int:
    return h // PER_LEAF


def spine_of(h: int) -> int:
    """The spine the routes to host h's LID go down through."""
    return h % SPINES


def route(a: int, b: int) -> list[Hop]:
    """a to b: up a's cable, to the spine of b's LID where b is on another leaf, down to b."""
    la, lb = leaf_of(a), leaf_of(b)
    hops = [_hop(HOST[a], 1, LEAF[la], a % PER_LEAF + 1)]
    if la != lb:
        s = spine_of(b)
        hops += [_hop(LEAF[la], PER_LEAF + s + 1, SPINE[s], la + 1),
                 _hop(SPINE[s], lb + 1, LEAF[lb], PER_LEAF + s + 1)]  # fmt: skip
    return hops + [_hop(LEAF[lb], b % PER_LEAF + 1, HOST[b], 1)]


def path(a: int, b: int) -> list[Hop]:
    """What pair a -> b crosses: its pings' route and its answers'."""
    return route(a, b) + route(b, a)


PAIRS = [(a, b) for a, b in itertools.permutations(range(len(HOST)), 2)]
# the cable the spine tests break: leaf03's uplink to spine02
UPLINK = (LinkEnd(LEAF[2], LEAF[2].ports[PER_LEAF + 2]), LinkEnd(SPINE[1], SPINE[1].ports[3]))


def crosses(hops: list[Hop], ends) -> bool:
    want = {(e.node.guid, e.port.number) for e in ends}
    return any({(h.node.guid, h.port.number), (h.far.guid, h.far_port.number)} == want
               for h in hops)  # fmt: skip


def split(bad) -> tuple[list, list]:
    failing = [path(a, b) for a, b in PAIRS if bad(a, b)]
    passing = [path(a, b) for a, b in PAIRS if not bad(a, b)]
    return failing, passing


def test_a_spine_port_is_named_with_its_counts():
    failing, passing = split(lambda a, b: crosses(path(a, b), UPLINK))
    assert 2 <= len(failing) < len(PAIRS)
    (got,) = suspect_cables(failing, passing)
    assert got.name == "leaf03/5 <-> spine02/3"
    assert (got.failing, got.failing_paths) == (len(failing), len(failing))
    assert (got.passing, got.passing_paths) == (0, len(passing))
    assert got.ties == ()


def test_the_end_nearer_the_hosts_is_named_first_whichever_way_it_was_crossed():
    failing, passing = split(lambda a, b: crosses(path(a, b), UPLINK))
    for order in (failing, failing[::-1], [p[::-1] for p in failing]):
        assert [s.name for s in suspect_cables(order, passing)] == ["leaf03/5 <-> spine02/3"]


def test_a_spine_port_among_some_noise():
    bad = [p for p in PAIRS if crosses(path(*p), UPLINK)]
    noise = (0, 4)  # leaf01 to leaf02: not through leaf03
    assert not crosses(path(*noise), UPLINK)
    failing, passing = split(lambda a, b: (a, b) in bad or (a, b) == noise)
    (got,) = suspect_cables(failing, passing)
    assert got.name == "leaf03/5 <-> spine02/3"
    assert (got.failing, got.failing_paths, got.passing) == (len(bad), len(bad) + 1, 0)


def test_noise_alone_names_nothing():
    scattered = {(0, 4), (7, 1), (10, 5), (3, 11)}
    failing, passing = split(lambda a, b: (a, b) in scattered)
    assert suspect_cables(failing, passing) == []


def test_no_failing_pair_names_nothing():
    assert suspect_cables([], [path(a, b) for a, b in PAIRS]) == []
    assert suspect_cables([path(0, 5)], [path(a, b) for a, b in PAIRS if (a, b) != (0, 5)]) == []


def test_a_host_cable_is_named_when_no_endpoint_verdict_says_it():
    failing, passing = split(lambda a, b: 7 in (a, b))
    (got,) = suspect_cables(failing, passing)
    assert got.name == "node008 mlx5_0/1 <-> leaf03/2"
    assert (got.failing, got.passing) == (len(failing), 0)


def test_never_the_host_cable_of_an_endpoint_a_verdict_names():
    failing, passing = split(lambda a, b: 7 in (a, b))
    assert suspect_cables(failing, passing, named={(HOST[7].guid, 1)}) == []


def test_a_lone_host_s_uplinks_are_not_named_for_what_its_verdict_explains():
    # node008 alone on its leaf: the leaf's uplinks carry its pairs only, and fail with them
    alone = [h for h in range(len(HOST)) if leaf_of(h) != leaf_of(7)] + [7]
    failing = [path(a, b) for a, b in itertools.permutations(alone, 2) if 7 in (a, b)]
    passing = [path(a, b) for a, b in itertools.permutations(alone, 2) if 7 not in (a, b)]
    assert suspect_cables(failing, passing)  # the evidence alone points at its leaf
    assert suspect_cables(failing, passing, named={(HOST[7].guid, 1)}) == []


def test_a_spine_port_beside_an_endpoint_a_verdict_names():
    failing, passing = split(lambda a, b: 0 in (a, b) or crosses(path(a, b), UPLINK))
    (got,) = suspect_cables(failing, passing, named={(HOST[0].guid, 1)})
    assert got.name == "leaf03/5 <-> spine02/3"
    assert got.explained == sum(1 for p in failing if crosses(p, _host_cable(0)))
    assert got.passing == 0


def _host_cable(h: int):
    return (
        LinkEnd(HOST[h], HOST[h].ports[1]),
        LinkEnd(LEAF[leaf_of(h)], LEAF[leaf_of(h)].ports[h % PER_LEAF + 1]),
    )


def test_cables_that_cannot_be_told_apart_are_named_together():
    # node001 -> node004 and node002 -> node005 (and back) through spine01 failing, no other
    # path through spine01 walked: its two cables tie; the hosts' cables pass elsewhere
    up = _hop(LEAF[0], PER_LEAF + 1, SPINE[0], 1)
    down = _hop(SPINE[0], 2, LEAF[1], PER_LEAF + 1)
    failing = [[_hop(HOST[0], 1, LEAF[0], 1), up, down, _hop(LEAF[1], 1, HOST[3], 1)],
               [_hop(HOST[1], 1, LEAF[0], 2), up, down, _hop(LEAF[1], 2, HOST[4], 1)]]  # fmt: skip
    passing = [[_hop(HOST[0], 1, LEAF[0], 1), _hop(LEAF[0], 2, HOST[1], 1)],
               [_hop(HOST[3], 1, LEAF[1], 1), _hop(LEAF[1], 2, HOST[4], 1)]]  # fmt: skip
    (got,) = suspect_cables(failing, passing)
    assert [got.name] + [cable_name(*t) for t in got.ties] == [
        "leaf01/4 <-> spine01/1",
        "leaf02/4 <-> spine01/2",
    ]
    assert (got.failing, got.passing) == (2, 0)


def test_of_two_cables_on_every_failing_path_the_one_no_passing_path_crosses():
    # both cables on the ten failing paths; the second on one passing path too, few enough
    # to be a suspect (10 of 11 failing), but the first explains them with nothing against
    up = _hop(LEAF[0], PER_LEAF + 1, SPINE[0], 1)
    down = _hop(SPINE[0], 2, LEAF[1], PER_LEAF + 1)
    host = [_hop(HOST[h], 1, LEAF[0], 1) for h in range(10)]
    failing = [[host[h], up, down] for h in range(10)]
    passing = [[_hop(HOST[11], 1, LEAF[2], 1), _hop(LEAF[2], 4, SPINE[0], 3), down]]
    passing += [[host[h]] for h in range(10)]
    (got,) = suspect_cables(failing, passing)
    assert (got.name, got.failing, got.passing, got.ties) == ("leaf01/4 <-> spine01/1", 10, 0, ())


def test_a_sample_of_passing_paths_counts_for_all_of_them():
    failing, passing = split(lambda a, b: crosses(path(a, b), UPLINK))
    # one passing path through the cable among ten walked: named, it is nearly all failing
    sample = [failing[0]] + passing[:9]
    (got,) = suspect_cables(failing[1:], sample)
    assert (got.name, got.passing, got.passing_paths) == ("leaf03/5 <-> spine02/3", 1, 10)
    # the ten a sample of many more: that one stands for as many as there are failing
    many = len(sample) * (len(failing) - 1)
    assert suspect_cables(failing[1:], sample, passing_total=many) == []


def test_a_dead_leaf_whose_endpoints_the_verdicts_name_names_no_cable():
    # every host of leaf03 failing with everyone: its uplinks carry nothing else, but its
    # endpoints' verdicts explain every failing path
    dead = [h for h in range(len(HOST)) if leaf_of(h) == 2]
    failing, passing = split(lambda a, b: a in dead or b in dead)
    named = {(HOST[h].guid, 1) for h in dead}
    assert suspect_cables(failing, passing, named=named) == []


def test_more_broken_cables_than_named_at_once_name_none():
    # six hosts' cables failing on four leaves (the hosts unnamed): six cables, none
    # explaining most of the failures
    bad = {0, 1, 3, 4, 6, 9}
    failing, passing = split(lambda a, b: a in bad or b in bad)
    assert MAX_CABLES < len(bad)
    assert suspect_cables(failing, passing) == []
