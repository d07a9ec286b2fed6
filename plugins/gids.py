"""`ibtool gids`: the GID table done right, and `--best`, the RoCE v2 GID index to use."""

from __future__ import annotations

import ipaddress

from ibtool import hookimpl, render
from ibtool.commands import Invocation, add_selector, selector
from ibtool.errors import CommandFailed, UsageError
from ibtool.model import Gid, GidType, LinkLayer, PortState

FIELDS = [
    render.Field("ifname", lambda g: g.device, header="DEV"),
    render.Field("port", lambda g: g.port, header="PORT"),
    render.Field("index", lambda g: g.index, header="INDEX"),
    render.Field("gid", lambda g: g.gid, header="GID"),
    render.Field(
        "type", lambda g: g.type.label if g.type is not None else None, header="TYPE", always=True
    ),
    render.Field("netdev", lambda g: g.netdev, header="NETDEV"),
    render.Field("vlan", lambda g: g.vlan, header="VLAN"),
    render.Field("ip", lambda g: g.ip, header="IP"),
]

TYPE_CHOICES = {"ib": GidType.IB, "v1": GidType.ROCE_V1, "v2": GidType.ROCE_V2}


def _ip(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def configure(parser) -> None:
    add_selector(parser)
    parser.add_argument("--type", choices=sorted(TYPE_CHOICES), help="only GIDs of this type")
    parser.add_argument("--netdev", help="only GIDs of this netdev")
    parser.add_argument("--ip", help="only the GID of this IPv4 or IPv6 address")
    parser.add_argument("--port", type=int, help="only GIDs of this port number")
    parser.add_argument(
        "--best",
        nargs="?",
        const="",
        metavar="NETDEV|IP",
        help="print the one GID index to use for RoCE v2 (on NETDEV, or for IP)",
    )


def _filtered(gids: list[Gid], args) -> list[Gid]:
    if args.type:
        gids = [g for g in gids if g.type == TYPE_CHOICES[args.type]]
    if args.netdev:
        gids = [g for g in gids if g.netdev == args.netdev]
    if args.ip:
        ip = _ip(args.ip)
        if ip is None:
            raise UsageError(f"--ip {args.ip}: not an IP address")
        gids = [g for g in gids if g.ip == ip]
    if args.port is not None:
        gids = [g for g in gids if g.port == args.port]
    return gids


def _family_rank(g: Gid) -> int:
    # IPv4 first (what NCCL and perftest users mean), then routable IPv6, link-local last.
    if g.ip is None:
        return 3
    addr = ipaddress.ip_address(g.ip)
    if addr.version == 4:
        return 0
    return 2 if addr.is_link_local else 1


def best_gid(inv: Invocation, target: str) -> Gid:
    """The RoCE v2 GID to use on a netdev or for an address: the rule `--best` prints."""
    host = inv.host
    sel = selector(inv.args)
    gids = host.gids(sel)
    ports = {(p.device, p.port): p for p in host.ports(sel)}
    vlans = host.sysfs.vlans()
    ip = _ip(target) if target else None
    if ip:
        matches = [g for g in gids if g.ip == ip]
        what = f"address {ip}"
    elif target:
        matches = [g for g in gids if g.netdev == target]
        what = f"netdev {target}"
    else:
        # No target: the netdevs themselves, not their VLANs.
        matches = [g for g in gids if g.netdev not in vlans]
        what = "any port"
    candidates = [g for g in _filtered(matches, inv.args) if g.type == GidType.ROCE_V2]
    if candidates:

        def rank(g: Gid):
            port = ports.get((g.device, g.port))
            down = port is None or port.state != PortState.ACTIVE
            return (down, g.netdev in vlans, _family_rank(g), g.device, g.port, g.index)

        return min(candidates, key=rank)
    raise CommandFailed(
        f"no RoCE v2 GID for {what}", _why_none(gids, matches, target, ip, ports, vlans)
    )


def _why_none(gids, matches, target, ip, ports, vlans) -> str:
    if matches:
        types = sorted({g.type.label for g in matches if g.type is not None})
        if all(
            ports.get((g.device, g.port))
            and ports[(g.device, g.port)].link_layer == LinkLayer.INFINIBAND
            for g in matches
        ):
            return "the port is InfiniBand: address it by LID; it has no RoCE GIDs"
        return f"only {', '.join(types)} GIDs there; RoCE v2 needs a kernel with RoCE v2 enabled"
    if ip:
        return (
            "no RDMA port has that address: configure it on the RDMA netdev "
            "(ip addr add ADDR dev NETDEV); GIDs follow the netdev's addresses"
        )
    netdevs = sorted({g.netdev for g in gids if g.netdev})
    if target:
        uppers = sorted(v for v, (_, lower) in vlans.items() if lower == target)
        if uppers and any(g.netdev in uppers for g in gids):
            return f"its VLANs have GIDs: ask for one of them: --best {uppers[0]}"
        return f"RDMA netdevs here: {', '.join(netdevs) or 'none'}"
    return "no RoCE port has an IP address configured on its netdev"


def run(inv: Invocation) -> int | None:
    if inv.args.best is not None:
        g = best_gid(inv, inv.args.best)
        if inv.json:
            inv.emit_json(render.record_json(g, FIELDS, inv.details))
        else:
            inv.print(str(g.index))
        return None
    gids = _filtered(inv.host.gids(selector(inv.args)), inv.args)
    if inv.json:
        inv.emit_json([render.record_json(g, FIELDS, inv.details) for g in gids])
    else:
        for line in render.table(gids, FIELDS, inv.details):
            inv.print(line)
    return None


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "gids",
        run,
        help="show GID tables; --best picks the RoCE v2 GID index",
        configure=configure,
        aliases=("gid",),
    )
