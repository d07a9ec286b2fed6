"""The cable the failing paths have in common: `ibtool mesh` on InfiniBand.

A path is what one probed pair of endpoints crossed: the route of its pings (source LID to
destination LID) and the route of the answers back, each a sequence of `Hop`s (a cable, its
two ends (node GUID, port) in the direction travelled), walked through the switches' linear
forwarding tables. A cable is the same cable whichever way it was crossed.

The rule, in this order:

1. A cable is a suspect only if at least MIN_PATHS failing paths cross it (one path says
   nothing about which of its cables failed) and few passing paths do: of the paths through
   it, at least PURE are failing ones (the passing paths counted as their sample stands for
   all of them, when only a sample was walked). A broken cable fails every path through it;
   a cable that some passing paths cross healthily is not what failed the others.
2. A cable with an end on an endpoint's port that a verdict already names (its port, node,
   rail or switch: every verdict but a path's) is never a suspect: that verdict says it, and
   the host cable of a dead port is on every one of its failing paths. Such a path is
   already explained; a suspect must also be on at least MIN_PATHS failing paths that no
   endpoint verdict explains, so that the uplinks of a dead host with no other host on its
   leaf are not named for what its own verdict explains.
3. The suspects are taken greedily, at most MAX_CABLES: each time the one that explains the
   most failing paths not yet explained less the passing paths through it (as many as its
   sample stands for), then the one on fewer passing paths, then by name; cables that cross
   exactly the same failing paths and the same number of passing ones cannot be told apart
   and are named together (ties).
4. They are named only if, with the endpoint verdicts, they explain NEARLY all the failing
   paths: a cable is named only when it explains the failures better than anything else; a
   scatter of failing paths (stalls, noise), a switch whose every port fails, or more broken
   cables than MAX_CABLES name none.

Pure: given the paths, it names; walking them is ibtool.sources.subnet's.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from ibtool.model.deferred import dataclass
from ibtool.model.fabric.records import LinkEnd, NodeType, end_name
from ibtool.model.fabric.route import Hop

MIN_PATHS = 2  # failing paths a cable must cross to be suspected
PURE = 0.9  # the share of the paths through a suspect that must be failing ones
NEARLY = 0.8  # the share of the failing paths the suspects and named endpoints must explain
MAX_CABLES = 3  # suspects named at most: more broken at once is a switch, not cables

End = tuple[int, int]  # (node GUID, port)
Key = tuple[End, End]  # a cable, its ends sorted


@dataclass(frozen=True)
class CableSuspect:
    """A cable named for the failing paths: its ends, the one nearer the hosts first,
    the failing and passing paths through it of those walked, and the cables that cannot be
    told from it (`ties`, each its two ends)."""

    near: LinkEnd
    far: LinkEnd
    failing: int  # failing paths through it
    failing_paths: int  # failing paths walked
    passing: int  # passing paths through it
    passing_paths: int  # passing paths walked
    explained: int = 0  # failing paths the endpoint verdicts explain (none through it or some)
    ties: tuple[tuple[LinkEnd, LinkEnd], ...] = ()

    @property
    def name(self) -> str:
        return cable_name(self.near, self.far)


def cable_name(near: LinkEnd, far: LinkEnd) -> str:
    """`leaf03/19 <-> spine02/3`."""
    return f"{end_name(near)} <-> {end_name(far)}"


def _key(hop: Hop) -> Key:
    a, b = (hop.node.guid, hop.port.number), (hop.far.guid, hop.far_port.number)
    return (a, b) if a <= b else (b, a)


def suspect_cables(
    failing: Sequence[Iterable[Hop]],
    passing: Sequence[Iterable[Hop]],
    named: Collection[End] = (),
    failing_total: int | None = None,
    passing_total: int | None = None,
) -> list[CableSuspect]:
    """The cables the failing paths have in common and the passing ones lack, by the
    module's rule; [] when none explains them. `named`: the (node GUID, port) of the
    endpoints' ports a verdict names. `failing_total`, `passing_total`: how many paths each
    sequence was sampled from (default: all of them were walked)."""
    ends: dict[Key, tuple[LinkEnd, LinkEnd]] = {}
    depth: dict[int, int] = {}  # node GUID -> the fewest hops it was seen from a host

    def keys(path: Iterable[Hop]) -> set[Key]:
        found = set()
        hops = 0
        for hop in path:
            if hop.node.type == NodeType.CA:  # a route (back) begins
                hops = 0
            for guid, d in ((hop.node.guid, hops), (hop.far.guid, hops + 1)):
                depth[guid] = min(depth.get(guid, d), d)
            hops += 1
            k = _key(hop)
            if k not in ends:
                ends[k] = (LinkEnd(hop.node, hop.port), LinkEnd(hop.far, hop.far_port))
            found.add(k)
        return found

    def named_as(k: Key) -> tuple[LinkEnd, LinkEnd]:
        """Its end nearer the hosts first (a host's, a leaf's), else as first crossed."""
        a, b = ends[k]
        return (b, a) if depth[b.node.guid] < depth[a.node.guid] else (a, b)

    bad = [keys(p) for p in failing]
    good = [keys(p) for p in passing]
    if len(bad) < MIN_PATHS:
        return []
    named = set(named)
    barred = {k for k in ends if k[0] in named or k[1] in named}
    f_scale = (failing_total or len(bad)) / len(bad)
    p_scale = (passing_total or len(good)) / len(good) if good else 1.0
    through: dict[Key, set[int]] = {}
    for i, path in enumerate(bad):
        for k in path:
            through.setdefault(k, set()).add(i)
    passed: dict[Key, int] = {}
    for path in good:
        for k in path:
            passed[k] = passed.get(k, 0) + 1
    by_endpoint = {i for i, path in enumerate(bad) if path & barred}

    def passes(k: Key) -> float:  # the passing paths through it, as its sample stands for
        return passed.get(k, 0) * p_scale

    suspects = [
        k
        for k, paths in through.items()
        if k not in barred
        and len(paths) >= MIN_PATHS
        and len(paths - by_endpoint) >= MIN_PATHS
        and len(paths) * f_scale >= PURE * (len(paths) * f_scale + passes(k))
    ]
    done = set(by_endpoint)
    chosen: list[CableSuspect] = []
    while suspects and len(chosen) < MAX_CABLES:
        best = max(
            suspects,
            key=lambda k: (len(through[k] - done) - passes(k), -passed.get(k, 0), _neg(k)),
        )
        new = through[best] - done
        if len(new) < MIN_PATHS:
            break
        same = [k for k in suspects if through[k] == through[best] and passed.get(k, 0) ==
                passed.get(best, 0) and k != best]  # fmt: skip
        near, far = named_as(best)
        chosen.append(
            CableSuspect(
                near,
                far,
                len(through[best]),
                len(bad),
                passed.get(best, 0),
                len(good),
                len(by_endpoint),
                tuple(named_as(k) for k in sorted(same)),
            )  # fmt: skip
        )
        done |= new
        suspects = [k for k in suspects if k != best and k not in same]
    if not chosen or len(done) < NEARLY * len(bad):
        return []
    return chosen


def _neg(k: Key) -> tuple:
    """A key that sorts the cables by their ends, the first first under max()."""
    return tuple(-x for end in k for x in end)
