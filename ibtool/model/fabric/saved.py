"""A scan as data (what a snapshot keeps), read back as untrusted input, and what changed
between two scans: `snapshot save --fabric`, `snapshot diff`, `fabric links --against`."""

from __future__ import annotations

from ibtool.model.deferred import dataclass
from ibtool.model.fabric.counters import ERROR_COUNTERS, PortCounters
from ibtool.model.fabric.links import gbps
from ibtool.model.fabric.records import (
    Fabric,
    FabricNode,
    FabricPort,
    Link,
    NodeType,
    PortSpeed,
    end_name,
)
from ibtool.model.fabric.sm import SmScan, SmState, SubnetManager
from ibtool.model.records import PhysState, PortState

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
    return f"{end_name(a)} <-> {end_name(b)}"


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
