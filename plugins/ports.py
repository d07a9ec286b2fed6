"""`ibtool port` (alias `link`): state, rate, LIDs and netdev of every RDMA port; and, as
`rdma link add/delete` does, software RDMA devices (rxe, siw) created on a netdev and deleted
(NEWLINK, DELLINK over netlink)."""

from __future__ import annotations

from ibtool import hookimpl, links, render
from ibtool.commands import Invocation, add_selector, selector
from ibtool.errors import UsageError
from ibtool.host import Host
from ibtool.model import Port

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


def _lids(p: Port) -> str | None:
    r = p.lid_range
    if r is None or r[0] == r[1]:
        return None
    return f"{r[0]}-{r[1]}"


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
    render.Field("sm_lid", lambda p: p.sm_lid if p.sm_lid else None),
    render.Field("sm_sl", lambda p: p.sm_sl if p.sm_lid else None),
    render.Field("netdev", lambda p: p.netdev),
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
]


LINK_USAGE = (
    "ibtool link [show] [DEV[/PORT]] | ibtool link add NAME type { rxe | siw } netdev NETDEV "
    "| ibtool link delete NAME"
)
IB_DEVICE_NAME_MAX = 64  # include/rdma/ib_verbs.h, with the terminating NUL


def _link_add(host: Host, words: list[str]) -> None:
    if not words:
        raise UsageError("link add takes NAME type TYPE netdev NETDEV", LINK_USAGE)
    name, rest = words[0], words[1:]
    options: dict[str, str] = {}
    while rest:
        key = rest.pop(0)
        if key not in ("type", "netdev") or not rest or key in options:
            raise UsageError(f"link add: unexpected {key!r}", LINK_USAGE)
        options[key] = rest.pop(0)
    if set(options) != {"type", "netdev"}:
        missing = " and ".join(k for k in ("type", "netdev") if k not in options)
        raise UsageError(f"link add {name}: {missing} missing", LINK_USAGE)
    # The kernel refuses '%' (a name pattern) and empty names; '/' cannot be a sysfs name.
    if not name or "%" in name or "/" in name or len(name.encode()) >= IB_DEVICE_NAME_MAX:
        raise UsageError(
            f"bad device name {name!r}",
            f"at most {IB_DEVICE_NAME_MAX - 1} bytes, without '%' or '/', e.g. rxe1",
        )
    links.add(host, name, options["type"], options["netdev"])


def _link_delete(host: Host, words: list[str]) -> None:
    if len(words) != 1:
        raise UsageError("link delete takes one device name", LINK_USAGE)
    links.delete(host, words[0])


def run(inv: Invocation) -> None:
    words = list(inv.args.words)
    if words and words[0] in ("add", "delete"):
        (_link_add if words[0] == "add" else _link_delete)(inv.host, words[1:])
        return
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


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "port",
        run,
        help="show RDMA ports: state, rate, LIDs, netdev; add or delete rxe/siw links",
        configure=add_selector,
        aliases=("link",),
    )
