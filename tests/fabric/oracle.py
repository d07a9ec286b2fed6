"""infiniband-diags' answers on a simulated fabric, parsed: what ibtool's must equal."""

from __future__ import annotations

import re

# ibnetdiscover (default output): a node's header line and its ports' lines
_NODE = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([SHR])-([0-9a-f]{16})"\s+#\s+"(.*)"(.*)$')
_SWITCH_LID = re.compile(r"\blid (\d+)\b")
_PORT = re.compile(r'^\[(\d+)\].*?"([SHR])-([0-9a-f]{16})"\[(\d+)\].*?#.*?lid (\d+)')
# ibnetdiscover -p: one line a port, "CA 22 1 0x... 4x SDR - SW 9 4 0x... ( 'a' - 'b' )"
_P = re.compile(
    r"^(CA|SW|RT)\s+(\d+)\s+(\d+)\s+0x([0-9a-f]{16})\s+(\S+)\s+(\S+)"
    r"(?:\s+-\s+(CA|SW|RT)\s+(\d+)\s+(\d+)\s+0x([0-9a-f]{16}))?"
)
TYPES = {"Switch": "SW", "Ca": "CA", "Rt": "RT"}


def nodes(text: str) -> dict[str, dict]:
    """Node GUID -> type, port count and description, from ibnetdiscover's output. A CA's
    LID is its ports'; a switch's is on its header line."""
    found = {}
    for line in text.splitlines():
        m = _NODE.match(line)
        if m:
            kind, ports, _, guid, desc, rest = m.groups()
            lid = _SWITCH_LID.search(rest)
            found["0x" + guid] = {
                "type": TYPES[kind],
                "ports": int(ports),
                "description": desc,
                "lid": int(lid.group(1)) if lid else None,
            }
    return found


def ports(text: str) -> list[tuple]:
    """(type, lid, port, port GUID, width, speed, far (type, lid, port, GUID) or None) of
    every port line of `ibnetdiscover -p`."""
    found = []
    for line in text.splitlines():
        m = _P.match(line)
        if not m:
            continue
        t, lid, port, guid, width, speed, ft, flid, fport, fguid = m.groups()
        far = (ft, int(flid), int(fport), "0x" + fguid) if ft else None
        found.append((t, int(lid), int(port), "0x" + guid, width, speed, far))
    return found


# iblinkinfo --line: "0x... "  node005 mlx5_0"  9  1[  ] ==( 4X  2.5 Gbps Active/  LinkUp)==>
# 0x...  6  2[  ] "leaf02" ( ... )"; a lane's rate as it prints it (ibdiag_common.c)
_LINE = re.compile(
    r'^0x([0-9a-f]{16})\s+".*?"\s+(\d+)\s+(\d+)\[.*?\]\s+==\(\s*(\d+X)\s+([\d.]+) Gbps\s+'
    r"(\w+)/\s*(\w+)\)==>\s+0x([0-9a-f]{16})\s+(\d+)\s+(\d+)\["
)
LANE_SPEEDS = {
    "2.5": "SDR", "5.0": "DDR", "10.0": "QDR", "14.0625": "FDR", "25.78125": "EDR",
    "53.125": "HDR", "106.25": "NDR", "212.5": "XDR",
}  # fmt: skip


def linkinfo(text: str) -> dict[tuple[str, int], tuple]:
    """(port GUID, port) -> (width, speed name, state, far (port GUID, port)) of every port
    with a link in `iblinkinfo --line`."""
    found = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            guid, _, port, width, gbps, state, _, fguid, _, fport = m.groups()
            found["0x" + guid, int(port)] = (
                width, LANE_SPEEDS[gbps], state.upper(), ("0x" + fguid, int(fport))
            )  # fmt: skip
    return found


# ibqueryerrors: "   GUID 0x200002 port 1: [SymbolErrorCounter == 500] [PortXmitDiscards == 3]"
_ERRORS = re.compile(r"^\s+GUID 0x([0-9a-f]+) port (\d+): (.*)$")
_COUNTER = re.compile(r"\[(\w+) == (\d+)\]")


def queryerrors(text: str) -> dict[tuple[int, int], dict[str, int]]:
    """(node GUID, port) -> {counter: value} of every port ibqueryerrors lists over its
    thresholds (its "port ALL" lines, the switch's sum, left out)."""
    found = {}
    for line in text.splitlines():
        m = _ERRORS.match(line)
        if m:
            guid, port, rest = m.groups()
            found[int(guid, 16), int(port)] = {k: int(v) for k, v in _COUNTER.findall(rest)}
    return found


def perfquery(text: str) -> dict[str, int]:
    """`perfquery [-x] LID PORT`'s counters: name -> value."""
    found = {}
    for line in text.splitlines():
        name, dots, value = line.partition(":")
        if dots and value.strip(".").strip().isdigit():
            found[name.strip()] = int(value.strip(".").strip())
    return found


# ibtracert: "[4] -> switch port {0x0000000000200000}[1] lid 1-1 "spine01""
_HOP = re.compile(r"^\[(\d+)\] -> (?:switch|ca|router) port \{0x([0-9a-f]+)\}\[(\d+)\] lid (\d+)-")
_TO = re.compile(r"^To (?:switch|ca|router) \{0x([0-9a-f]+)\} portnum (\d+) lid (\d+)-")


def tracert(text: str) -> list[tuple[int, str, int, int]]:
    """ibtracert's hops: (out port, far port GUID, far port, far LID) each, in order."""
    return [
        (int(m.group(1)), "0x" + m.group(2), int(m.group(3)), int(m.group(4)))
        for m in map(_HOP.match, text.splitlines())
        if m
    ]
