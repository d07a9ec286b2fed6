"""The cable the failing pairs have in common, on InfiniBand: a verdict beside the analysis'.

When the mesh's endpoints are InfiniBand ports whose agents said their LID and node GUID, and
this host (the coordinator) has an active InfiniBand port of their subnet, the subnet is
scanned once through it, the routes of the failing pairs (and of an even sample of the
passing ones) are walked through the switches' forwarding tables, both ways a pair (its pings
and their answers), each table block asked once for all of them, and the cable their paths
have in common (ibtool.model.fabric.suspects) is named, its ends' PMA error counters beside
it. Anywhere else (RoCE, no port of that subnet here, fewer than two failing pairs) nothing
is asked and nothing is said.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Callable

from ibtool.errors import IbtoolError
from ibtool.mesh.analysis import LOOPED
from ibtool.model.fabric import (
    THRESHOLDS_FILE,
    THRESHOLDS_MAX,
    Bounds,
    Fabric,
    NodeType,
    end_name,
    parse_thresholds,
)
from ibtool.model.fabric.counters import over
from ibtool.model.fabric.suspects import MIN_PATHS, CableSuspect, suspect_cables
from ibtool.model.mesh import (
    CableFinding,
    CounterOver,
    Culprit,
    Health,
    Level,
    MeshResult,
    PairState,
    Verdict,
)

FAILING_MAX = 2048  # failing pairs whose paths are walked, at most (an even sample past it)
# passing pairs walked, an even sample: enough that a cable on a tenth of the paths is crossed
# by dozens of them, few enough that a 1,024-node mesh walks thousands of routes, not millions
PASSING_MAX = 1024
PATHS_SHOWN = 3  # the paths a cable's verdict says it explains, named (JSON: all of them)


def name_cables(
    host,
    result: MeshResult,
    say: Callable[[str], None],
    bounds: Bounds | None = None,
    thresholds: dict[str, int] | None = None,
) -> None:
    """Add the verdict naming the cable the failing pairs have in common to `result`, when
    there is one and this host can walk the subnet (the module's docstring); `say` gets a
    line where it could not. `thresholds`: the error counters' (default: infiniband-diags'
    file, as ibqueryerrors reads it)."""
    eps, t = result.endpoints, result.pairs
    walkable = [e.link_layer == "InfiniBand" and bool(e.lid and e.guid) for e in eps]
    if not any(walkable):
        return
    failing = _failing(t, walkable)
    if len(failing) < MIN_PATHS:
        return
    bounds = bounds or Bounds()
    targets = list(dict.fromkeys((eps[i % t.width].lid, eps[i % t.width].guid) for i in failing))
    try:
        via = host.fabric_port_reaching(targets, bounds)
        if via is None:
            return
        fabric = host.fabric(via, bounds)
    except IbtoolError as e:
        say(f"mesh: no cable named: {e.message}")
        return
    inside = [w and _in(fabric, e) for w, e in zip(walkable, eps)]
    failing = _failing(t, inside)
    if len(failing) < MIN_PATHS:
        return
    passing, passing_total, about = _passing(t, inside)
    walked_f = [_pair(t, i) for i in _sample(failing, FAILING_MAX)]
    walked_p = [_pair(t, i) for i in passing]
    lids = set()
    for s, d, _ in walked_f + walked_p:
        lids |= {(eps[s].lid, eps[d].lid), (eps[d].lid, eps[s].lid)}
    try:
        routes = host.fabric_routes(fabric, sorted(lids), bounds)
    except IbtoolError as e:
        say(f"mesh: no cable named: {e.message}")
        return

    def path(pair: tuple[int, int, int]) -> list:
        s, d = eps[pair[0]].lid, eps[pair[1]].lid
        return [h for r in (routes.get((s, d)), routes.get((d, s))) if r for h in r.hops]

    bad = [path(p) for p in walked_f]
    named = {(eps[i].guid, eps[i].port) for i in explained(result)}
    suspects = suspect_cables(bad, [path(p) for p in walked_p], named, len(failing), passing_total)
    found = []
    for s in suspects:
        errors, unread = _counters(host, fabric, s, bounds, thresholds)
        mine = {p[:2]: p for p, hops in zip(walked_f, bad) if _crosses(hops, s)}
        whole = len(walked_f) == len(failing)  # every failing pair walked: a verdict's all known
        ends = _crossed_by_all(result, walked_f, mine) if whole else ()
        folded = _paths_crossing(result, walked_f, mine) if whole else []
        finding = CableFinding(
            s, via, len(failing), passing_total, errors, unread,
            tuple(eps[e].name for e in ends), tuple(v.subject for v in folded), about,
        )  # fmt: skip
        # a FAIL where its pairs lost pings, a WARN where they were only slow
        worst = max(t.health[t.slot(r, src)] for src, _, r in mine.values())
        a, b, _ = next(iter(mine.values()))
        src, dst = eps[a].lid, eps[b].lid
        if not _crosses(routes[src, dst].hops, s):
            src, dst = dst, src  # the answers' route is the one through it
        found.append(
            Verdict(
                Culprit.CABLE,
                Level.WARN if worst == Health.SLOW else Level.FAIL,
                s.name,
                why(finding),
                next=(
                    f"ibtool fabric --via {via} route {src} {dst}",
                    f"ibtool fabric --via {via} errors",
                ),
                cable=finding,
            )
        )
        result.verdicts[:] = [v for v in result.verdicts if v not in folded]
    # first: the one cable says what the endpoints' and paths' verdicts after it see of it
    result.verdicts[:0] = found


def _crossed_by_all(result: MeshResult, walked: list, mine: dict) -> list[int]:
    """The endpoints an endpoint verdict names every one of whose failing pairs crosses the
    cable (`mine`, by (source, destination)): what it explains of theirs."""
    named = sorted(
        {v.endpoints[0] for v in result.verdicts if v.culprit == Culprit.ENDPOINT and v.endpoints}
    )
    out = []
    for e in named:
        theirs = [p[:2] for p in walked if e in p[:2]]
        if theirs and all(p in mine for p in theirs):
            out.append(e)
    return out


def _paths_crossing(result: MeshResult, walked: list, mine: dict) -> list[Verdict]:
    """The path verdicts every failing pair of whose ends crosses the cable: the cable's,
    said in its verdict instead."""
    out = []
    for v in result.verdicts:
        if v.culprit != Culprit.PATH or len(v.endpoints) != 2:
            continue
        ends = set(v.endpoints)
        theirs = [p[:2] for p in walked if {p[0], p[1]} == ends]
        if theirs and all(p in mine for p in theirs):
            out.append(v)
    return out


def explained(result: MeshResult) -> set[int]:
    """The endpoints a verdict other than a path's names, as the analysis leaves their bad
    pairs to that verdict (a node's ports looped through lo excepted: only the pairs between
    them are theirs): their host cables are theirs to name."""
    out: set[int] = set()
    for v in result.verdicts:
        if v.culprit in (Culprit.PATH, Culprit.CABLE):
            continue
        if v.culprit == Culprit.NODE and v.why.startswith(LOOPED):
            continue
        out.update(v.endpoints)
    return out


def why(f: CableFinding) -> str:
    """`on 9 of 9 failing paths, 0 of 40 passing; leaf03/19: SymbolErrorCounter 512 > 0`."""
    s = f.suspect
    text = f"on {s.failing} of {s.failing_paths} failing paths"
    if s.failing_paths < f.failing_total:
        text += f" (walked of {f.failing_total})"
    text += f", {s.passing} of {s.passing_paths} passing"
    if s.passing_paths < f.passing_total:
        text += f" (walked of {'about ' if f.estimated else ''}{f.passing_total})"
    told = []
    if f.endpoints:
        told.append(f"every failing pair of {', '.join(f.endpoints)}")
    if f.paths:
        shown = ", ".join(f.paths[:PATHS_SHOWN]) + (" ..." if len(f.paths) > PATHS_SHOWN else "")
        told.append(f"the path{'s' * (len(f.paths) != 1)} {shown}")
    if told:
        text += "; it explains " + " and ".join(told)
    if s.ties:
        others = ", ".join(f"{end_name(a)} <-> {end_name(b)}" for a, b in s.ties)
        text += f"; or {others}: the paths cannot tell them apart"
    for end in (end_name(s.near), end_name(s.far)):
        mine = [e for e in f.errors if e.end == end]
        if end in f.unread:
            text += f"; {end}: its counters unread"
        elif mine:
            text += f"; {end}: " + ", ".join(
                f"{e.counter} {e.value}" + (" (saturated)" if e.saturated else f" > {e.threshold}")
                for e in mine
            )
    if not f.errors and not f.unread:
        text += "; no error counter over its threshold at either end"
    return text


def _failing(t, walkable: list[bool]) -> array:
    """The slots of the probed pairs between two walkable endpoints that are not OK, in the
    mesh's order: the bytes of the pairs' health searched at C speed, not 8 million pairs
    looked at one by one."""
    width, dst, state = t.width, t.dst, t.state
    found = array("q")
    for m in _NOT_OK.finditer(bytes(t.health)):
        i = m.start()
        s, d = i % width, dst[i]
        if d >= 0 and d != s and state[i] == PairState.PROBED and walkable[s] and walkable[d]:
            found.append(i)
    return found


_NOT_OK = re.compile(rb"[^\x00]")  # Health.OK is 0


def _passing(t, walkable: list[bool]) -> tuple[list[int], int, bool]:
    """An even sample of at most PASSING_MAX slots of the probed pairs between two walkable
    endpoints that are OK, how many there are in all, and whether that is an estimate: past
    4 x PASSING_MAX slots they are counted as the probed pairs (at C speed) less those not
    OK, in the share of the sample's that have two walkable ends (all of them, exactly, where
    every endpoint is walkable)."""
    width, dst, state, health = t.width, t.dst, t.state, t.health
    stride = max(1, len(dst) // (4 * PASSING_MAX))
    while stride > 1 and math.gcd(stride, width) != 1:  # else a stride of 8 samples one rail
        stride += 1
    seen, kept = 0, []
    for i in range(0, len(dst), stride):
        d = dst[i]
        if d >= 0 and state[i] == PairState.PROBED and health[i] == Health.OK:
            seen += 1
            if walkable[i % width] and walkable[d] and d != i % width:
                kept.append(i)
    if stride == 1:
        return _sample(kept, PASSING_MAX), len(kept), False
    not_ok = sum(1 for m in _NOT_OK.finditer(bytes(health)) if state[m.start()] == PairState.PROBED)
    ok = state.count(PairState.PROBED) - not_ok
    every = all(walkable)
    total = ok if every or not seen else round(ok * len(kept) / seen)
    return _sample(kept, PASSING_MAX), total, not every


def _pair(t, i: int) -> tuple[int, int, int]:
    """(source, destination, round) of slot `i`."""
    r, s = divmod(i, t.width)
    return s, t.dst[i], r


def _sample(pairs, most: int) -> list:
    """An even sample of at most `most` of `pairs` (all of them when they fit)."""
    if len(pairs) <= most:
        return list(pairs)
    step = len(pairs) / most
    return [pairs[math.floor(k * step)] for k in range(most)]


def _in(fabric: Fabric, e) -> bool:
    """Whether endpoint `e` is a port of the fabric: its node GUID a node of it, with its
    LID on that port (a LID alone names a port of one subnet only)."""
    node = fabric.nodes.get(e.guid)
    port = node.ports.get(e.port) if node is not None else None
    return port is not None and port.lid == e.lid


def _crosses(hops: list, s: CableSuspect) -> bool:
    want = {(s.near.node.guid, s.near.port.number), (s.far.node.guid, s.far.port.number)}
    return any(
        {(h.node.guid, h.port.number), (h.far.guid, h.far_port.number)} == want for h in hops
    )


def _counters(host, fabric: Fabric, s: CableSuspect, bounds: Bounds, thresholds):
    """The error counters over their thresholds of both ends of the cable, and the ends
    whose counters did not answer."""
    if thresholds is None:
        thresholds = read_thresholds()
    ends = [s.near, s.far]
    wanted = []
    for e in ends:
        lid = e.node.lid if e.node.type == NodeType.SWITCH else e.port.lid
        if lid:
            wanted.append((e.node, e.port.number, lid))
    try:
        read = host.fabric_counters(fabric, bounds, wanted, data=False)
    except IbtoolError:
        return (), tuple(end_name(e) for e in ends)
    got = {(c.node, c.port): c for c in read.counters}
    errors, unread = [], []
    for e in ends:
        c = got.get((e.node.guid, e.port.number))
        if c is None:
            unread.append(end_name(e))
            continue
        errors += [
            CounterOver(end_name(e), name, value, limit, saturated)
            for name, value, limit, saturated in over(c.values, c.bits, thresholds)
        ]
    return tuple(errors), tuple(unread)


def read_thresholds(path: str = THRESHOLDS_FILE) -> dict[str, int]:
    """infiniband-diags' error thresholds, as ibqueryerrors reads them; none (any error
    counts) where the file is missing, too large or not in its format."""
    try:
        with open(path, "rb") as f:
            raw = f.read(THRESHOLDS_MAX + 1)
    except OSError:
        return {}
    if len(raw) > THRESHOLDS_MAX:
        return {}
    try:
        return parse_thresholds(raw.decode("utf-8", "replace"), path)
    except ValueError:
        return {}
