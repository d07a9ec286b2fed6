"""The InfiniBand fabric as Prometheus metric families: every port's state, width, speed and PMA
counters, each node and cable's ends, and the scan's own figures (`ibtool exporter --fabric`).

The families are named and labelled as treydock/infiniband_exporter names its own (its
collectors/switch.go and hca.go), under the prefix ``ibtool_fabric_`` where it has
``infiniband_``: ``infiniband_switch_port_symbol_error_total{guid,port}`` is
``ibtool_fabric_switch_port_symbol_error_total{guid,port}`` here, with the same value (the data
counters in bytes, 4 times the 4-byte words the PMA counts, as it gives them), and its
``*_info`` and ``*_uplink_info`` families carry the same labels. ibtool-exporter(8) has the
table, and the families it has that this has not (and the other way round).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ibtool.model.fabric import (
    LANE_GBPS,
    WIDTH_LANES,
    Fabric,
    FabricNode,
    FabricPort,
    NodeType,
    PortCounters,
    SubnetManager,
)
from ibtool.model.records import PortState
from ibtool.views.fabric import guid
from ibtool.views.prometheus import MetricFamily

PREFIX = "ibtool_fabric_"
# Which node kind each family set is for, as treydock/infiniband_exporter names them ("switch",
# "hca"); a router's ports under "router", which it has not.
KINDS = {NodeType.SWITCH: "switch", NodeType.CA: "hca", NodeType.ROUTER: "router"}
# Each PMA counter (PortCounters and PortCountersExtended, IBTA vol. 1, 16.1.3.5 and 16.1.4.11,
# by libibmad's names) by the name treydock/infiniband_exporter gives its series.
COUNTER_NAMES = {
    "PortXmitData": "port_transmit_data_bytes",
    "PortRcvData": "port_receive_data_bytes",
    "PortXmitPkts": "port_transmit_packets",
    "PortRcvPkts": "port_receive_packets",
    "SymbolErrorCounter": "port_symbol_error",
    "LinkErrorRecoveryCounter": "port_link_error_recovery",
    "LinkDownedCounter": "port_link_downed",
    "PortRcvErrors": "port_receive_errors",
    "PortRcvRemotePhysicalErrors": "port_receive_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_receive_switch_relay_errors",
    "PortXmitDiscards": "port_transmit_discards",
    "PortXmitConstraintErrors": "port_transmit_constraint_errors",
    "PortRcvConstraintErrors": "port_receive_constraint_errors",
    "LocalLinkIntegrityErrors": "port_local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "port_excessive_buffer_overrun_errors",
    "VL15Dropped": "port_vl15_dropped",
    "PortXmitWait": "port_transmit_wait",
}
# PortXmitData and PortRcvData count 4-byte words (IBTA vol. 1, 16.1.3.5: octets divided by 4)
WORD_COUNTERS = {"PortXmitData": 4, "PortRcvData": 4}
# Gb/s of data a lane carries at each speed, after its line code (IBTA vol. 2: 8b/10b up to
# QDR, 64b/66b for FDR and EDR; HDR, NDR and XDR lanes carry 50, 100 and 200 Gb/s of data)
LANE_DATA_GBPS = {
    "SDR": 2.0, "DDR": 4.0, "QDR": 8.0, "FDR": 14.0625 * 64 / 66, "EDR": 25.78125 * 64 / 66,
    "HDR": 50.0, "NDR": 100.0, "XDR": 200.0,
}  # fmt: skip


def _counter_help(name: str, kind: str) -> str:
    unit = ", in bytes (4 times the 4-byte words it counts)" if name in WORD_COUNTERS else ""
    return f"{name} of each {kind} port (PMA, IBTA 16.1.3.5){unit}"


class _Kind:
    """The families of one node kind (switch, hca, router), filled port by port."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        p = PREFIX + kind
        self.info = MetricFamily(
            f"{p}_info", f"Each {kind}: its node description and LID; always 1", "gauge"
        )
        self.uplink = MetricFamily(
            f"{p}_uplink_info",
            f"Each cabled {kind} port: the node, port and LID at the cable's far end; always 1",
            "gauge",
        )
        self.state = MetricFamily(
            f"{p}_port_state_id", f"{kind} port state (IBTA: 1 DOWN .. 4 ACTIVE)", "gauge"
        )
        self.phys = MetricFamily(
            f"{p}_port_physical_state_id",
            f"{kind} port physical state (IBTA: 2 Polling, 3 Disabled, 5 LinkUp)",
            "gauge",
        )
        self.width = MetricFamily(
            f"{p}_port_width_lanes", f"Lanes the {kind} port's link runs on (0: none)", "gauge"
        )
        self.speed = MetricFamily(
            f"{p}_port_speed_bytes_per_second",
            f"Signalling rate of one lane of the {kind} port's link: its speed (SDR 2.5 Gb/s "
            "to XDR 212.5 Gb/s)",
            "gauge",
        )
        # treydock/infiniband_exporter: a switch port's rate, an HCA's (by its GUID there)
        rate = "port_rate" if kind != "hca" else "rate"
        self.rate = MetricFamily(
            f"{p}_{rate}_bytes_per_second",
            f"Data rate of the {kind} port's link (lanes times a lane's data rate)",
            "gauge",
        )
        self.raw_rate = MetricFamily(
            f"{p}_{'port_raw_rate' if kind != 'hca' else 'raw_rate'}_bytes_per_second",
            f"Signalling rate of the {kind} port's link (lanes times a lane's signalling rate)",
            "gauge",
        )
        self.read: list[tuple[dict[str, str], dict[str, int]]] = []  # each port's counters

    def families(self) -> Iterator[MetricFamily]:
        """Its families with samples, each sealed. The counters' (most of the samples) are
        filled one family at a time as they are taken: a caller that writes each out and lets
        it go holds one at a time."""
        found = [self.info, self.uplink, self.state, self.phys, self.width, self.speed]
        found += [self.rate, self.raw_rate]
        yield from (f.seal() for f in found if f.samples)
        for name, suffix in COUNTER_NAMES.items():
            family = MetricFamily(
                f"{PREFIX}{self.kind}_{suffix}", _counter_help(name, self.kind), "counter"
            )
            scale = WORD_COUNTERS.get(name, 1)
            for labels, values in self.read:
                value = values.get(name)
                if value is not None:
                    family.add(labels, value * scale)
            if family.samples:
                yield family.seal()


def _port_guid(node: FabricNode, number: int) -> int:
    """The GUID infiniband-diags name a port by (`ibnetdiscover -p`, `perfquery -G`): its own,
    which on a switch is port 0's for every port (NodeInfo.PortGUID, IBTA 14.2.5.3)."""
    port = node.ports.get(number) or node.ports.get(0)
    return port.guid if port is not None and port.guid else node.guid


def _port(k: _Kind, fabric: Fabric, node: FabricNode, port: FabricPort) -> None:
    labels = {"guid": guid(_port_guid(node, port.number)), "port": str(port.number)}
    if port.state is not None:
        k.state.add(labels, int(port.state))
    if port.phys_state is not None:
        k.phys.add(labels, int(port.phys_state))
    width, speed = port.width, port.speed.active_name()
    up = port.state is not None and port.state >= PortState.INIT  # the link trained
    k.width.add(labels, WIDTH_LANES[port.width_active] if up and width else 0)
    if up and speed is not None:
        k.speed.add(labels, LANE_GBPS[speed] * 1e9 / 8)
        if width is not None:
            lanes = WIDTH_LANES[port.width_active]
            # an HCA's rate by its port's GUID alone, as treydock/infiniband_exporter's
            rated = labels if k.kind == "switch" else {"guid": labels["guid"]}
            k.rate.add(rated, lanes * LANE_DATA_GBPS[speed] * 1e9 / 8)
            k.raw_rate.add(rated, lanes * LANE_GBPS[speed] * 1e9 / 8)
    far = fabric.far_end(node.guid, port.number)
    if far is not None:
        far_node, far_port = far
        k.uplink.add(
            {
                **labels,
                k.kind: node.description,
                "uplink": far_node.description,
                "uplink_guid": guid(_port_guid(far_node, far_port.number)),
                "uplink_type": far_node.type.label,
                "uplink_port": str(far_port.number),
                "uplink_lid": str(far_port.lid or far_node.lid),
            },
            1,
        )


def port_families(
    fabric: Fabric, counters: dict[tuple[int, int], PortCounters]
) -> Iterator[MetricFamily]:
    """Every node's and port's families of one scan: switches', then HCAs', then routers'
    (a kind with no node has none); each node by GUID, each port by number (a switch's port
    0, its management port, has no cable and is left out). A port is named by its GUID and
    number, as infiniband-diags and treydock/infiniband_exporter name it: a switch's ports
    share one GUID, an HCA's each have their own (its info, one per port GUID). A generator:
    see _Kind.families."""
    kinds = {t: _Kind(name) for t, name in KINDS.items()}
    read: dict[int, list[PortCounters]] = {}
    for key in sorted(counters):
        read.setdefault(key[0], []).append(counters[key])
    for node_guid in sorted(fabric.nodes):
        node = fabric.nodes[node_guid]
        k = kinds[node.type]
        if node.type == NodeType.SWITCH:
            named = {_port_guid(node, 0): node.lid}
        else:
            named = {_port_guid(node, n): p.lid for n, p in sorted(node.ports.items())}
        for port_guid, lid in named.items():
            k.info.add({"guid": guid(port_guid), k.kind: node.description, "lid": str(lid)}, 1)
        for number in sorted(node.ports):
            if number == 0 and node.type == NodeType.SWITCH:
                continue
            _port(k, fabric, node, node.ports[number])
        for pc in read.get(node_guid, ()):
            labels = {"guid": guid(_port_guid(node, pc.port)), "port": str(pc.port)}
            k.read.append((labels, pc.values))
    for t in KINDS:
        yield from kinds[t].families()


def scan_families(
    *,
    number: int,
    at: float,
    duration: float,
    mads: int,
    warnings: int,
    error: str | None,
    nodes: Iterable[FabricNode] = (),
    sms: Iterable[SubnetManager] = (),
) -> list[MetricFamily]:
    """The scan's own figures: whether it read the fabric (up), when it ended, how long it
    took, the MADs it sent, its warnings, how many scans; the nodes by type, and each
    subnet manager's state (SMInfo.SMState, IBTA 14.2.5.13) with its priority."""
    up = MetricFamily(
        PREFIX + "up", "Whether the last fabric scan read the subnet (0: it failed)", "gauge"
    )
    up.add({}, 0 if error else 1)
    scans = MetricFamily(PREFIX + "scans", "Fabric scans ended since start", "counter")
    scans.add({}, number)
    when = MetricFamily(
        PREFIX + "last_scan_timestamp", "When the last fabric scan ended", "gauge", "seconds"
    )
    when.add({}, round(at, 3))
    took = MetricFamily(
        PREFIX + "scan_duration", "How long the last fabric scan took", "gauge", "seconds"
    )
    took.add({}, round(duration, 6))
    sent = MetricFamily(
        PREFIX + "scan_mads", "MADs the last fabric scan sent (SMPs and PMA queries)", "gauge"
    )
    sent.add({}, mads)
    silent = MetricFamily(
        PREFIX + "scan_warnings",
        "Warnings of the last fabric scan: nodes, ports or SMs that did not answer, what of "
        "the local host could not be read",
        "gauge",
    )
    silent.add({}, warnings)
    by_type = MetricFamily(PREFIX + "nodes", "Nodes the last fabric scan found, by type", "gauge")
    counted: dict[str, int] = {}
    for node in nodes:
        counted[node.type.label] = counted.get(node.type.label, 0) + 1
    for label in sorted(counted):
        by_type.add({"type": label}, counted[label])
    sm = MetricFamily(
        PREFIX + "subnet_manager_state",
        "Each subnet manager's SMInfo state (0 not active, 1 discovering, 2 standby, 3 master)",
        "gauge",
    )
    for s in sms:
        if s.state is None:
            continue
        sm.add(
            {
                "guid": guid(s.guid),
                "node": s.node.description,
                "port": str(s.port),
                "lid": str(s.lid),
                "priority": str(s.priority),
            },
            int(s.state),
        )
    found = [up, scans, when, took, sent, silent]
    return found + [f for f in (by_type, sm) if f.samples]
