"""`ibtool port` (alias `link`): state, rate, LIDs and netdev of every RDMA port; and, as
`rdma link add/delete` does, software RDMA devices (rxe, siw) created on a netdev and deleted
(NEWLINK, DELLINK over netlink)."""

from __future__ import annotations

import errno
import socket

from ibtool import hookimpl, render
from ibtool.commands import Invocation, add_selector, selector
from ibtool.errors import IbtoolError, NotFoundError, UnsupportedError, UsageError
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
# Where the kernel takes the netlink RDMA link commands from (iproute2: "from 5.1-rc1").
LINK_SINCE = (5, 1)
IB_DEVICE_NAME_MAX = 64  # include/rdma/ib_verbs.h, with the terminating NUL
MODULES = {"rxe": "rdma_rxe", "siw": "siw"}


def _too_old(host: Host, command: str, e: IbtoolError) -> UnsupportedError:
    return UnsupportedError(
        f"this kernel ({host.kernel_release()}) cannot {command}: that needs Linux 5.1 or later",
        "on older kernels, rxe devices come from the rxe_cfg script of rdma-core",
        errno=e.errno,
    )


def _netdevs() -> str:
    names = sorted(name for _, name in socket.if_nameindex())
    return ", ".join(names) or "none"


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
    link_type, netdev = options["type"], options["netdev"]
    from ibtool.sources.netlink import NldevClient

    with NldevClient() as nl:
        devices = {r.get("RDMA_NLDEV_ATTR_DEV_NAME"): r for r in nl.devices()}
        if name in devices:
            raise IbtoolError(
                f"an RDMA device named {name} exists already",
                "choose another name, or delete it first: ibtool link delete " + name,
                errno=errno.EEXIST,
            )
        try:
            nl.new_link(name, link_type, netdev)
        except IbtoolError as e:
            raise _add_error(host, e, nl, name, link_type, netdev) from e


def _add_error(
    host: Host, e: IbtoolError, nl, name: str, link_type: str, netdev: str
) -> IbtoolError:
    """What NEWLINK's errno means (drivers/infiniband/core/nldev.c nldev_newlink, the drivers'
    newlink)."""
    if e.errno == errno.ENODEV:
        return NotFoundError(f"no netdev {netdev!r}", f"netdevs here: {_netdevs()}", errno=e.errno)
    if e.errno == errno.EEXIST:
        owner = _device_on(nl, netdev)
        return IbtoolError(
            f"{netdev} has an {link_type} device already" + (f" ({owner})" if owner else ""),
            f"the {link_type} driver takes one device per netdev: delete it first "
            f"(ibtool link delete {owner or 'DEV'}) or use another netdev",
            errno=e.errno,
        )
    if e.errno == errno.ENFILE:  # ib_register_device: the name was taken meanwhile
        return IbtoolError(
            f"an RDMA device named {name} exists already", "choose another name", errno=e.errno
        )
    from ibtool.sources.netlink.features import has_cap_net_admin

    if e.errno == errno.EPERM and has_cap_net_admin():
        # rxe_newlink: "rxe creation allowed on top of a real device only"
        return IbtoolError(
            f"the {link_type} driver refused {netdev}: Operation not permitted",
            "rxe devices go on a real netdev, not on a VLAN device; the VLAN's addresses "
            "appear in the GID table of the device on the netdev below it",
            errno=e.errno,
        )
    if e.errno == errno.EINVAL:
        if host.kernel_before(*LINK_SINCE):
            return _too_old(host, "create RDMA links (RDMA_NLDEV_CMD_NEWLINK)", e)
        module = MODULES.get(link_type)
        return UnsupportedError(
            f"link type {link_type!r} is not available in this kernel",
            f"the kernel found no driver for it: modprobe {module} says why (Debian's kernels "
            "build rxe, not siw)"
            if module
            else "the link types are rxe (Soft-RoCE) and siw (Soft-iWARP)",
            errno=e.errno,
        )
    return e


def _device_on(nl, netdev: str) -> str | None:
    """The RDMA device whose port serves `netdev`, if netlink says."""
    try:
        for device in nl.devices():
            for port in nl.ports(device["RDMA_NLDEV_ATTR_DEV_INDEX"]):
                if port.get("RDMA_NLDEV_ATTR_NDEV_NAME") == netdev:
                    return device.get("RDMA_NLDEV_ATTR_DEV_NAME")
    except (IbtoolError, KeyError):
        pass
    return None


def _link_delete(host: Host, words: list[str]) -> None:
    if len(words) != 1:
        raise UsageError("link delete takes one device name", LINK_USAGE)
    (name,) = words
    from ibtool.sources.netlink import NldevClient

    with NldevClient() as nl:
        indexes = {
            r["RDMA_NLDEV_ATTR_DEV_NAME"]: r["RDMA_NLDEV_ATTR_DEV_INDEX"]
            for r in nl.devices()
            if "RDMA_NLDEV_ATTR_DEV_NAME" in r and "RDMA_NLDEV_ATTR_DEV_INDEX" in r
        }
        if name not in indexes:
            raise NotFoundError(
                f"unknown device {name!r}", f"devices here: {', '.join(indexes) or 'none'}"
            )
        try:
            nl.delete_link(indexes[name])
        except IbtoolError as e:
            if e.errno != errno.EINVAL:
                raise
            if host.kernel_before(*LINK_SINCE):
                raise _too_old(host, "delete RDMA links (RDMA_NLDEV_CMD_DELLINK)", e) from e
            # nldev_dellink: only devices registered with IBK_ALLOW_USER_UNREG (rxe, siw)
            raise IbtoolError(
                f"cannot delete {name}: only rxe and siw devices can be deleted",
                "a hardware device goes away with its driver (modprobe -r) or its PCI function",
                errno=e.errno,
            ) from e


def run(inv: Invocation) -> None:
    words = list(inv.args.words)
    if words and words[0] in ("add", "delete"):
        inv.host.require_live(f"link {words[0]} changes the running kernel", "--root is a copy")
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
