"""From every pair's figures to the few verdicts that name the culprit.

1. Each group (a rail, or all rails) gets a baseline: the median over its answered pairs of
   their median RTT, and of their p90.
2. Each pair gets a health: FAILED (nothing answered, or never probed because an end is
   down or its node has no agent), LOSSY (some pings unanswered), SLOW (all answered, but its
   p90 is more than `slow_factor` times the baseline median, and SLOW_FLOOR_US above it: a
   lossy link under RC shows as retransmissions, not losses), or OK; a pair whose pings
   were all answered but whose pings of the path MTU's full payload were not is FAILED (none
   of those answered) or LOSSY, of its own kind (FULL): a smaller MTU on the path. A pair
   whose lost pings a retry after the last round answered whole is judged on the pings it
   did answer: one end stalled, the network did not lose them.
3. Facts first: an endpoint whose port is not ACTIVE is named as such, with no inference.
4. Then, repeatedly, the endpoint that explains the most bad pairs of one kind (loss, or
   slowness) is named, if more than half of its partners are bad that way in both
   directions (as the client of their pair and as its server) and at least two are: one bad
   partner says nothing about which end is at fault. Its pairs are then explained, and the
   counts of its partners lose them, so that a healthy endpoint that merely met it is not
   named too.
5. Then, the same way, the endpoint whose port's RC retransmission counters moved in most of
   its rounds (RETRANS_SHARE of the pings through it), its partners' rounds with it explained:
   a lossy link under RC loses no ping, it delays some by a transport timeout.
   With --bw, an endpoint whose pairs' median bandwidth is below BW_SHARE of its rail's
   median is named (a WARN).
6. A node all of whose endpoints (two or more) were named is named instead of them; a rail
   with at least max(3, half its endpoints) named is the rail's switch.
7. Every bad pair left is a path: the two ends are fine with everyone else.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable

from ibtool.mesh.schedule import Partners, Schedule
from ibtool.model.mesh import (
    LOCAL_ROUTE,
    Baseline,
    Culprit,
    Endpoint,
    Full,
    Health,
    Level,
    MeshResult,
    PairState,
    Verdict,
)
from ibtool.views.mesh import us

BASELINE_SAMPLE = 1 << 18
RETRANS_SHARE = 0.1  # an endpoint's round is lossy when its port resent this share of pings
SLOW_FLOOR_US = 20.0  # a pair is slow only this far above its baseline too (jitter of a us)
LOSS, SLOW, FULL = "loss", "slow", "full"
KINDS = (LOSS, FULL, SLOW)  # the order a tie between two kinds of an endpoint is named in
KIND_OF = {Health.FAILED: LOSS, Health.LOSSY: LOSS, Health.SLOW: SLOW}
BW_SHARE = 0.7  # --bw: an endpoint below this share of its rail's median is named


def baselines(result: MeshResult, schedule: Schedule) -> dict[str, Baseline]:
    """Each group's baseline, over its answered pairs, or an even sample of BASELINE_SAMPLE
    of them in a larger mesh (a median moves little between 262,144 pairs and 8 million,
    and the floats of 8 million would be half a gigabyte)."""
    t = result.pairs
    group_of = _group_of(schedule, len(result.endpoints))
    medians: dict[str, list[float]] = defaultdict(list)
    p90s: dict[str, list[float]] = defaultdict(list)
    stride = max(1, -(-len(t.dst) // BASELINE_SAMPLE))
    while math.gcd(stride, t.width) != 1:  # else a stride of 32 over 8 rails samples one
        stride += 1
    for i in range(0, len(t.dst), stride):
        if t.dst[i] >= 0 and t.state[i] == PairState.PROBED and t.received[i]:
            g = group_of[i % t.width]
            m, p = t.median[i], t.p90[i]
            if not math.isnan(m):
                medians[g].append(m)
            if not math.isnan(p):
                p90s[g].append(p)
    out = {}
    for g in schedule.groups:
        m, p = medians.get(g, []), p90s.get(g, [])
        out[g] = Baseline(
            g, len(m), statistics.median(m) if m else None, statistics.median(p) if p else None
        )
    return out


def _group_of(schedule: Schedule, width: int) -> list[str]:
    group_of = [""] * width
    for g, members in schedule.groups.items():
        for e in members:
            group_of[e] = g
    return group_of


def _limits(result: MeshResult, base: dict[str, Baseline]) -> dict[str, float]:
    factor = result.settings.slow_factor
    limit = {}
    for g, b in base.items():
        m = b.median_us
        limit[g] = math.inf if m is None else max(m * factor, m + SLOW_FLOOR_US)
    return limit


def slow_limits(result: MeshResult, schedule: Schedule) -> dict[str, float]:
    """Each group's p90 above which a pair is SLOW, on the pairs as they are now (the
    coordinator's retry asks before the analysis)."""
    return _limits(result, baselines(result, schedule))


def judge(result: MeshResult, schedule: Schedule, base: dict[str, Baseline]) -> None:
    """Fill in every pair's health (result.pairs.health)."""
    t = result.pairs
    group_of = _group_of(schedule, len(result.endpoints))
    limit = _limits(result, base)
    transient = t.transient  # lost pings a retry answered whole: a stall, not judged
    for i in t.slots():
        state = t.state[i]
        if i in transient and state == PairState.PROBED and not t.received[i]:
            h = Health.OK  # nothing answered the first time, everything the second
        elif state != PairState.PROBED or not t.received[i]:
            h = Health.FAILED
        elif t.received[i] < t.sent[i] and i not in transient:
            h = Health.LOSSY
        elif t.p90[i] > limit[group_of[i % t.width]] and i not in transient:  # NaN: False
            h = Health.SLOW
        else:
            h = Health.OK
        full = t.full[i]
        if full >= Full.LOSSY and h <= Health.SLOW:  # small pings pass, full ones do not
            h = Health.FAILED if full == Full.LOST else Health.LOSSY
        t.health[i] = h


def kind_of(t, i: int) -> str | None:
    """The kind of bad a pair is: its pings lost (LOSS), its full-payload pings lost while
    its own were all answered (FULL), slow (SLOW); None when it is fine."""
    if t.full[i] >= Full.LOSSY and t.state[i] == PairState.PROBED and t.received[i] == t.sent[i]:
        return FULL
    return KIND_OF.get(t.health[i])


class _Tally:
    """Each endpoint's live pairs (both ends up), and the bad ones by kind, per direction."""

    def __init__(self, result: MeshResult, partners: Partners, live: list[bool], aside: set[int]):
        """`aside`: slots another verdict explains, counted neither way."""
        n = len(result.endpoints)
        t = result.pairs
        self.out_total = [0] * n
        self.in_total = [0] * n
        self.bad_out: dict[str, list[set[int]]] = {k: [set() for _ in range(n)] for k in KINDS}
        self.bad_in: dict[str, list[set[int]]] = {k: [set() for _ in range(n)] for k in KINDS}
        self.partners = partners
        self.live = live
        width = t.width
        dst, health = t.dst, t.health
        full = t.full_lost  # the pairs whose full-payload pings were lost: few
        for r in range(t.rounds):
            base = r * width
            for src in range(width):
                d = dst[base + src]
                if d < 0 or not (live[src] and live[d]) or base + src in aside:
                    continue
                self.out_total[src] += 1
                self.in_total[d] += 1
                i = base + src
                kind = kind_of(t, i) if i in full else KIND_OF.get(health[i])
                if kind:
                    self.bad_out[kind][src].add(d)
                    self.bad_in[kind][d].add(src)

    def score(self, e: int, kind: str) -> int:
        """How many bad pairs of `kind` name `e`, or 0 if they do not (see the docstring)."""
        bo, bi = self.bad_out[kind][e], self.bad_in[kind][e]
        if len(bo | bi) < 2:
            return 0
        if 2 * len(bo) <= self.out_total[e] or 2 * len(bi) <= self.in_total[e]:
            return 0
        return len(bo) + len(bi)

    def remove(self, e: int) -> None:
        """`e` is explained: its pairs leave everyone's counts."""
        p = self.partners
        for r in range(p.rounds):
            d = p.of(r, e)
            if d >= 0 and self.live[d]:
                self.in_total[d] -= 1
        for r in range(p.rounds):
            s = p.by(r, e)
            if s >= 0 and self.live[s]:
                self.out_total[s] -= 1
        for kind in KINDS:
            for d in self.bad_out[kind][e]:
                self.bad_in[kind][d].discard(e)
            for s in self.bad_in[kind][e]:
                self.bad_out[kind][s].discard(e)
        self.live[e] = False
        self.out_total[e] = self.in_total[e] = 0


def analyse(result: MeshResult, schedule: Schedule) -> None:
    """Fill in result.baselines, every pair's health and result.verdicts."""
    base = baselines(result, schedule)
    result.baselines = list(base.values())
    judge(result, schedule, base)
    eps = result.endpoints
    n = len(eps)
    partners = Partners(schedule, n)
    group_of = _group_of(schedule, n)
    named: dict[int, Verdict] = {}
    for node, why in sorted(result.unreachable.items()):
        mine = tuple(i for i, e in enumerate(eps) if e.node == node)  # none, from a coordinator
        result.verdicts.append(
            Verdict(Culprit.NODE, Level.FAIL, node, f"no agent: {why}", mine, next=(_reach(node),))
        )
    result.verdicts += _odd_port_counts(result)
    result.verdicts += _drift(result)
    looped, aside = _routed_through_lo(result)
    result.verdicts += looped
    live = [e.up and e.node not in result.unreachable for e in eps]
    t = result.pairs
    for i, e in enumerate(eps):
        if not e.up:
            slots = [t.slot(r, i) for r in range(partners.rounds) if partners.of(r, i) >= 0]
            slots += [
                t.slot(r, partners.by(r, i))
                for r in range(partners.rounds)
                if partners.by(r, i) >= 0
            ]
            unprobed = sum(1 for j in slots if t.state[j] != PairState.PROBED)
            lost = "all" if unprobed == len(slots) else f"{unprobed} of"
            named[i] = Verdict(
                Culprit.ENDPOINT,
                Level.FAIL,
                e.name,
                f"{e.why_down()}: {lost} its {len(slots)} pairs not probed",
                (i,),
                e.rail,
            )
    tally = _Tally(result, partners, live, aside)
    while True:
        best = None
        for e in range(n):
            if not tally.live[e]:
                continue
            for rank, kind in enumerate(KINDS):
                s = tally.score(e, kind)
                if s and (best is None or (s, -rank) > (best[0], -best[1])):
                    best = (s, rank, e, kind)
        if best is None:
            break
        _, _, e, kind = best
        named[e] = _endpoint_verdict(result, tally, base[group_of[e]], e, kind)
        tally.remove(e)
    named.update(_retransmitting(result, partners, tally.live))
    result.verdicts += _bandwidth(result, named)
    result.verdicts += _fold(result, schedule, named)
    result.verdicts += _paths(result, named, base, group_of, aside)
    bad = set()
    for v in result.verdicts:
        if v.culprit != Culprit.PATH:
            bad.update(v.endpoints)
    result.verdicts[:] = [_with_next(eps, v, bad) for v in result.verdicts]


LOOPED = "its ports share a subnet and the kernel routes"


def _routed_through_lo(result: MeshResult) -> tuple[list[Verdict], set[int]]:
    """Pairs between two ports of one node that its agent did not probe because the kernel
    routes the one's address, from the other's, through lo (LOCAL_ROUTE): the packets would
    never leave the host, so nothing can be said of the ports or the network. One FAIL per
    node with the fix; its pairs set aside (no endpoint or path is blamed for them)."""
    t, eps = result.pairs, result.endpoints
    by_node: dict[str, list[int]] = defaultdict(list)
    for i, why in t.errors.items():
        if why.startswith(LOCAL_ROUTE) and t.state[i] == PairState.SKIPPED and t.dst[i] >= 0:
            by_node[eps[i % t.width].node].append(i)
    out, aside = [], set()
    for node, slots in sorted(by_node.items()):
        aside.update(slots)
        ends = sorted({i % t.width for i in slots} | {t.dst[i] for i in slots})
        netdevs = ", ".join(eps[e].name for e in ends)
        first = eps[slots[0] % t.width]
        out.append(
            Verdict(
                Culprit.NODE,
                Level.FAIL,
                node,
                f"{LOOPED} each one's address through lo ({netdevs}): RoCE between them "
                f"never leaves the host, {len(slots)} pairs not probed",
                tuple(ends),
                next=(
                    f"on {node}: give each port a routing table of its own: ip rule add from "
                    f"{first.address} lookup 100 priority 100; ip route add <its subnet> dev "
                    "<its netdev> table 100 (one table a port); sysctl -w "
                    "net.ipv4.conf.all.accept_local=1",
                    f"on {node}: ibtool doctor --dev {first.device}/{first.port} "
                    f"{eps[t.dst[slots[0]]].address}",
                ),
            )
        )
    return out, aside


def _odd_port_counts(result: MeshResult) -> list[Verdict]:
    """Nodes with more or fewer RDMA ports than most: rail k is a node's k-th port, so a
    missing HCA moves every later port of it onto the next rail's partners, and a port more
    (a storage NIC, a second fabric) makes a rail of its own. Named when most nodes (more
    than half, three at least) agree on a count."""
    eps = result.endpoints
    mine: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(eps):
        mine[e.node].append(i)
    if len(mine) < 3:
        return []
    usual, agree = Counter(len(v) for v in mine.values()).most_common(1)[0]
    if 2 * agree <= len(mine):
        return []
    out = []
    for node, members in mine.items():
        k = len(members)
        if k == usual:
            continue
        if result.settings.rails != "rank":  # its ports keep their rails
            what = "a missing HCA or port" if k < usual else "a port more (a storage NIC?)"
        else:
            what = (
                "a missing HCA or port moves its later ports onto other rails"
                if k < usual
                else "a port more (a storage NIC, another fabric?) is a rail of its own"
            )
        out.append(
            Verdict(
                Culprit.NODE,
                Level.WARN,
                node,
                f"{k} RDMA port{'s' * (k != 1)} where {agree} of {len(mine)} nodes have "
                f"{usual}: {what} (--dev or --exclude choose the ports meshed)",
                tuple(members),
            )
        )
    return out


# What should be alike across a rail, and how a verdict names it. The GID index is compared
# on RoCE alone (InfiniBand's is 0 everywhere): a node whose --best GID moved (an extra IPv4
# address, a VLAN) gives a job's NCCL_IB_GID_INDEX another GID there.
DRIFT = (
    ("gid_index", "GID index"),
    ("mtu", "active MTU"),
    ("rate", "rate"),
    ("fw", "firmware"),
    ("driver", "driver"),
    ("kernel", "kernel"),
    ("pfc", "PFC priorities"),
    ("trust", "DCB trust"),
)
DRIFT_MIN = 3  # endpoints of a group before a value can be "what the others have"


def _drift(result: MeshResult) -> list[Verdict]:
    """Endpoints whose GID index, active MTU, rate or firmware is not what most of their rail
    has (more than half of it, DRIFT_MIN at least), a WARN each, with the value the others
    have; a node whose every endpoint differs the same way is named as the node."""
    eps = result.endpoints
    rails: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(eps):
        rails[e.rail].append(i)
    odd: dict[int, list[tuple[str, str, object, object, int, int]]] = defaultdict(list)
    for members in rails.values():
        for attr, label in DRIFT:
            known = [
                i
                for i in members
                if getattr(eps[i], attr) is not None
                and (attr != "gid_index" or eps[i].link_layer == "Ethernet")
            ]
            if len(known) < DRIFT_MIN:
                continue
            usual, agree = Counter(getattr(eps[i], attr) for i in known).most_common(1)[0]
            if 2 * agree <= len(known):
                continue
            for i in known:
                value = getattr(eps[i], attr)
                if value != usual:
                    odd[i].append((attr, label, value, usual, agree, len(known)))
    by_node: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(eps):
        by_node[e.node].append(i)
    out = []
    for node, members in by_node.items():
        shared = None
        if len(members) >= 2 and all(i in odd for i in members):
            keys = [{(a, v) for a, _, v, *_ in odd[i]} for i in members]
            shared = set.intersection(*keys) or None
        if shared:
            said = [x for x in odd[members[0]] if (x[0], x[2]) in shared]
            why = "; ".join(
                f"{label} {value} on all its {len(members)} ports, where the others have {usual}"
                for _, label, value, usual, _, _ in said
            )
            out.append(Verdict(Culprit.NODE, Level.WARN, node, why, tuple(members)))
            for i in members:
                odd[i] = [x for x in odd[i] if (x[0], x[2]) not in shared]
        for i in members:
            if odd.get(i):
                why = "; ".join(
                    f"{label} {value} where {agree} of {n} on rail {eps[i].rail} have {usual}"
                    for _, label, value, usual, agree, n in odd[i]
                )
                out.append(
                    Verdict(Culprit.ENDPOINT, Level.WARN, eps[i].name, why, (i,), eps[i].rail)
                )
    return out


def _with_next(eps: list[Endpoint], v: Verdict, bad: set[int]) -> Verdict:
    """`v` with the doctor run to do next: against a partner no verdict names."""
    if v.next or not v.endpoints:
        return v
    if v.culprit == Culprit.PATH:
        return dataclasses.replace(v, next=_next_pair(eps, *v.endpoints))
    return dataclasses.replace(v, next=_next_for(eps, v.endpoints[0], bad))


def _retransmitting(result: MeshResult, partners: Partners, live: list[bool]) -> dict:
    """Endpoints named by their ports' RC retransmissions (a lossy link under RC loses no
    ping: the lost packets are sent again a transport timeout later, 67 ms with ibtool's QPs,
    which may hide in the RTTs of a slow fabric or a small mesh): an endpoint whose port
    retransmitted RETRANS_SHARE of the pings through it in more than half of its rounds, and
    in two at least. Its partners' ports retransmit too in the rounds they meet it (their
    ACKs or replies to it were lost): those rounds are explained once it is named. A busy
    port (one that resent while no agent pinged, before round 0: a job's traffic) is judged
    on what each round added beyond that rate."""
    t, eps = result.pairs, result.endpoints
    n, rounds = len(eps), partners.rounds
    if not len(t.retrans) or max(t.retrans) < 0:
        return {}  # no node told its counters
    if result.settings.bw:
        return {}  # the bursts fill queues: a port resends then on a healthy link
    active: list[set[int]] = [set() for _ in range(n)]
    lossy: list[set[int]] = [set() for _ in range(n)]
    counts = [0] * n
    pings = [0] * n
    for r in range(rounds):
        for e in range(n):
            if not live[e] or t.retrans[t.slot(r, e)] < 0:
                continue
            s = partners.by(r, e)
            through = 0
            for src in (e, s):
                if src >= 0 and live[src] and t.state[t.slot(r, src)] == PairState.PROBED:
                    dst = partners.of(r, src)
                    if dst >= 0 and live[dst]:
                        through += t.sent[t.slot(r, src)]
            if not through:
                continue
            active[e].add(r)
            got = t.retrans[t.slot(r, e)]
            busy = eps[e].busy
            if busy and r < len(result.round_seconds):
                # a job on the port resends at its own rate all along: only what the
                # round added beyond it is the mesh's
                got = max(0, round(got - busy * result.round_seconds[r]))
            if got >= max(2, RETRANS_SHARE * through):
                lossy[e].add(r)
                counts[e] += got
                pings[e] += through
    named = {}
    while True:
        best = max(
            (e for e in range(n) if len(lossy[e]) >= 2 and 2 * len(lossy[e]) > len(active[e])),
            key=lambda e: (len(lossy[e]), counts[e], -e),
            default=None,
        )
        if best is None:
            return named
        e = best
        share = 100.0 * counts[e] / pings[e] if pings[e] else 0.0
        named[e] = Verdict(
            Culprit.ENDPOINT,
            Level.WARN,
            eps[e].name,
            f"its port retransmitted in {len(lossy[e])} of its {len(active[e])} rounds "
            f"({counts[e]} RC retransmissions for {pings[e]} pings, {share:.0f}%; its "
            "partners only in the rounds they met it): packets lost on its link",
            (e,),
            eps[e].rail,
        )
        for r in lossy[e]:
            for slot in (
                t.slot(r, e),
                t.slot(r, partners.by(r, e)) if partners.by(r, e) >= 0 else -1,
            ):
                if slot >= 0 and t.health[slot] == Health.OK:
                    t.health[slot] = Health.SLOW
        for r in active[e]:
            for other in (partners.of(r, e), partners.by(r, e)):
                if other >= 0:
                    active[other].discard(r)
                    if r in lossy[other]:
                        lossy[other].discard(r)
        active[e], lossy[e] = set(), set()


def _endpoint_verdict(result: MeshResult, tally: _Tally, b: Baseline, e: int, kind: str):
    t, eps = result.pairs, result.endpoints
    bo, bi = tally.bad_out[kind][e], tally.bad_in[kind][e]
    partners = len(bo | bi)
    p = tally.partners
    slots = [t.slot(r, e) for r in range(p.rounds) if p.of(r, e) in bo]
    slots += [t.slot(r, p.by(r, e)) for r in range(p.rounds) if p.by(r, e) in bi]
    both = (
        f"{partners} of its partners bad both ways ({len(bo)}/{tally.out_total[e]} as client, "
        f"{len(bi)}/{tally.in_total[e]} as server)"
    )
    if kind == LOSS:
        sent = sum(t.sent[i] for i in slots)
        got = sum(t.received[i] for i in slots)
        detail = f"{got}/{sent} pings answered in those pairs" + _errors(t, slots)
        level = Level.FAIL
    elif kind == FULL:
        lost = [t.full_lost[i] for i in slots if i in t.full_lost]
        size = min((b for b, _, _ in lost), default=0)
        sent = sum(n for _, n, _ in lost)
        got = sum(a for _, _, a in lost)
        detail = (
            f"{got}/{sent} pings of the path MTU's full payload ({size} bytes) answered in "
            f"those pairs, all their {result.settings.size}-byte pings answered: an MTU below "
            f"{size} on its link (its switch port, a netdev or tunnel between)"
        )
        level = Level.FAIL
    else:
        p90 = statistics.median([t.p90[i] for i in slots]) if slots else None
        detail = f"their p90 RTT {us(p90)} against {b.group}'s median {us(b.median_us)}"
        level = Level.WARN
    return Verdict(
        Culprit.ENDPOINT,
        level,
        eps[e].name,
        f"{both}: {detail}",
        (e,),
        eps[e].rail,
    )


def _bandwidth(result: MeshResult, named: dict) -> list[Verdict]:
    """--bw: endpoints whose pairs' median bandwidth (as client and as server) is below
    BW_SHARE of their rail's median over its endpoints, a WARN each (a link trained down, a
    shaped or congested port). Endpoints already named are left to their verdict."""
    t, eps = result.pairs, result.endpoints
    if t.bw is None:
        return []
    bw = t.bw
    mine: dict[int, list[float]] = defaultdict(list)
    for i in t.slots():
        x = bw[i]
        if not math.isnan(x):
            mine[i % t.width].append(x)
            mine[t.dst[i]].append(x)
    own = {e: statistics.median(v) for e, v in mine.items()}
    rails: dict[int, list[float]] = defaultdict(list)
    for e, x in own.items():
        rails[eps[e].rail].append(x)
    out = []
    for e, x in sorted(own.items()):
        values = rails[eps[e].rail]
        if e in named or len(values) < DRIFT_MIN:
            continue
        median = statistics.median(values)
        if median > 0 and x < BW_SHARE * median:
            out.append(
                Verdict(
                    Culprit.ENDPOINT,
                    Level.WARN,
                    eps[e].name,
                    f"its pairs' RDMA WRITE bandwidth {x:.3g} Gb/s, {x / median:.2f} of rail "
                    f"{eps[e].rail}'s median {median:.3g} Gb/s over {len(values)} endpoints: "
                    "a link trained down, a shaped or congested port",
                    (e,),
                    eps[e].rail,
                )
            )
    return out


ERRORS_SHOWN = 2  # distinct errors an endpoint's verdict quotes, the most frequent first


def _errors(t, slots: list[int]) -> str:
    """What the failing pairs said, so that the verdict carries its evidence: "0/0 answered"
    alone does not tell a refused connection from a timeout or a QP that never reached RTR."""
    said = Counter(t.errors[i] for i in slots if t.errors.get(i))
    if not said:
        return ""
    parts = [f"{text} ({n} pair{'s' * (n != 1)})" for text, n in said.most_common(ERRORS_SHOWN)]
    others = len(said) - ERRORS_SHOWN
    if others > 0:
        parts.append(f"{others} other error{'s' * (others != 1)}")
    return ": " + "; ".join(parts)


def _fold(result: MeshResult, schedule: Schedule, named: dict[int, Verdict]) -> list[Verdict]:
    """Named endpoints, a whole node or a whole rail folded into one verdict."""
    eps = result.endpoints
    for i in [i for i in named if eps[i].node in result.unreachable]:
        del named[i]  # its node's verdict says it
    by_node: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(eps):
        by_node[e.node].append(i)
    out: list[Verdict] = []
    for node, members in by_node.items():
        if len(members) >= 2 and all(i in named for i in members):
            level = max(named[i].level for i in members)
            reasons = sorted(
                {
                    eps[i].why_down() if not eps[i].up else named[i].why.split(":", 1)[0]
                    for i in members
                }
            )
            out.append(
                Verdict(
                    Culprit.NODE,
                    level,
                    node,
                    f"all {len(members)} of its endpoints bad: " + "; ".join(reasons),
                    tuple(members),
                    None,
                )
            )
            for i in members:
                del named[i]
    for g, members in schedule.groups.items():
        if g == "all rails":
            continue
        bad = [i for i in members if i in named]
        if len(members) >= 3 and len(bad) >= max(3, math.ceil(len(members) / 2)):
            level = max(named[i].level for i in bad)
            # the last of a rail's endpoints are bad only with each other once the rest are
            # named: the switch explains them too, not a path of their own
            bad += _bad_among(result, [i for i in members if i not in named])
            names = ", ".join(eps[i].name for i in bad[:8]) + (" ..." if len(bad) > 8 else "")
            out.append(
                Verdict(
                    Culprit.RAIL,
                    level,
                    g,
                    f"{len(bad)} of its {len(members)} endpoints bad at once: the rail's "
                    f"switch, not its ports ({names})",
                    tuple(bad),
                    eps[bad[0]].rail,
                )
            )
            for i in bad:
                named.pop(i, None)
    out += sorted(named.values(), key=lambda v: v.endpoints)
    return out


def _bad_among(result: MeshResult, rest: list[int]) -> list[int]:
    """Those of `rest` with a bad pair between two of them."""
    t, among = result.pairs, set(rest)
    found = set()
    for r in range(t.rounds):
        for s in rest:
            i = t.slot(r, s)
            if t.dst[i] in among and t.health[i] != Health.OK:
                found.update((s, t.dst[i]))
    return sorted(found)


def _paths(result, named, base, group_of, aside: set[int]) -> list[Verdict]:
    """The bad pairs no named endpoint, node or rail explains, an unordered pair each."""
    t, eps = result.pairs, result.endpoints
    explained = set()
    for v in result.verdicts:
        if v.culprit != Culprit.NODE or not v.why.startswith(LOOPED):
            explained.update(v.endpoints)
    by_pair: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in t.slots():
        if t.health[i] == Health.OK or i in aside:
            continue
        s, d = i % t.width, t.dst[i]
        if s in explained or d in explained:
            continue
        by_pair[(min(s, d), max(s, d))].append(i)
    out = []
    for (a, b), slots in sorted(by_pair.items()):
        worst = max(Health(t.health[i]) for i in slots)
        level = Level.WARN if worst == Health.SLOW else Level.FAIL
        parts = [_direction(result, i, base[group_of[a]]) for i in sorted(slots)]
        ways = "both ways" if len({i % t.width for i in slots}) == 2 else "one way"
        out.append(
            Verdict(
                Culprit.PATH,
                level,
                f"{eps[a].name} <-> {eps[b].name}",
                f"bad {ways}, both ends fine with their other partners: " + "; ".join(parts),
                (a, b),
                eps[a].rail,
            )
        )
    return out


def _direction(result: MeshResult, i: int, b: Baseline) -> str:
    t, eps = result.pairs, result.endpoints
    s, d = i % t.width, t.dst[i]
    head = f"{eps[s].name} -> {eps[d].name}: "
    if t.state[i] != PairState.PROBED:
        return head + (t.errors.get(i) or "not probed")
    err = t.errors.get(i)
    if not t.sent[i]:
        return head + (err or "nothing sent")
    text = f"{t.received[i]}/{t.sent[i]} answered"
    if t.received[i] == t.sent[i]:
        text += f", p90 {us(t.p90[i])} against {us(b.median_us)}"
    return head + text + (f" ({err})" if err else "")


def _reach(node: str) -> str:
    return f"ssh {node} ibtool doctor --no-probe"


def _good_partner(eps: list[Endpoint], e: int, avoid: Iterable[int]) -> int | None:
    avoid = set(avoid)
    for j, other in enumerate(eps):
        if j != e and j not in avoid and other.up and other.node != eps[e].node:
            if other.rail == eps[e].rail:
                return j
    for j, other in enumerate(eps):
        if j != e and j not in avoid and other.up and other.node != eps[e].node:
            return j
    return None


def _next_for(eps: list[Endpoint], e: int, avoid: set[int]) -> tuple[str, ...]:
    """The doctor run that checks endpoint `e` against a partner that is fine."""
    g = _good_partner(eps, e, avoid)
    if g is None:
        return (f"on {eps[e].node}: ibtool doctor --no-probe --dev {eps[e].device}/{eps[e].port}",)
    return _next_pair(eps, e, g)


def _next_pair(eps: list[Endpoint], a: int, b: int) -> tuple[str, ...]:
    ea, eb = eps[a], eps[b]
    port = f" --port {eb.tcp_port}" if eb.tcp_port else ""  # a side address: its own port
    return (
        f"on {eb.node}: ibtool ping --server --dev {eb.device}/{eb.port}{port}",
        f"on {ea.node}: ibtool doctor --dev {ea.device}/{ea.port}{port} {eb.address}",
    )
