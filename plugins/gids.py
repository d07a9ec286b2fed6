"""`ibtool gids`: the GID table done right, and `--best`, the RoCE v2 GID index to use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibtool.api import (
    Invocation,
    UsageError,
    add_selector,
    hookimpl,
    number,
    render,
    selector,
)

if TYPE_CHECKING:  # the records and the GID rule are imported where `gids` runs
    from ibtool.api import Gid

FIELDS = [
    render.Field("ifname", lambda g: g.device, header="DEV"),
    render.Field("port", lambda g: g.port, header="PORT"),
    render.Field("index", lambda g: g.index, header="INDEX"),
    render.Field("gid", lambda g: g.gid, header="GID"),
    render.Field("type", lambda g: g.type.label if g.type is not None else None, header="TYPE"),
    render.Field("netdev", lambda g: g.netdev, header="NETDEV"),
    render.Field("vlan", lambda g: g.vlan, header="VLAN"),
    render.Field("ip", lambda g: g.ip, header="IP"),
]

BEST_PORT_FIELDS = ("state", "link_layer", "netdev")
PORT = (0, 255)
TYPE_CHOICES = {"ib": "IB", "v1": "ROCE_V1", "v2": "ROCE_V2"}  # --type: GidType's names


def configure(parser) -> None:
    add_selector(parser)
    parser.add_argument("--type", choices=sorted(TYPE_CHOICES), help="only GIDs of this type")
    parser.add_argument("--netdev", help="only GIDs of this netdev")
    parser.add_argument("--ip", help="only the GID of this IPv4 or IPv6 address")
    # Ports are numbered in 8 bits (rdma-core libibverbs/verbs.h: uint8_t port_num); 0 is a
    # switch's management port.
    parser.add_argument("--port", type=number(int, *PORT), help="only GIDs of this port number")
    parser.add_argument(
        "--best",
        nargs="?",
        const="",
        metavar="NETDEV|IP",
        help="print the one GID index to use for RoCE v2 (on NETDEV, or for IP)",
    )


def _filtered(gids: list[Gid], args) -> list[Gid]:
    from ibtool.api import GidType, as_ip

    if args.type:
        gids = [g for g in gids if g.type == GidType[TYPE_CHOICES[args.type]]]
    if args.netdev:
        gids = [g for g in gids if g.netdev == args.netdev]
    if args.ip:
        ip = as_ip(args.ip)
        if ip is None:
            raise UsageError(f"--ip {args.ip}: not an IP address")
        gids = [g for g in gids if g.ip == ip]
    if args.port is not None:
        gids = [g for g in gids if g.port == args.port]
    return gids


def run(inv: Invocation) -> int | None:
    if inv.args.best is not None:
        from ibtool.api import best_gid

        sel = selector(inv.args)
        # The rule needs the ports' state, link layer and netdev, nothing it would not show.
        ports = {(p.device, p.port): p for p in inv.host.ports(sel, BEST_PORT_FIELDS)}
        gids = _filtered(inv.host.gids(sel), inv.args)
        iwarp = frozenset(d for d in {p.device for p in ports.values()} if inv.host.is_iwarp(d))
        g = best_gid(gids, ports, inv.host.vlans(), inv.args.best, iwarp)
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
