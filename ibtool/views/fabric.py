"""The fabric's text and JSON: its nodes (as ibnetdiscover lists them) and its links with both
ends (as `ibnetdiscover -p` and iblinkinfo show them)."""

from __future__ import annotations

from typing import Any

from ibtool.model.fabric import Fabric, FabricNode, Link, LinkEnd, NodeType
from ibtool.views import render


def guid(value: int) -> str:
    """A GUID as infiniband-diags print one: 0x and 16 hex digits."""
    return f"{value:#018x}"


NODE_FIELDS = [
    render.Field("type", lambda n: n.type.label, header="TYPE"),
    render.Field("lid", lambda n: n.lid, header="LID"),
    render.Field("guid", lambda n: guid(n.guid), header="NODE GUID"),
    render.Field("ports", lambda n: n.port_count, header="PORTS"),
    render.Field("description", lambda n: n.description, header="DESCRIPTION"),
]


def _end(e: LinkEnd) -> dict[str, Any]:
    return {
        "node": e.node.description,
        "node_guid": guid(e.node.guid),
        "type": e.node.type.label,
        "port": e.port.number,
        "port_guid": guid(e.port.guid),
        "lid": e.lid,
    }


def _name(e: LinkEnd) -> str:
    return f"{e.node.description}/{e.port.number}"


LINK_FIELDS = [
    render.Field("a", lambda lk: _name(lk.a), header="END A", text=str),
    render.Field("a_lid", lambda lk: lk.a.lid, header="LID"),
    render.Field("b", lambda lk: _name(lk.b), header="END B"),
    render.Field("b_lid", lambda lk: lk.b.lid, header="LID"),
    render.Field("width", lambda lk: lk.a.port.width, header="WIDTH"),
    render.Field("speed", lambda lk: lk.a.port.speed.active_name(), header="SPEED"),
    render.Field(
        "state", lambda lk: lk.a.port.state.label if lk.a.port.state else None, header="STATE"
    ),  # fmt: skip
]

ORDER = {NodeType.SWITCH: 0, NodeType.ROUTER: 1, NodeType.CA: 2}


def nodes_in_order(fabric: Fabric) -> list[FabricNode]:
    """Switches, then routers, then CAs; each kind by description, then GUID."""
    return sorted(fabric.nodes.values(), key=lambda n: (ORDER[n.type], n.description, n.guid))


def links_in_order(fabric: Fabric) -> list[Link]:
    """Links by their ends' names: a switch end first where the cable has one."""
    ordered = []
    for lk in fabric.links():
        a, b = lk.a, lk.b
        if (ORDER[b.node.type], b.node.description, b.port.number) < (
            ORDER[a.node.type],
            a.node.description,
            a.port.number,
        ):
            a, b = b, a
        ordered.append(Link(a, b))
    return sorted(
        ordered, key=lambda lk: (ORDER[lk.a.node.type], lk.a.node.description, lk.a.port.number)
    )


def head(fabric: Fabric) -> str:
    local = fabric.nodes.get(fabric.local[0])
    where = f" ({local.description})" if local else ""
    counts = {k: len(fabric.by_type(k)) for k in NodeType}
    return (
        f"subnet through {fabric.ca}/{fabric.ca_port}{where}: "
        f"{counts[NodeType.SWITCH]} switches, {counts[NodeType.CA]} channel adapters, "
        f"{counts[NodeType.ROUTER]} routers, {len(fabric.links())} links, "
        f"{fabric.max_hops} hops deep, {fabric.mads} SMPs"
    )


def text(fabric: Fabric) -> list[str]:
    lines = [head(fabric), ""]
    lines += render.table(nodes_in_order(fabric), NODE_FIELDS, False)
    lines.append("")
    lines += render.table(links_in_order(fabric), LINK_FIELDS, False)
    return lines


def as_json(fabric: Fabric) -> dict[str, Any]:
    return {
        "via": {"ca": fabric.ca, "port": fabric.ca_port},
        "local": {"node_guid": guid(fabric.local[0]), "port": fabric.local[1]},
        "smps": fabric.mads,
        "hops": fabric.max_hops,
        "nodes": [
            {
                **render.record_json(n, NODE_FIELDS, True),
                "system_guid": guid(n.system_guid),
                "vendor_id": n.vendor_id,
                "device_id": n.device_id,
            }
            for n in nodes_in_order(fabric)
        ],
        "links": [
            {
                "a": _end(lk.a),
                "b": _end(lk.b),
                "width": lk.a.port.width,
                "speed": lk.a.port.speed.active_name(),
                "state": lk.a.port.state.label if lk.a.port.state else None,
            }
            for lk in links_in_order(fabric)
        ],
        "unanswered": list(fabric.unanswered),
    }
