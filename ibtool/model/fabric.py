"""The InfiniBand fabric as discovered: its nodes (switches, channel adapters, routers), their
ports and the links between them; pure data, decoded from the SMPs by ibtool.sources.mad.

The numbers are the IBTA's (InfiniBand Architecture Specification vol. 1, release 1.5, 14.2.5:
NodeInfo 14.2.5.3, PortInfo 14.2.5.6): NodeType 1 channel adapter, 2 switch, 3 router;
LinkWidth bits 1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X, 16 = 2X; LinkSpeed bits 1 = SDR, 2 = DDR,
4 = QDR; LinkSpeedExt bits 1 = FDR, 2 = EDR, 4 = HDR, 8 = NDR; LinkSpeedExt2 bit 1 = XDR.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from ibtool.model.health import Status
from ibtool.model.records import PhysState, PortState


class NodeType(enum.IntEnum):
    CA = 1
    SWITCH = 2
    ROUTER = 3

    @property
    def label(self) -> str:
        return {1: "CA", 2: "SW", 3: "RT"}[self.value]


WIDTHS = {1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}
WIDTH_LANES = {1: 1, 2: 4, 4: 8, 8: 12, 16: 2}
SPEEDS = {1: "SDR", 2: "DDR", 4: "QDR"}  # PortInfo.LinkSpeed*
SPEEDS_EXT = {1: "FDR", 2: "EDR", 4: "HDR", 8: "NDR"}  # PortInfo.LinkSpeedExt*
SPEEDS_EXT2 = {1: "XDR"}  # PortInfo.LinkSpeedExt2* (IBTA 1.7)
# Gb/s a lane signals at (iblinkinfo's figures: infiniband-diags, ibdiag_common.c)
LANE_GBPS = {
    "SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR": 14.0625, "EDR": 25.78125, "HDR": 53.125,
    "NDR": 106.25, "XDR": 212.5,
}  # fmt: skip
IS_SM = 1 << 1  # PortInfo.CapabilityMask bit 1 (IBTA 14.2.5.6, table 153)
SPEED_ORDER = ("SDR", "DDR", "QDR", "FDR", "EDR", "HDR", "NDR", "XDR")


def width_name(bits: int) -> str | None:
    """The active width (one bit set) by name; None for 0 (down) or a value out of the table."""
    return WIDTHS.get(bits)


def names_of(bits: int, table: dict[int, str]) -> tuple[str, ...]:
    """Every name whose bit is set in `bits` (enabled or supported masks)."""
    return tuple(name for bit, name in table.items() if bits & bit)


@dataclass(frozen=True)
class PortSpeed:
    """A port's speed fields as PortInfo has them (the masks raw)."""

    active: int = 0
    enabled: int = 0
    supported: int = 0
    ext_active: int = 0
    ext_enabled: int = 0
    ext_supported: int = 0
    ext2_active: int = 0
    ext2_enabled: int = 0
    ext2_supported: int = 0

    def active_name(self) -> str | None:
        """The speed the link runs at: an extended speed where one is active (it overrides
        LinkSpeedActive, IBTA 14.2.5.6), else the base one."""
        if self.ext2_active:
            return SPEEDS_EXT2.get(self.ext2_active)
        if self.ext_active:
            return SPEEDS_EXT.get(self.ext_active)
        return SPEEDS.get(self.active)

    def enabled_names(self) -> tuple[str, ...]:
        return (
            names_of(self.enabled, SPEEDS)
            + names_of(self.ext_enabled, SPEEDS_EXT)
            + names_of(self.ext2_enabled, SPEEDS_EXT2)
        )

    def supported_names(self) -> tuple[str, ...]:
        return (
            names_of(self.supported, SPEEDS)
            + names_of(self.ext_supported, SPEEDS_EXT)
            + names_of(self.ext2_supported, SPEEDS_EXT2)
        )


@dataclass(frozen=True)
class FabricPort:
    """One port of a node, as its PortInfo says, and what is cabled to it."""

    number: int
    guid: int
    lid: int  # a switch's external ports answer with port 0's LID
    lmc: int
    state: PortState | None
    phys_state: PhysState | None
    width_active: int = 0
    width_enabled: int = 0
    width_supported: int = 0
    speed: PortSpeed = field(default_factory=PortSpeed)
    remote: tuple[int, int] | None = None  # (node GUID, port number) at the cable's far end
    ext_number: int = 0  # the port's number on the front panel, where the switch gives one
    cap_mask: int = 0  # PortInfo.CapabilityMask (a switch's: its port 0's)

    @property
    def is_sm(self) -> bool:
        """A subnet manager runs behind this port (CapabilityMask.IsSM, IBTA 14.2.5.6)."""
        return bool(self.cap_mask & IS_SM)

    @property
    def width(self) -> str | None:
        return width_name(self.width_active)


@dataclass(frozen=True)
class FabricNode:
    guid: int
    type: NodeType
    description: str
    port_count: int
    ports: dict[int, FabricPort]  # by number; a switch's port 0 (its management port) too
    system_guid: int = 0
    vendor_id: int = 0
    device_id: int = 0

    @property
    def lid(self) -> int:
        """A switch's LID (its port 0's), or a CA's or router's first port with one."""
        if self.type == NodeType.SWITCH:
            p0 = self.ports.get(0)
            return p0.lid if p0 else 0
        return next((p.lid for _, p in sorted(self.ports.items()) if p.lid), 0)


@dataclass(frozen=True)
class LinkEnd:
    node: FabricNode
    port: FabricPort

    @property
    def lid(self) -> int:
        return self.port.lid or self.node.lid


@dataclass(frozen=True)
class Link:
    """A cable: its two ends, the one that sorts first (by node GUID, then port) as `a`."""

    a: LinkEnd
    b: LinkEnd


@dataclass(frozen=True)
class Bounds:
    """How a scan is bounded: SMPs outstanding at once, each one's timeout and retries, and
    the hops it goes (libibnetdisc's ibnd_config; 0: the library's own limit, 64)."""

    max_smps: int = 2  # libibnetdisc's default
    timeout_ms: int = 200
    retries: int = 3
    max_hops: int = 0


@dataclass
class Fabric:
    """A subnet as one scan found it, from the port it was scanned through."""

    nodes: dict[int, FabricNode]  # by node GUID
    local: tuple[int, int]  # (node GUID, port) the scan went out from
    ca: str = ""  # the local device and port it used
    ca_port: int = 0
    mads: int = 0  # SMPs the scan used
    max_hops: int = 0
    unanswered: tuple[str, ...] = ()  # what did not answer, named

    def links(self) -> list[Link]:
        """Every cable once, in order of its first end (node GUID, port)."""
        found = []
        for guid in sorted(self.nodes):
            node = self.nodes[guid]
            for number in sorted(node.ports):
                port = node.ports[number]
                if port.remote is None or (guid, number) > port.remote:
                    continue
                far = self.nodes.get(port.remote[0])
                far_port = far.ports.get(port.remote[1]) if far else None
                if far is None or far_port is None:
                    continue
                found.append(Link(LinkEnd(node, port), LinkEnd(far, far_port)))
        return found

    def by_type(self, kind: NodeType) -> list[FabricNode]:
        return [n for n in self.nodes.values() if n.type == kind]

    def counter_ports(self) -> list[tuple[FabricNode, int, int]]:
        """(node, port, LID) of every port whose counters ibqueryerrors reads: each external
        port of a switch, through the switch's LID, and each port of a channel adapter or
        router with a LID of its own; by node GUID, then port."""
        found = []
        for guid in sorted(self.nodes):
            node = self.nodes[guid]
            if node.type == NodeType.SWITCH:
                found += [(node, p, node.lid) for p in range(1, node.port_count + 1)]
            else:
                found += [(node, n, p.lid) for n, p in sorted(node.ports.items()) if p.lid]
        return found

    def far_end(self, guid: int, port: int) -> tuple[FabricNode, FabricPort] | None:
        """The node and port at the other end of a port's cable, where it has one."""
        node = self.nodes.get(guid)
        near = node.ports.get(port) if node else None
        if near is None or near.remote is None:
            return None
        far = self.nodes.get(near.remote[0])
        far_port = far.ports.get(near.remote[1]) if far else None
        return (far, far_port) if far is not None and far_port is not None else None


# -- each link against what its ends enable and its tier's norm ----------------------------------


def widest(bits: int) -> str | None:
    """The width of most lanes among the bits of a LinkWidth mask (enabled or supported)."""
    named = [WIDTHS[b] for b in WIDTHS if bits & b]
    return max(named, key=_lanes, default=None)


def _lanes(width: str) -> int:
    return {name: WIDTH_LANES[bit] for bit, name in WIDTHS.items()}[width]


def fastest(names) -> str | None:
    """The fastest of speed names (enabled or supported ones)."""
    return max(names, key=SPEED_ORDER.index, default=None)


def gbps(width: str | None, speed: str | None) -> float:
    """A link's signalling rate in Gb/s (lanes times a lane's rate), 0 where it has none."""
    if width is None or speed is None:
        return 0.0
    return _lanes(width) * LANE_GBPS[speed]


def _enabled_width(p: FabricPort) -> int:
    # A port reports its enabled widths; where it says what it supports too, only those count
    # (IBTA 14.2.5.6: LinkWidthEnabled may be set to values the port cannot do), unless that
    # leaves none (a port that reports its supported widths wrong).
    return (p.width_enabled & p.width_supported) or p.width_enabled


def _enabled_speeds(p: FabricPort) -> set[str]:
    enabled = set(p.speed.enabled_names())
    return (enabled & set(p.speed.supported_names())) or enabled


TIERS = {
    frozenset({NodeType.SWITCH}): "switch-to-switch",
    frozenset({NodeType.SWITCH, NodeType.CA}): "switch-to-CA",
    frozenset({NodeType.CA}): "CA-to-CA",
    frozenset({NodeType.SWITCH, NodeType.ROUTER}): "switch-to-router",
    frozenset({NodeType.ROUTER, NodeType.CA}): "router-to-CA",
    frozenset({NodeType.ROUTER}): "router-to-router",
}


def tier(link: Link) -> str:
    """Which kind of cable: switch-to-switch (an uplink), switch-to-CA (a node's), ..."""
    return TIERS[frozenset({link.a.node.type, link.b.node.type})]


def up(link: Link) -> bool:
    """Both ends have trained (state INIT, ARMED or ACTIVE)."""
    return all(
        e.port.state is not None and e.port.state >= PortState.INIT for e in (link.a, link.b)
    )


@dataclass(frozen=True)
class Norm:
    """What most up links of a tier run at, and how many do of how many."""

    width: str
    speed: str
    count: int
    of: int

    @property
    def gbps(self) -> float:
        return gbps(self.width, self.speed)


# A tier of fewer links has no norm to speak of: two links that differ say nothing of which
# one is right.
NORM_MIN_LINKS = 3


def norms(links: list[Link]) -> dict[str, Norm]:
    """Each tier's norm: the width and speed most of its up links run at (a tie goes to the
    faster), where the tier has NORM_MIN_LINKS up links or more."""
    seen: dict[str, dict[tuple[str, str], int]] = {}
    for lk in links:
        width, speed = lk.a.port.width, lk.a.port.speed.active_name()
        if not up(lk) or width is None or speed is None:
            continue
        counts = seen.setdefault(tier(lk), {})
        counts[width, speed] = counts.get((width, speed), 0) + 1
    found = {}
    for name, counts in seen.items():
        total = sum(counts.values())
        if total < NORM_MIN_LINKS:
            continue
        (width, speed), n = max(counts.items(), key=lambda kv: (kv[1], gbps(*kv[0])))
        found[name] = Norm(width, speed, n, total)
    return found


@dataclass(frozen=True)
class LinkFinding:
    """Something wrong with one link: `kind` for programs (width_degraded, speed_degraded,
    width_enabled_below, speed_enabled_below, below_norm), `what` and `fix` for a person;
    `end` is the end at fault where one is (0: a, 1: b), else None."""

    link: Link
    status: Status
    kind: str
    what: str
    fix: str
    end: int | None = None


def _name(e: LinkEnd) -> str:
    return f"{e.node.description}/{e.port.number}"


def judge(link: Link, norm: Norm | None) -> list[LinkFinding]:
    """What is wrong with one up link, worst first:

    - CRITICAL, degraded: it trained at a narrower width or a slower speed than both of its
      ends enable: a lane that did not train, a cable or transceiver failing or not rated for
      the speed (what iblinkinfo's "Could be" shows, against what is enabled, not only
      supported);
    - WARNING, enabled below: one end enables less than it supports and the other end
      enables, so the link runs at that end's setting;
    - WARNING, below its tier's norm: slower than what most links of its kind run at, with
      neither of the above to explain it (older hardware, or both ends set low alike)."""
    if not up(link):
        return []
    ends = (link.a, link.b)
    width, speed = link.a.port.width, link.a.port.speed.active_name()
    found: list[LinkFinding] = []
    both_width = widest(_enabled_width(link.a.port) & _enabled_width(link.b.port))
    if width and both_width and _lanes(width) < _lanes(both_width):
        found.append(LinkFinding(
            link, Status.CRITICAL, "width_degraded",
            f"trained at {width} though both ends enable {both_width}",
            "a lane did not train: reseat the cable at both ends, then replace it (or its "
            "transceivers) if it trains narrow again",
        ))  # fmt: skip
    both_speed = fastest(_enabled_speeds(link.a.port) & _enabled_speeds(link.b.port))
    if speed and both_speed and SPEED_ORDER.index(speed) < SPEED_ORDER.index(both_speed):
        found.append(LinkFinding(
            link, Status.CRITICAL, "speed_degraded",
            f"runs at {speed} though both ends enable {both_speed}",
            f"the cable or a transceiver is failing or not rated for {both_speed}: reseat it, "
            "then replace it",
        ))  # fmt: skip
    for i, (this, other) in enumerate((ends, ends[::-1])):
        mine = widest(_enabled_width(this.port))
        could = widest(this.port.width_supported & _enabled_width(other.port))
        seen_width = any(f.kind.startswith("width") for f in found)
        if mine and could and _lanes(mine) < _lanes(could) and not seen_width:
            found.append(LinkFinding(
                link, Status.WARNING, "width_enabled_below",
                f"{_name(this)} enables at most {mine}; it supports {could} and "
                f"{_name(other)} enables it",
                f"enable {could} on {_name(this)} (ibportstate's width, or the SM's or "
                "firmware's setting for that port), then retrain it",
                i,
            ))  # fmt: skip
        mine_s = fastest(_enabled_speeds(this.port))
        could_s = fastest(set(this.port.speed.supported_names()) & _enabled_speeds(other.port))
        if mine_s and could_s and SPEED_ORDER.index(mine_s) < SPEED_ORDER.index(could_s):
            if not any(f.kind.startswith("speed") for f in found):
                found.append(LinkFinding(
                    link, Status.WARNING, "speed_enabled_below",
                    f"{_name(this)} enables at most {mine_s}; it supports {could_s} and "
                    f"{_name(other)} enables it",
                    f"enable {could_s} on {_name(this)} (ibportstate's speed, or the SM's or "
                    "firmware's setting for that port), then retrain it",
                    i,
                ))  # fmt: skip
    if not found and norm is not None and gbps(width, speed) < norm.gbps:
        limits = []
        for e in ends:
            w, s = widest(_enabled_width(e.port)), fastest(_enabled_speeds(e.port))
            limits.append(f"{_name(e)} enables at most {w or '?'} {s or '?'}")
        can_width = widest(link.a.port.width_supported & link.b.port.width_supported)
        can_speed = fastest(
            set(link.a.port.speed.supported_names()) & set(link.b.port.speed.supported_names())
        )
        if gbps(can_width, can_speed) >= norm.gbps:
            fix = (
                f"both ends support {norm.width} {norm.speed}: enable it on both (ibportstate's "
                "width and speed, or the SM's or firmware's setting for those ports) and "
                "retrain the link"
            )
        else:
            fix = (
                f"together the two ends support at most {can_width or '?'} {can_speed or '?'}: "
                "the hardware at one end is older than the rest of its tier"
            )
        found.append(LinkFinding(
            link, Status.WARNING, "below_norm",
            f"{width} {speed}, below the {norm.width} {norm.speed} of {norm.count} of "
            f"{norm.of} {tier(link)} links ({'; '.join(limits)})",
            fix,
        ))  # fmt: skip
    return found


def judge_links(links: list[Link]) -> tuple[dict[str, Norm], list[LinkFinding]]:
    """Every link judged (judge) against its tier's norm: the norms, and the findings."""
    found_norms = norms(links)
    findings = []
    for lk in links:
        findings += judge(lk, found_norms.get(tier(lk)))
    return found_norms, findings


# -- `ibtool fabric errors`: the ports' PMA error counters against thresholds -------------------

# The error counters ibqueryerrors checks (infiniband-diags' ibqueryerrors.c: PortCounters'
# SymbolErrorCounter to VL15Dropped, then PortXmitWait), by the names its error_thresholds
# file uses. PortXmitWait counts congestion, not errors: checked only where a threshold names
# it (ibqueryerrors checks it against 0 unless told `-s PortXmitWait`).
ERROR_COUNTERS = (
    "SymbolErrorCounter",
    "LinkErrorRecoveryCounter",
    "LinkDownedCounter",
    "PortRcvErrors",
    "PortRcvRemotePhysicalErrors",
    "PortRcvSwitchRelayErrors",
    "PortXmitDiscards",
    "PortXmitConstraintErrors",
    "PortRcvConstraintErrors",
    "LocalLinkIntegrityErrors",
    "ExcessiveBufferOverrunErrors",
    "VL15Dropped",
    "PortXmitWait",
)
CONGESTION = "PortXmitWait"
# What each counts, for the fix (IBTA vol. 1, 16.1.3.5)
ERROR_FIXES = {
    "SymbolErrorCounter": "bit errors on the wire: reseat or replace the cable (or its "
    "transceivers), cleaning the connectors",
    "LinkErrorRecoveryCounter": "the link retrained: reseat or replace the cable",
    "LinkDownedCounter": "the link went down: a cable pulled or failing, a node rebooted",
    "PortRcvErrors": "bad packets received (CRC, length): the cable or the far end's port",
    "PortRcvRemotePhysicalErrors": "packets marked bad upstream: look at the links before this "
    "one on the path",
    "PortRcvSwitchRelayErrors": "packets this switch could not forward (a route to a missing "
    "LID): the SM's routing",
    "PortXmitDiscards": "packets dropped on the way out: congestion or a link down on the "
    "path (timeouts at the head of a queue)",
    "PortXmitConstraintErrors": "packets not sent for a partition or rate constraint: the "
    "SM's partitions",
    "PortRcvConstraintErrors": "packets refused for a partition or rate constraint: the "
    "SM's partitions",
    "LocalLinkIntegrityErrors": "the link's error rate crossed its local threshold: the cable",
    "ExcessiveBufferOverrunErrors": "receive buffers overrun: flow control on this link",
    "VL15Dropped": "subnet management packets dropped: an SM sweeping too hard, or a busy "
    "switch CPU",
    "PortXmitWait": "time the port had data and no credits to send it: congestion",
}
THRESHOLDS_FILE = "/etc/infiniband-diags/error_thresholds"  # ibqueryerrors' own
THRESHOLDS_MAX = 64 << 10


def parse_thresholds(text: str, where: str) -> dict[str, int]:
    """infiniband-diags' error_thresholds format: `Name=value` a line (value as C's strtoul
    reads it in base 0: decimal, 0x hex, 0 octal), '#' comments. ValueError naming the line
    for a name it does not check or a value that is not a number."""
    found: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, value = (part.strip() for part in line.partition("="))
        if not sep or name not in ERROR_COUNTERS:
            known = ", ".join(ERROR_COUNTERS)
            raise ValueError(f"{where}:{number}: {name!r} is not an error counter ({known})")
        try:
            found[name] = _strtoul(value)
        except ValueError:
            raise ValueError(f"{where}:{number}: {value!r} is not a number") from None
    return found


def _strtoul(text: str) -> int:
    t = text.lower()
    if t.startswith("0x"):
        v = int(t[2:], 16)
    elif len(t) > 1 and t.startswith("0"):
        v = int(t[1:], 8)
    else:
        v = int(t, 10)
    if v < 0 or v >= 1 << 64:
        raise ValueError(text)
    return v


@dataclass(frozen=True)
class PortCounters:
    """One port's PMA counters as it answered: by name, each with the width in bits it
    saturates at (64 for PortCountersExtended's)."""

    node: int  # node GUID
    port: int
    lid: int
    values: dict[str, int]
    bits: dict[str, int]

    def saturated(self, name: str) -> bool:
        return self.values.get(name) == (1 << self.bits.get(name, 64)) - 1


@dataclass(frozen=True)
class CountersRead:
    """What a read of a fabric's port counters gave: the ports read, what did not answer
    (named), and the switches left to the sum of their ports (node, how many ports) because
    the sum held nothing to look at."""

    counters: list[PortCounters]
    unanswered: list[str]
    summed: list[tuple[FabricNode, int]] = field(default_factory=list)


@dataclass(frozen=True)
class CounterFinding:
    """A port's error counter over its threshold (or saturated), with its growth since the
    last run where one is known (None: no baseline, or the counter was cleared since)."""

    counters: PortCounters
    name: str
    value: int
    threshold: int
    delta: int | None
    status: Status
    saturated: bool = False


def judge_counters(
    ports: list[PortCounters],
    thresholds: dict[str, int],
    before: dict[tuple[int, int], dict[str, int]] | None,
) -> list[CounterFinding]:
    """Each error counter above its threshold, as ibqueryerrors lists them (value > threshold;
    0 where the file names none; PortXmitWait only where it is named). With the counters of
    the last run (`before`), one that has not grown since is listed, OK: it is old news until
    cleared (perfquery -R); one that grew, or has no baseline (a new port, a cleared counter),
    is a WARNING, as is a counter saturated at its maximum, which counts no more."""
    found = []
    for pc in ports:
        old = before.get((pc.node, pc.port)) if before is not None else None
        for name in ERROR_COUNTERS:
            if name == CONGESTION and name not in thresholds:
                continue
            value = pc.values.get(name)
            if value is None:
                continue
            limit = thresholds.get(name, 0)
            saturated = pc.saturated(name)
            if value <= limit and not saturated:
                continue
            delta = None
            if old is not None and isinstance(old.get(name), int) and old[name] <= value:
                delta = value - old[name]
            status = Status.OK if delta == 0 and not saturated else Status.WARNING
            found.append(CounterFinding(pc, name, value, limit, delta, status, saturated))
    return found


# -- `ibtool fabric sm`: the subnet managers ------------------------------------------------------


class SmState(enum.IntEnum):
    """SMInfo.SMState (IBTA 14.2.5.13)."""

    NOT_ACTIVE = 0
    DISCOVERING = 1
    STANDBY = 2
    MASTER = 3


@dataclass(frozen=True)
class SubnetManager:
    """One SM as its SMInfo answers, and the node and port it runs behind."""

    node: FabricNode
    port: int
    lid: int
    guid: int  # SMInfo.GUID: the SM's port GUID
    priority: int
    state: SmState | None
    activity: int  # SMInfo.ActCount at the first read


@dataclass(frozen=True)
class SmScan:
    """The SMs of a subnet as their SMInfo answered: those that did (`sms`), those whose port
    says one runs and did not (`silent`: node, port, LID), this port's SM LID, and how much
    the master's activity count moved over `waited` seconds (None: not read again)."""

    sms: list[SubnetManager]
    silent: list[tuple[FabricNode, int, int]]
    local_sm_lid: int
    moved: int | None
    waited: float


@dataclass(frozen=True)
class SmFinding:
    status: Status
    kind: str  # no_master, two_masters, master_idle, sm_lid_wrong, standby_outranks, sm_silent
    what: str
    fix: str


def judge_sms(
    sms: list[SubnetManager],
    silent: list[tuple[FabricNode, int, int]],
    local_sm_lid: int,
    moved: int | None,
    waited: float,
) -> list[SmFinding]:
    """The SMs as an operator needs them: one master (none, or two, is CRITICAL); the master's
    activity count moving (`moved`: how much it grew over `waited` seconds; None: not read
    again); this port's SM LID naming the master; a standby that outranks the master (it
    should have taken over); an SM that did not answer its SMInfo."""
    found = []
    masters = [s for s in sms if s.state == SmState.MASTER]
    if not masters:
        found.append(SmFinding(
            Status.CRITICAL, "no_master",
            f"no master subnet manager ({len(sms) + len(silent)} SM "
            f"port{'s' if len(sms) + len(silent) != 1 else ''} seen, {len(sms)} answering)",
            "start one (systemctl start opensm, or the switch's or UFM's SM); without it no "
            "port leaves INIT and no route changes after a fault",
        ))  # fmt: skip
    elif len(masters) > 1:
        names = ", ".join(f"{s.node.description}/{s.port} (LID {s.lid})" for s in masters)
        found.append(SmFinding(
            Status.CRITICAL, "two_masters", f"{len(masters)} masters: {names}",
            "two SMs that do not see each other (a split subnet, or different SM keys): keep "
            "one, or give them one SM_Key so that they negotiate",
        ))  # fmt: skip
    if len(masters) == 1:
        master = masters[0]
        where = f"{master.node.description}/{master.port} (LID {master.lid})"
        if moved == 0:
            found.append(SmFinding(
                Status.CRITICAL, "master_idle",
                f"the master {where} kept its activity count at {master.activity} for "
                f"{waited:g} s",
                "its SM is hung or stopped sweeping: restart it (a standby takes over only "
                "when the master stops answering)",
            ))  # fmt: skip
        if local_sm_lid and local_sm_lid != master.lid:
            found.append(SmFinding(
                Status.CRITICAL, "sm_lid_wrong",
                f"this port's SM LID is {local_sm_lid}, not the master's {master.lid}",
                "the port has not heard from the master since it took over: its traps go "
                "nowhere; the master's next sweep sets it (or bounce the port)",
            ))  # fmt: skip
        for s in sms:
            if s.state == SmState.STANDBY and s.priority > master.priority:
                found.append(SmFinding(
                    Status.WARNING, "standby_outranks",
                    f"standby {s.node.description}/{s.port} (LID {s.lid}) has priority "
                    f"{s.priority}, above the master's {master.priority}",
                    "it should have taken over: check both SMs' sm_priority and that the "
                    "master honours handover",
                ))  # fmt: skip
    for node, port, lid in silent:
        found.append(SmFinding(
            Status.WARNING, "sm_silent",
            f"{node.description}/{port} (LID {lid}) says an SM runs behind it, and its "
            "SMInfo did not answer",
            "an SM starting or stopping, or hung: look at it there",
        ))  # fmt: skip
    return found


# -- `ibtool fabric route`: a path hop by hop --------------------------------------------------


def resolve(fabric: Fabric, text: str) -> tuple[FabricNode, int, int]:
    """(node, port, LID) that `text` names: a LID (decimal), a node or port GUID (0x...), or a
    node description (exactly); a switch is its port 0, a channel adapter its first port with
    a LID. ValueError saying what it named nothing."""
    text = text.strip()
    if text.isdigit():
        lid = int(text)
        for node in fabric.nodes.values():
            if node.type == NodeType.SWITCH and node.lid == lid:
                return node, 0, lid
            for number, port in node.ports.items():
                if (
                    node.type != NodeType.SWITCH
                    and port.lid
                    and (port.lid <= lid < port.lid + (1 << port.lmc))
                ):
                    return node, number, lid
        raise ValueError(f"no port of the subnet has LID {lid}")
    if text.lower().startswith("0x"):
        try:
            value = int(text, 16)
        except ValueError:
            raise ValueError(f"{text!r} is not a GUID") from None
        for node in fabric.nodes.values():
            for number, port in sorted(node.ports.items()):
                hit = node.guid == value or port.guid == value
                if hit and node.type == NodeType.SWITCH:
                    return node, 0, node.lid
                if hit and port.lid:
                    return node, number, port.lid
        raise ValueError(f"no node or port of the subnet has GUID {text}")
    named = [n for n in fabric.nodes.values() if n.description == text]
    if not named:
        raise ValueError(f"no node of the subnet is described as {text!r}")
    if len(named) > 1:
        raise ValueError(f"{len(named)} nodes are described as {text!r}: name one by GUID or LID")
    node = named[0]
    if node.type == NodeType.SWITCH:
        return node, 0, node.lid
    for number, port in sorted(node.ports.items()):
        if port.lid:
            return node, number, port.lid
    raise ValueError(f"{text!r} has no port with a LID")


@dataclass(frozen=True)
class Hop:
    """One link of a route: out of `node`/`port`, into `far`/`far_port`."""

    node: FabricNode
    port: FabricPort
    far: FabricNode
    far_port: FabricPort


@dataclass(frozen=True)
class Route:
    """The path from `source` to `dest` (node, port, LID each) as the switches' forwarding
    tables send a packet, and why it stops short where it does (`broken`)."""

    source: tuple[FabricNode, int, int]
    dest: tuple[FabricNode, int, int]
    hops: tuple[Hop, ...]
    broken: str | None = None


# -- a scan as data (a snapshot's), and read back: untrusted, checked field by field ---------------

# How much a saved fabric may hold: the largest InfiniBand subnet has 48K unicast LIDs (0x0001
# to 0xBFFF, IBTA 4.1.3); a node at most 254 external ports (NodeInfo.NumPorts is 8 bits).
FABRIC_NODES_MAX = 49151
NODE_PORTS_MAX = 255
DESCRIPTION_MAX = 64  # NodeDescription: 64 bytes (IBTA 14.2.5.2)
COUNTERS = frozenset(ERROR_COUNTERS) | {"PortXmitData", "PortRcvData", "PortXmitPkts",
                                         "PortRcvPkts"}  # fmt: skip
_SPEED = ("active", "enabled", "supported", "ext_active", "ext_enabled", "ext_supported",
          "ext2_active", "ext2_enabled", "ext2_supported")  # fmt: skip


def fabric_data(fabric: Fabric, counters: list[PortCounters] | None, sms: SmScan | None) -> dict:
    """A scan, its ports' counters and its SMs as JSON-able data (what a snapshot keeps)."""

    def port(p: FabricPort) -> dict:
        return {
            "number": p.number, "guid": p.guid, "lid": p.lid, "lmc": p.lmc,
            "state": int(p.state) if p.state is not None else None,
            "phys_state": int(p.phys_state) if p.phys_state is not None else None,
            "width": [p.width_active, p.width_enabled, p.width_supported],
            "speed": [getattr(p.speed, f) for f in _SPEED],
            "remote": list(p.remote) if p.remote else None,
            "ext_number": p.ext_number, "cap_mask": p.cap_mask,
        }  # fmt: skip

    return {
        "nodes": [
            {
                "guid": n.guid,
                "type": int(n.type),
                "description": n.description,
                "port_count": n.port_count,
                "system_guid": n.system_guid,
                "vendor_id": n.vendor_id,
                "device_id": n.device_id,
                "ports": [port(p) for _, p in sorted(n.ports.items())],
            }  # fmt: skip
            for _, n in sorted(fabric.nodes.items())
        ],
        "local": list(fabric.local),
        "ca": fabric.ca,
        "ca_port": fabric.ca_port,
        "mads": fabric.mads,
        "max_hops": fabric.max_hops,
        "unanswered": list(fabric.unanswered),
        "counters": None
        if counters is None
        else [
            {"node": c.node, "port": c.port, "lid": c.lid, "values": c.values, "bits": c.bits}
            for c in counters
        ],
        "sms": None
        if sms is None
        else {
            "sms": [
                {
                    "node": s.node.guid,
                    "port": s.port,
                    "lid": s.lid,
                    "guid": s.guid,
                    "priority": s.priority,
                    "state": int(s.state) if s.state is not None else None,
                    "activity": s.activity,
                }  # fmt: skip
                for s in sms.sms
            ],
            "silent": [[n.guid, p, lid] for n, p, lid in sms.silent],
            "local_sm_lid": sms.local_sm_lid,
        },
    }


def _int(value, low: int, high: int, what: str) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{what} is {str(value)[:40]!r}, not a number from {low} to {high}")
    return value


def _text(value, most: int, what: str) -> str:
    if not isinstance(value, str) or len(value) > most:
        raise ValueError(f"{what} is not text of at most {most} characters")
    return value


def _enum_or_none(kind, value, what: str):
    if value is None:
        return None
    try:
        return kind(_int(value, 0, 255, what))
    except ValueError:
        raise ValueError(f"{what} is {str(value)[:40]!r}, not one of {kind.__name__}") from None


def _list(value, most: int, what: str) -> list:
    if not isinstance(value, list) or len(value) > most:
        raise ValueError(f"{what} is not a list of at most {most}")
    return value


def fabric_from_data(
    data, what: str = "fabric"
) -> tuple[Fabric, list[PortCounters] | None, SmScan | None]:
    """`fabric_data`'s output read back, every field checked (a saved fabric comes from
    another host); ValueError naming the first field that is not what `fabric_data` writes."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not an object")
    u64 = (1 << 64) - 1
    nodes: dict[int, FabricNode] = {}
    for i, n in enumerate(_list(data.get("nodes"), FABRIC_NODES_MAX, f"{what} nodes")):
        at = f"{what} node {i}"
        if not isinstance(n, dict):
            raise ValueError(f"{at} is not an object")
        ports = {}
        for j, p in enumerate(_list(n.get("ports"), NODE_PORTS_MAX + 1, f"{at} ports")):
            pat = f"{at} port {j}"
            if not isinstance(p, dict):
                raise ValueError(f"{pat} is not an object")
            width = _list(p.get("width"), 3, f"{pat} width")
            speed = _list(p.get("speed"), len(_SPEED), f"{pat} speed")
            if len(width) != 3 or len(speed) != len(_SPEED):
                raise ValueError(f"{pat}: width or speed malformed")
            remote = p.get("remote")
            if remote is not None:
                remote = _list(remote, 2, f"{pat} remote")
                if len(remote) != 2:
                    raise ValueError(f"{pat} remote malformed")
                remote = (_int(remote[0], 0, u64, f"{pat} remote"),
                          _int(remote[1], 0, NODE_PORTS_MAX, f"{pat} remote"))  # fmt: skip
            number = _int(p.get("number"), 0, NODE_PORTS_MAX, f"{pat} number")
            ports[number] = FabricPort(
                number=number,
                guid=_int(p.get("guid"), 0, u64, f"{pat} guid"),
                lid=_int(p.get("lid"), 0, 0xFFFF, f"{pat} lid"),
                lmc=_int(p.get("lmc"), 0, 7, f"{pat} lmc"),
                state=_enum_or_none(PortState, p.get("state"), f"{pat} state"),
                phys_state=_enum_or_none(PhysState, p.get("phys_state"), f"{pat} phys_state"),
                width_active=_int(width[0], 0, 255, f"{pat} width"),
                width_enabled=_int(width[1], 0, 255, f"{pat} width"),
                width_supported=_int(width[2], 0, 255, f"{pat} width"),
                speed=PortSpeed(*(_int(v, 0, 255, f"{pat} speed") for v in speed)),
                remote=remote,
                ext_number=_int(p.get("ext_number", 0), 0, 255, f"{pat} ext_number"),
                cap_mask=_int(p.get("cap_mask", 0), 0, 0xFFFFFFFF, f"{pat} cap_mask"),
            )
        guid = _int(n.get("guid"), 0, u64, f"{at} guid")
        nodes[guid] = FabricNode(
            guid=guid,
            type=_enum_or_none(NodeType, n.get("type"), f"{at} type") or NodeType.CA,
            description=_text(n.get("description"), DESCRIPTION_MAX, f"{at} description"),
            port_count=_int(n.get("port_count"), 0, NODE_PORTS_MAX, f"{at} port_count"),
            ports=ports,
            system_guid=_int(n.get("system_guid", 0), 0, u64, f"{at} system_guid"),
            vendor_id=_int(n.get("vendor_id", 0), 0, 0xFFFFFF, f"{at} vendor_id"),
            device_id=_int(n.get("device_id", 0), 0, 0xFFFF, f"{at} device_id"),
        )
    local = _list(data.get("local"), 2, f"{what} local")
    if len(local) != 2:
        raise ValueError(f"{what} local malformed")
    fabric = Fabric(
        nodes=nodes,
        local=(
            _int(local[0], 0, u64, f"{what} local"),
            _int(local[1], 0, NODE_PORTS_MAX, f"{what} local"),
        ),  # fmt: skip
        ca=_text(data.get("ca"), 64, f"{what} ca"),
        ca_port=_int(data.get("ca_port"), 0, NODE_PORTS_MAX, f"{what} ca_port"),
        mads=_int(data.get("mads", 0), 0, u64, f"{what} mads"),
        max_hops=_int(data.get("max_hops", 0), 0, 255, f"{what} max_hops"),
        unanswered=tuple(
            _text(u, 256, f"{what} unanswered")
            for u in _list(data.get("unanswered", []), FABRIC_NODES_MAX, f"{what} unanswered")
        ),
    )
    counters = None
    if data.get("counters") is not None:
        counters = []
        limit = FABRIC_NODES_MAX * 4
        for i, c in enumerate(_list(data["counters"], limit, f"{what} counters")):
            at = f"{what} counters {i}"
            if not isinstance(c, dict) or not isinstance(c.get("values"), dict):
                raise ValueError(f"{at} is not an object with values")
            bits = c.get("bits")
            if not isinstance(bits, dict):
                raise ValueError(f"{at} has no bits")
            values = {}
            for name, value in c["values"].items():
                if name not in COUNTERS:
                    raise ValueError(f"{at}: {str(name)[:40]!r} is not a counter ibtool reads")
                values[name] = _int(value, 0, u64, f"{at} {name}")
            counters.append(PortCounters(
                node=_int(c.get("node"), 0, u64, f"{at} node"),
                port=_int(c.get("port"), 0, NODE_PORTS_MAX, f"{at} port"),
                lid=_int(c.get("lid"), 0, 0xFFFF, f"{at} lid"),
                values=values,
                bits={name: _int(bits.get(name, 64), 1, 64, f"{at} bits") for name in values},
            ))  # fmt: skip
    sms = None
    if data.get("sms") is not None:
        saved = data["sms"]
        if not isinstance(saved, dict):
            raise ValueError(f"{what} sms is not an object")
        found = []
        for i, s in enumerate(_list(saved.get("sms"), 1024, f"{what} sms")):
            at = f"{what} sm {i}"
            if not isinstance(s, dict):
                raise ValueError(f"{at} is not an object")
            node = nodes.get(_int(s.get("node"), 0, u64, f"{at} node"))
            if node is None:
                raise ValueError(f"{at} runs on a node the fabric does not hold")
            found.append(SubnetManager(
                node=node,
                port=_int(s.get("port"), 0, NODE_PORTS_MAX, f"{at} port"),
                lid=_int(s.get("lid"), 0, 0xFFFF, f"{at} lid"),
                guid=_int(s.get("guid"), 0, u64, f"{at} guid"),
                priority=_int(s.get("priority"), 0, 15, f"{at} priority"),
                state=_enum_or_none(SmState, s.get("state"), f"{at} state"),
                activity=_int(s.get("activity"), 0, 0xFFFFFFFF, f"{at} activity"),
            ))  # fmt: skip
        silent = []
        for i, entry in enumerate(_list(saved.get("silent", []), 1024, f"{what} silent SMs")):
            entry = _list(entry, 3, f"{what} silent SM {i}")
            node = nodes.get(_int(entry[0], 0, u64, f"{what} silent SM {i}")) if entry else None
            if node is None or len(entry) != 3:
                raise ValueError(f"{what} silent SM {i} malformed")
            silent.append((node, _int(entry[1], 0, NODE_PORTS_MAX, "port"),
                           _int(entry[2], 0, 0xFFFF, "lid")))  # fmt: skip
        sms = SmScan(found, silent, _int(saved.get("local_sm_lid", 0), 0, 0xFFFF, "SM LID"),
                     None, 0.0)  # fmt: skip
    return fabric, counters, sms


# -- what changed between two saved fabrics ------------------------------------------------------


@dataclass(frozen=True)
class FabricChange:
    """One change between two scans of a subnet: `kind` for programs (node_gone, node_new,
    link_down, link_up, link_degraded, link_improved, errors_grew, counters_cleared), `what`
    for a person."""

    kind: str
    what: str


def _links_by_ends(fabric: Fabric) -> dict[frozenset, Link]:
    return {
        frozenset({(lk.a.node.guid, lk.a.port.number), (lk.b.node.guid, lk.b.port.number)}): lk
        for lk in fabric.links()
    }


def _link_name(lk: Link) -> str:
    a, b = sorted((lk.a, lk.b), key=lambda e: (e.node.description, e.port.number))
    return f"{_name(a)} <-> {_name(b)}"


def _rate(lk: Link) -> tuple[str, float]:
    width, speed = lk.a.port.width, lk.a.port.speed.active_name()
    return f"{width or '?'} {speed or '?'}", gbps(width, speed)


def fabric_changes(
    a: Fabric,
    b: Fabric,
    counters_a: list[PortCounters] | None = None,
    counters_b: list[PortCounters] | None = None,
) -> list[FabricChange]:
    """What changed from scan `a` to scan `b`: nodes that went or came, links that went down or
    came up, links that trained slower or faster, and error counters that grew (or were
    cleared) where both scans hold the ports' counters."""
    found = []
    for guid in sorted(set(a.nodes) - set(b.nodes)):
        n = a.nodes[guid]
        found.append(FabricChange("node_gone", f"{n.description} ({guid:#018x}) is gone"))
    for guid in sorted(set(b.nodes) - set(a.nodes)):
        n = b.nodes[guid]
        found.append(FabricChange("node_new", f"{n.description} ({guid:#018x}) came"))
    links_a, links_b = _links_by_ends(a), _links_by_ends(b)
    for key in sorted(set(links_a) - set(links_b), key=lambda k: _link_name(links_a[k])):
        found.append(FabricChange("link_down", f"link {_link_name(links_a[key])} went down"))
    for key in sorted(set(links_b) - set(links_a), key=lambda k: _link_name(links_b[k])):
        found.append(FabricChange("link_up", f"link {_link_name(links_b[key])} came up"))
    for key in sorted(set(links_a) & set(links_b), key=lambda k: _link_name(links_b[k])):
        (was, before), (now, after) = _rate(links_a[key]), _rate(links_b[key])
        if after != before:
            kind = "link_degraded" if after < before else "link_improved"
            found.append(FabricChange(kind, f"link {_link_name(links_b[key])} {was} -> {now}"))
    if counters_a is not None and counters_b is not None:
        old = {(c.node, c.port): c for c in counters_a}
        for c in sorted(counters_b, key=lambda c: (c.node, c.port)):
            before = old.get((c.node, c.port))
            if before is None:
                continue
            node = b.nodes.get(c.node)
            where = f"{node.description}/{c.port}" if node else f"{c.node:#018x}/{c.port}"
            far = b.far_end(c.node, c.port)
            if far is not None:
                where += f" <-> {far[0].description}/{far[1].number}"
            for name in ERROR_COUNTERS:
                x, y = before.values.get(name), c.values.get(name)
                if x is None or y is None or x == y:
                    continue
                if y > x:
                    found.append(FabricChange(
                        "errors_grew", f"{where}: {name} +{y - x} ({x} -> {y})"
                    ))  # fmt: skip
                else:
                    found.append(FabricChange(
                        "counters_cleared", f"{where}: {name} cleared ({x} -> {y})"
                    ))  # fmt: skip
    return found


def clean_sum(thresholds: dict[str, int]) -> Callable[[PortCounters], bool]:
    """Whether a switch's sum of its ports' counters holds nothing `judge_counters` would list:
    every error counter of the sum at or under its threshold means every port's is (a counter
    saturated in the sum is not clean)."""

    def clean(total) -> bool:
        for name in ERROR_COUNTERS:
            if name == CONGESTION and name not in thresholds:
                continue
            value = total.values.get(name)
            if value is None:
                continue
            if value > thresholds.get(name, 0) or value == (1 << total.bits.get(name, 64)) - 1:
                return False
        return True

    return clean
