"""A route through the subnet hop by hop, and what names its ends: `ibtool fabric route`."""

from __future__ import annotations

from ibtool.model.deferred import dataclass
from ibtool.model.fabric.records import Fabric, FabricNode, FabricPort, NodeType


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
