"""The InfiniBand fabric as discovered: its nodes (switches, channel adapters, routers), their
ports and the links between them; pure data, decoded from the SMPs by ibtool.sources.mad.

The numbers are the IBTA's (InfiniBand Architecture Specification vol. 1, release 1.5, 14.2.5:
NodeInfo 14.2.5.3, PortInfo 14.2.5.6): NodeType 1 channel adapter, 2 switch, 3 router;
LinkWidth bits 1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X, 16 = 2X; LinkSpeed bits 1 = SDR, 2 = DDR,
4 = QDR; LinkSpeedExt bits 1 = FDR, 2 = EDR, 4 = HDR, 8 = NDR; LinkSpeedExt2 bit 1 = XDR.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import Any

from ibtool.model.deferred import dataclass
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


@dataclass(frozen=True)
class Cable:
    """A local port and what its cable reaches, each end as its own PortInfo says, read by
    directed-route SMPs one hop out (as `smpquery -D nodeinfo 0,P` and `portinfo 0,P` ask):
    `near` the local node with that port, `far` the node at the other end with the port the
    cable enters (and a switch's port 0, which holds its LID and capabilities); `far` is None
    where the port is not up or its far end did not answer (`why` says which). `counters`:
    the far port's PMA counters (a PortCounters) where they were asked and answered, else
    `silent` says why not."""

    ca: str
    near: FabricNode
    far: FabricNode | None
    far_port: int = 0
    why: str = ""
    counters: Any = None
    silent: str = ""

    @property
    def port(self) -> int:
        return min(self.near.ports) if self.near.ports else 0

    @property
    def link(self) -> Link | None:
        """The cable as a Link, this end `a` (not sorted), or None where there is no far end."""
        if self.far is None:
            return None
        a = LinkEnd(self.near, self.near.ports[self.port])
        return Link(a, LinkEnd(self.far, self.far.ports[self.far_port]))


def end_name(e: LinkEnd) -> str:
    """`leaf05/7`: a cable's end as infiniband-diags' users name it."""
    return f"{e.node.description}/{e.port.number}"
