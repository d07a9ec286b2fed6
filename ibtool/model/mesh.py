"""`ibtool mesh`'s records: the endpoints, what each probed pair measured, the verdicts.

A mesh of 1,024 nodes x 8 rails probes 8,380,416 ordered pairs when every shift runs: a
record per pair would cost gigabytes, so the pairs live in a `PairTable`, columns of machine
numbers indexed by (round, source endpoint) -- each endpoint is the source of at most one pair
a round (the schedule's promise) -- and a pair is read back as a `Pair` only when asked for.

The heat map's cells are data too: `fold` gives the worst health of the pairs of each (group,
group) of endpoints or nodes, a `Fold`, which the views draw and the last mesh saves, each cell
a glyph (GLYPH).
"""

from __future__ import annotations

import enum
import math
from array import array
from collections.abc import Iterator
from dataclasses import field

from ibtool.model.deferred import dataclass
from ibtool.model.fabric.suspects import CableSuspect


class PairState(enum.IntEnum):
    """What became of one scheduled pair."""

    UNSCHEDULED = 0  # no pair for this source in this round (its group ran out of shifts)
    PROBED = 1  # pinged: sent/received/RTTs say how it went
    SKIPPED = 2  # not pinged: an end's port is not ACTIVE, or its node has no agent
    MISSING = 3  # the source's node never reported this round (it died or timed out)


# The start of a pair's error when its agent did not probe it because the kernel routes the
# partner's address, an address of the same host, through lo (analysis: one verdict a node)
LOCAL_ROUTE = "not probed: the kernel routes"


class Full(enum.IntEnum):
    """What became of a pair's pings of the path MTU's full payload (the pings of `size`
    bytes, 64 by default, pass a switch whose MTU is smaller than the ends'; these do not)."""

    NONE = 0  # not sent: turned off, or the pair's own pings were not all answered
    ANSWERED = 1
    LOSSY = 2  # some answered
    LOST = 3  # none answered


class Health(enum.IntEnum):
    """A pair's health, worst last."""

    OK = 0
    SLOW = 1  # every ping answered, the RTTs far above the group's baseline
    LOSSY = 2  # some pings unanswered
    FAILED = 3  # no ping answered, or none could be sent


@dataclass(frozen=True)
class Endpoint:
    """One RDMA port of one node: (node, port), on its rail (its rank among the node's ports)."""

    node: str
    device: str
    port: int
    rail: int
    address: str  # where its ping server listens (the IPv4 address of its netdev or IPoIB)
    state: str  # the port's state as sysfs says it: ACTIVE, DOWN, INIT, ...
    link_layer: str = "Ethernet"
    gid_index: int | None = None
    hw_timestamps: bool = False
    problem: str | None = None  # why its agent serves no pings on it (a port up but unusable)
    # what should be alike across a rail: the port's rate as sysfs says it, its device's
    # firmware, its active MTU (bytes, from verbs); None where its agent did not say
    rate: str | None = None
    fw: str | None = None
    mtu: int | None = None
    # RC retransmissions a second its port made while no agent pinged (before round 0):
    # another job's traffic; None where its agent did not say, 0.0 when quiet
    busy: float | None = None
    # more of what should be alike across a rail: its device's kernel driver, its node's
    # kernel release, and on RoCE its netdev's PFC priorities and DCB trust, where readable
    driver: str | None = None
    kernel: str | None = None
    pfc: str | None = None
    trust: str | None = None
    # its server's TCP port where it is not the mesh's (an InfiniBand port without IPoIB:
    # `address` is then its node's management address, shared by its other such ports)
    tcp_port: int | None = None
    # an InfiniBand port's LID and its node's GUID, where its agent said them: where its
    # pairs' routes begin and end in the subnet (the cable analysis, mesh/cables.py)
    lid: int | None = None
    guid: int | None = None

    @property
    def name(self) -> str:
        return f"{self.node}/{self.device}/{self.port}"

    @property
    def up(self) -> bool:
        return self.state == "ACTIVE" and self.problem is None

    def why_down(self) -> str:
        return self.problem or f"port {self.state}"


@dataclass(frozen=True)
class Pair:
    """One ordered pair's probe: `src` pinged `dst` in `round`."""

    round: int
    src: int
    dst: int
    state: PairState
    sent: int = 0
    received: int = 0
    median_us: float | None = None
    p90_us: float | None = None
    p99_us: float | None = None
    hw: bool = False  # RTTs on the HCA's clock
    error: str | None = None
    health: Health = Health.OK  # as the analysis judged it against its group's baseline
    full: Full = Full.NONE  # its pings of the path MTU's full payload
    bw_gbps: float | None = None  # its RDMA WRITE burst's bandwidth (--bw)

    @property
    def lost(self) -> int:
        return self.sent - self.received


def _opt(x: float) -> float | None:
    return None if math.isnan(x) else x


class PairTable:
    """Every pair of a mesh, by (round, source), in columns (see the module's docstring)."""

    def __init__(self, rounds: int, endpoints: int):
        self.rounds, self.width = rounds, endpoints
        n = rounds * endpoints
        self.dst = array("i", [-1]) * n
        self.state = array("B", [0]) * n
        self.sent = array("I", [0]) * n
        self.received = array("I", [0]) * n
        self.median = array("f", [math.nan]) * n
        self.p90 = array("f", [math.nan]) * n
        self.p99 = array("f", [math.nan]) * n
        self.hw = array("B", [0]) * n
        self.health = array("B", [0]) * n  # Health, filled in by the analysis
        # The retransmissions of endpoint `src`'s port during `round` (its two pairs of the
        # round: the one it pinged, the one that pinged it); -1 where its node did not say.
        self.retrans = array("i", [-1]) * n
        self.errors: dict[int, str] = {}  # slot -> why, for the few pairs that have one
        # The full-payload pings (Full), and for the pairs that lost some of them: (bytes,
        # sent, answered)
        self.full = array("B", [0]) * n
        self.full_lost: dict[int, tuple[int, int, int]] = {}
        # With --qps N: the pairs some of whose QPs lost every ping while others were
        # answered: slot -> (QPs, silent QPs)
        self.silent_qps: dict[int, tuple[int, int]] = {}
        # With --bw: each pair's RDMA WRITE bandwidth in Gb/s (NaN where not measured)
        self.bw: array | None = None
        # Pairs that lost pings and were probed again after the last round, every ping of
        # the retry answered: a stall of an end, not the network (the analysis judges them
        # on their answered pings)
        self.transient: set[int] = set()

    def extras(self, round_: int, src: int, extra: dict) -> None:
        """What a pair measured beyond its pings (the `x` of a result's pair, checked)."""
        i = round_ * self.width + src
        full = extra.get("full")
        if full is not None:
            size, sent, got = full
            self.full[i] = Full.ANSWERED if got == sent else Full.LOST if not got else Full.LOSSY
            if got < sent:
                self.full_lost[i] = (size, sent, got)
        qps = extra.get("qps")
        if qps is not None and qps[1]:
            self.silent_qps[i] = qps
        bw = extra.get("bw")
        if bw is not None:
            if self.bw is None:
                self.bw = array("f", [math.nan]) * len(self.dst)
            self.bw[i] = bw

    def slot(self, round_: int, src: int) -> int:
        return round_ * self.width + src

    def schedule(self, round_: int, src: int, dst: int) -> None:
        self.dst[self.slot(round_, src)] = dst

    def put(self, pair: Pair) -> None:
        self.record(pair.round, pair.src, pair.dst, pair.state, pair.sent, pair.received,
                    pair.median_us, pair.p90_us, pair.p99_us, pair.hw, pair.error)  # fmt: skip

    def record(self, round_: int, src: int, dst: int, state: int, sent: int, received: int,
               median: float | None, p90: float | None, p99: float | None, hw: bool,
               error: str | None) -> None:  # fmt: skip
        """`put` without a Pair: what the coordinator does 8.4 million times a large mesh."""
        i = round_ * self.width + src
        self.dst[i], self.state[i] = dst, state
        self.sent[i], self.received[i] = sent, received
        self.median[i] = math.nan if median is None else median
        self.p90[i] = math.nan if p90 is None else p90
        self.p99[i] = math.nan if p99 is None else p99
        self.hw[i] = hw
        if error:
            self.errors[i] = error
        elif self.errors:
            self.errors.pop(i, None)

    def get(self, i: int) -> Pair:
        round_, src = divmod(i, self.width)
        return Pair(
            round_,
            src,
            self.dst[i],
            PairState(self.state[i]),
            self.sent[i],
            self.received[i],
            _opt(self.median[i]),
            _opt(self.p90[i]),
            _opt(self.p99[i]),
            bool(self.hw[i]),
            self.errors.get(i),
            Health(self.health[i]),
            Full(self.full[i]),
            None if self.bw is None else _opt(self.bw[i]),
        )

    def slots(self) -> Iterator[int]:
        """The slots holding a scheduled pair, in (round, source) order."""
        dst = self.dst
        for i in range(len(dst)):
            if dst[i] >= 0:
                yield i

    def __iter__(self) -> Iterator[Pair]:
        return (self.get(i) for i in self.slots())

    def __len__(self) -> int:
        return sum(1 for d in self.dst if d >= 0)


class Level(enum.IntEnum):
    """A verdict's weight, and the mesh's exit code by the worst one (ibtool-mesh(8))."""

    WARN = 1
    FAIL = 2


class Culprit(str, enum.Enum):
    """What a verdict names."""

    NODE = "node"  # a node: no agent, or every one of its endpoints bad
    RAIL = "rail"  # most of a rail's endpoints bad at once: the rail's switch
    ENDPOINT = "endpoint"  # one port: its port, cable or node
    PATH = "path"  # one pair alone: the path between its two ends
    CABLE = "cable"  # a cable of the subnet common to the failing paths (InfiniBand)


UNKNOWN_EXIT = 3  # no verdict and no pair probed: the Nagios plugins' UNKNOWN


@dataclass(frozen=True)
class Verdict:
    culprit: Culprit
    level: Level
    subject: str  # what is named: a node, "rail 3", an endpoint's name, "a <-> b"
    why: str  # how many of its pairs, against what baseline
    endpoints: tuple[int, ...] = ()  # the endpoints it names (a path: its two ends)
    rail: int | None = None
    next: tuple[str, ...] = ()  # the commands to run next (ibtool doctor)
    cable: CableFinding | None = None  # a cable's verdict: what named it


@dataclass(frozen=True)
class CounterOver:
    """An error counter of a cable's end over its threshold (or saturated)."""

    end: str  # the end's name, `leaf03/19`
    counter: str  # its name as ibqueryerrors says it (SymbolErrorCounter)
    value: int
    threshold: int
    saturated: bool = False


@dataclass(frozen=True)
class CableFinding:
    """What named a cable: the paths through it (CableSuspect, ibtool.model.fabric.suspects),
    how many pairs its walked paths were taken from, the local port the subnet was walked
    through, its ends' error counters over their thresholds (`unread`: the ends whose
    counters did not answer, named), and the other verdicts it explains."""

    suspect: CableSuspect
    via: str
    failing_total: int
    passing_total: int
    errors: tuple[CounterOver, ...] = ()
    unread: tuple[str, ...] = ()
    # the endpoints named by a verdict of their own every failing pair of which crosses it,
    # and the paths (two endpoints' names) whose verdicts it takes the place of
    endpoints: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    estimated: bool = False  # passing_total estimated from its sample (mesh/cables.py)


@dataclass(frozen=True)
class Baseline:
    """A group's typical pair: the median of its answered pairs' medians and p90s."""

    group: str  # "rail 0", or "all rails"
    pairs: int  # answered pairs it was taken over
    median_us: float | None
    p90_us: float | None


@dataclass(frozen=True)
class Settings:
    """How the mesh ran."""

    count: int
    size: int
    mode: str
    rate: float  # pings per second per endpoint, at most
    timeout: float
    all_rails: bool
    slow_factor: float
    tcp_port: int
    engine: str  # clustershell, srun, local, or a fake one in tests
    # the path the pairs' QPs take, as a job's would (ladder.PathSpec): service level, GRH
    # traffic class, P_Key table slot; the GID index every RoCE endpoint uses (None: --best)
    sl: int = 0
    tclass: int = 0
    pkey_index: int = 0
    gid_index: int | None = None
    full_payload: int = 3  # pings of the path MTU's full payload a pair, after its own
    qps: int = 1  # QPs a pair's pings are spread over (each its own UDP source port)
    bw: bool = False  # an RDMA WRITE burst a pair, its bandwidth measured
    rails: str = "rank"  # what the rails are keyed by: rank, subnet or map (mesh.rails)


@dataclass
class MeshResult:
    settings: Settings
    endpoints: list[Endpoint]
    pairs: PairTable
    rounds: int
    shifts: dict[str, list[int]]  # group -> its shifts, in round order
    unreachable: dict[str, str] = field(default_factory=dict)  # node -> why it has no agent
    baselines: list[Baseline] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    started: float = 0.0  # wall clock (time.time) when the mesh began
    elapsed: float = 0.0  # seconds of the whole mesh
    round_seconds: list[float] = field(default_factory=list)  # each round's duration
    stopped: str | None = None  # why the rounds stopped before the last (--deadline)
    retried: tuple[int, int] = (0, 0)  # pairs that lost pings retried, of them answered whole

    @property
    def worst(self) -> Level | None:
        return max((v.level for v in self.verdicts), default=None)

    def probed(self) -> int:
        """How many pairs were probed."""
        state = self.pairs.state
        return sum(1 for i in self.pairs.slots() if state[i] == PairState.PROBED)

    def exit_code(self) -> int:
        """0 healthy, 1 a WARN verdict at worst, 2 a FAIL verdict (as ibtool doctor); 3
        (UNKNOWN, as a Nagios plugin says it) when there is no verdict because no pair was
        probed: a mesh that tested nothing is not a healthy one."""
        worst = self.worst
        if worst is None:
            return 0 if self.probed() else UNKNOWN_EXIT
        return int(worst)


# A cell of the heat map: a pair's Health, or no pair probed in it, or an endpoint (or node)
# against itself; each a glyph, as the last mesh's file writes the map (mesh/last.py)
NONE, SELF = -1, -2
GLYPH = {
    Health.OK: ".",
    Health.SLOW: "s",
    Health.LOSSY: "l",
    Health.FAILED: "X",
    NONE: " ",
    SELF: "\\",
}
CODE = {g: c for c, g in GLYPH.items()}  # a glyph back to its cell


# -- the heat map's cells, as the mesh folds them and the last mesh saves them -------------


@dataclass(frozen=True)
class Fold:
    """The heat map's cells: `labels[k]` names row k and column k; `cells[a][b]` is the worst
    Health of the pairs from group a to group b, NONE or SELF."""

    unit: str  # "endpoint", "node", or "nodes" (bins of `per_cell` nodes)
    per_cell: int  # nodes a cell covers (1 but for bins)
    labels: tuple[str, ...]
    cells: tuple[tuple[int, ...], ...]
    total: int  # the endpoints, or the nodes, folded

    def rows(self) -> list[str]:
        """The cells as glyphs, a string a row."""
        return ["".join(GLYPH[c] for c in row) for row in self.cells]


def short_names(result: MeshResult) -> list[str]:
    """The endpoints' names, the port left out when every endpoint's is the same."""
    eps = result.endpoints
    one_port = len({e.port for e in eps}) <= 1
    return [f"{e.node}/{e.device}" if one_port else e.name for e in eps]


def nodes_of(result: MeshResult) -> list[str]:
    """The nodes in the mesh's order (first appearance)."""
    return list(dict.fromkeys(e.node for e in result.endpoints))


def _endpoint_order(result: MeshResult) -> list[int]:
    """Rail by rail when only rails meet (each rail a block on the diagonal), else as meshed."""
    eps = result.endpoints
    if result.settings.all_rails:
        return list(range(len(eps)))
    return sorted(range(len(eps)), key=lambda i: (eps[i].rail, i))


def fold(result: MeshResult, max_cells: int) -> Fold:
    """The heat map's cells, at most `max_cells` a side: an endpoint a cell if they fit, else
    a node a cell, else bins of equal numbers of nodes (the last one may hold fewer)."""
    max_cells = max(1, max_cells)
    eps = result.endpoints
    n = len(eps)
    if n <= max_cells:
        order = _endpoint_order(result)
        group = [0] * n
        for k, i in enumerate(order):
            group[i] = k
        names = short_names(result)
        return _fill(result, "endpoint", 1, tuple(names[i] for i in order), group, n)
    nodes = nodes_of(result)
    index = {node: k for k, node in enumerate(nodes)}
    per = 1 if len(nodes) <= max_cells else math.ceil(len(nodes) / max_cells)
    group = [index[e.node] // per for e in eps]
    labels = tuple(nodes[k] for k in range(0, len(nodes), per))
    return _fill(result, "node" if per == 1 else "nodes", per, labels, group, len(nodes))


def _fill(result, unit, per, labels, group, total) -> Fold:
    g = len(labels)
    worst = bytearray(g * g)  # 0: no pair, else Health + 1
    t = result.pairs
    width, dst, health = t.width, t.dst, t.health
    for r in range(t.rounds):
        base = r * width
        for src in range(width):
            d = dst[base + src]
            if d < 0:
                continue
            cell = group[src] * g + group[d]
            h = health[base + src] + 1
            if h > worst[cell]:
                worst[cell] = h
    cells = []
    for a in range(g):
        row = []
        for b in range(g):
            w = worst[a * g + b]
            row.append(Health(w - 1) if w else (SELF if a == b else NONE))
        cells.append(tuple(row))
    return Fold(unit, per, labels, tuple(cells), total)


def refold(f: Fold, max_cells: int) -> Fold:
    """`f` folded further to at most `max_cells` a side: k consecutive cells into one, the
    worst of them (self only where every cell was)."""
    g = len(f.labels)
    if g <= max_cells:
        return f
    k = math.ceil(g / max(1, max_cells))
    groups = [list(range(a, min(g, a + k))) for a in range(0, g, k)]
    cells = []
    for ga in groups:
        row = []
        for gb in groups:
            got = [f.cells[a][b] for a in ga for b in gb]
            health = [c for c in got if c >= 0]
            if health:
                row.append(Health(max(health)))
            elif ga is gb and SELF in got:
                row.append(SELF)
            else:
                row.append(NONE)
        cells.append(tuple(row))
    unit = f.unit if f.unit == "nodes" else ("nodes" if f.unit == "node" else "endpoints")
    return Fold(
        unit, f.per_cell * k, tuple(f.labels[ga[0]] for ga in groups), tuple(cells), f.total
    )
