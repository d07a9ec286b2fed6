"""`ibtool port [show]`: a port's line (state, rate, LIDs, netdev, bond) and, with -d, its
capabilities, P_Key table, VLs and SL-to-VL mapping."""

from __future__ import annotations

import dataclasses

from ibtool.api import VL_CAP, Bond, Invocation, LinkLayer, PKey, Port, PortState, render, selector

# IB PortInfo CapabilityMask bit positions (sysfs cap_mask holds the low 32 bits).
PORT_CAP_FLAGS = {
    1: "SM",
    2: "NOTICE",
    3: "TRAP",
    4: "OPT_IPD",
    5: "AUTO_MIGR",
    6: "SL_MAP",
    7: "MKEY_NVRAM",
    8: "PKEY_NVRAM",
    9: "LED_INFO",
    10: "SM_DISABLED",
    11: "SYS_IMAGE_GUID",
    12: "PKEY_SW_EXT_PORT_TRAP",
    13: "CABLE_INFO",
    14: "EXTENDED_SPEEDS",
    15: "CAP_MASK2",
    16: "CM",
    17: "SNMP_TUNNEL",
    18: "REINIT",
    19: "DEVICE_MGMT",
    20: "VENDOR_CLASS",
    21: "DR_NOTICE",
    22: "CAP_MASK_NOTICE",
    23: "BOOT_MGMT",
    24: "LINK_LATENCY",
    25: "CLIENT_REG",
    26: "IP_BASED_GIDS",
    27: "LINK_SPEED_WIDTH",
    28: "VENDOR_SPECIFIC_MADS",
    29: "MULT_PKER_TRAP",
    30: "MULT_FDB",
    31: "HIERARCHY_INFO",
}


def _pkey_json(k: PKey) -> dict:
    return {
        "index": k.index,
        "pkey": f"0x{k.value:04x}" if k.value is not None else None,
        "membership": k.membership,
        "default": k.default,
    }


def _pkey_line(k: PKey) -> str:
    if k.value is None:
        return f"pkey index {k.index}: {render.UNKNOWN}"
    default = ", default partition" if k.default else ""
    return f"pkey index {k.index}: 0x{k.value:04x} {k.membership} member{default}"


def _sl2vl_text(table) -> str:
    return " ".join(f"{sl}:{render.UNKNOWN if vl is None else vl}" for sl, vl in enumerate(table))


def detail_lines(p: Port) -> list[str]:
    """What -d shows of a port under its line: the P_Key table (the populated slots; the empty
    ones counted), the VLs and the SL-to-VL mapping, automatic path migration."""
    lines = []
    if p.pkey_tbl_len is not None and p.pkeys is not None:
        slots = p.pkey_tbl_len
        empty = slots - len(p.pkeys)
        lines.append(f"pkeys {slots} slot{'s' * (slots != 1)}, {empty} empty")
        lines.extend(_pkey_line(k) for k in p.pkeys)
    if p.max_vl_num is not None:
        lines.append(f"max_vl_num {p.max_vl_num} ({VL_CAP.get(p.max_vl_num, 'reserved')})")
    if p.sl2vl is not None:
        lines.append(f"sl2vl {_sl2vl_text(p.sl2vl)}")
    if p.auto_path_mig is not None:
        lines.append(f"auto_path_mig {'yes' if p.auto_path_mig else 'no'}")
    return lines


def _sm_known(p: Port) -> bool:
    """An InfiniBand port with a link: its SM LID 0 is a fact (no subnet manager has swept
    it, so it stays INIT); down, or on Ethernet, there is no SM to name."""
    up = (PortState.INIT, PortState.ARMED, PortState.ACTIVE, PortState.ACTIVE_DEFER)
    return p.link_layer is LinkLayer.INFINIBAND and p.state in up


def _lids(p: Port) -> str | None:
    r = p.lid_range
    if r is None or r[0] == r[1]:
        return None
    return f"{r[0]}-{r[1]}"


def _bond_json(bond: Bond) -> dict:
    return {
        "mode": bond.mode,
        "active_slave": bond.active_slave,
        "slaves": [dataclasses.asdict(s) for s in bond.slaves],
    }


def _slave_text(s: dict, active: str | None) -> str:
    """A slave's name, with what an operator looks for: the one in use (modes with one active
    slave), one whose link is not up."""
    notes = ["active"] if s["name"] == active else []
    if s["mii_status"] is None:
        notes.append("unknown")
    elif s["mii_status"] != "up":
        notes.append(s["mii_status"])
    return s["name"] + (f"({','.join(notes)})" if notes else "")


def _bond_text(bond: dict) -> str:
    slaves = ",".join(_slave_text(s, bond["active_slave"]) for s in bond["slaves"]) or "none"
    return f"{bond['mode'] or render.UNKNOWN} slaves {slaves}"


FIELDS = [
    render.Field("ifname", lambda p: p.device, in_text=False),
    render.Field("port", lambda p: p.port, in_text=False),
    render.Field("state", lambda p: p.state.name if p.state is not None else None, always=True),
    render.Field(
        "physical_state",
        lambda p: p.physical_state.name if p.physical_state is not None else None,
        always=True,
    ),
    render.Field(
        "link_layer",
        lambda p: p.link_layer.label if p.link_layer is not None else None,
        always=True,
    ),
    render.Field("rate", lambda p: p.rate.text if p.rate else None, always=True),
    # Width and speed are inside the kernel's rate text already; JSON gives them as values.
    render.Field("rate_gbps", lambda p: p.rate.gbps if p.rate else None, in_text=False),
    render.Field("width", lambda p: p.rate.width if p.rate else None, in_text=False),
    render.Field("speed", lambda p: p.rate.speed if p.rate else None, in_text=False),
    render.Field("lid", lambda p: p.lid if p.lid else None),
    render.Field("lmc", lambda p: p.lmc if p.lid else None),
    render.Field(
        "lid_range",
        lambda p: list(p.lid_range) if _lids(p) else None,
        label="lids",
        text=lambda v: f"{v[0]}-{v[1]}",
    ),
    render.Field("sm_lid", lambda p: p.sm_lid if p.sm_lid or _sm_known(p) else None),
    render.Field("sm_sl", lambda p: p.sm_sl if p.sm_lid else None),
    render.Field("netdev", lambda p: p.netdev),
    render.Field("bond", lambda p: _bond_json(p.bond) if p.bond else None, text=_bond_text),
    render.Field("active_mtu", lambda p: p.active_mtu, details=True),
    render.Field("max_mtu", lambda p: p.max_mtu, details=True),
    render.Field("gid_tbl_len", lambda p: p.gid_tbl_len, details=True),
    render.Field("cap_mask", lambda p: p.cap_mask, details=True, text=lambda v: f"0x{v:08x}"),
    render.Field(
        "caps",
        lambda p: render.decode_flags(p.cap_mask, PORT_CAP_FLAGS) if p.cap_mask else None,
        details=True,
        text=",".join,
    ),
    # Shown in text by detail_lines, under the port's line.
    render.Field("pkey_tbl_len", lambda p: p.pkey_tbl_len, details=True, in_text=False),
    render.Field(
        "pkeys",
        lambda p: [_pkey_json(k) for k in p.pkeys] if p.pkeys is not None else None,
        details=True,
        in_text=False,
    ),
    render.Field("max_vl_num", lambda p: p.max_vl_num, details=True, in_text=False),
    render.Field(
        "vl_cap",
        lambda p: VL_CAP.get(p.max_vl_num) if p.max_vl_num is not None else None,
        details=True,
        in_text=False,
    ),
    render.Field(
        "sl2vl",
        lambda p: list(p.sl2vl) if p.sl2vl is not None else None,
        details=True,
        in_text=False,
    ),
    render.Field("auto_path_mig", lambda p: p.auto_path_mig, details=True, in_text=False),
]


def show(inv: Invocation) -> None:
    ports = inv.host.ports(selector(inv.args))
    if inv.json:
        rows = [render.record_json(p, FIELDS, inv.details) for p in ports]
        if inv.details:  # where each field came from: netlink, sysfs or verbs
            for row, p in zip(rows, ports):
                row["sources"] = p.sources
        inv.emit_json(rows)
        return
    for p in ports:
        inv.print(f"{p.device}/{p.port}: {render.record_line(p, FIELDS, inv.details)}")
        if inv.details:
            for line in detail_lines(p):
                inv.print(f"    {line}")
