"""The RoCE v2 GID a RoCE application should use on a netdev or for an address.

The question NCCL and perftest users get wrong most often; `ibtool gids --best` prints the
answer and the data-path commands use it when no GID index is given.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

from ibtool.errors import CommandFailed
from ibtool.model.records import Gid, GidType, LinkLayer, Port, PortState


def _family_rank(g: Gid) -> int:
    # IPv4 first (what NCCL and perftest users mean), then routable IPv6, link-local last.
    if g.ip is None:
        return 3
    addr = ipaddress.ip_address(g.ip)
    if addr.version == 4:
        return 0
    return 2 if addr.is_link_local else 1


def as_ip(text: str) -> str | None:
    """The address as GIDs show it: an IPv4-mapped IPv6 address (::ffff:a.b.c.d) is its IPv4
    address, as the kernel's RoCE GID of an IPv4 address is (infiniband/core/roce_gid_mgmt.c).
    """
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if addr.version == 6 and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def best_gid(
    gids: Iterable[Gid],
    ports: Mapping[tuple[str, int], Port],
    vlans: Mapping[str, tuple[int, str]],
    target: str = "",
    iwarp_devices: frozenset[str] = frozenset(),
) -> Gid:
    """RoCE v2 only; ACTIVE ports first; IPv4, then routable IPv6, then link-local; the netdev
    itself before its VLANs unless the VLAN netdev (or its address) is asked for.

    `target` is a netdev name, an IP address, or empty for any port. `ports` are the ports
    the GIDs belong to (their netdevs and link layers explain a miss). Raises CommandFailed
    with the reason when there is no such GID.
    """
    gids = list(gids)
    ip = as_ip(target) if target else None
    if ip:
        matches = [g for g in gids if g.ip == ip]
        what = f"address {ip}"
    elif target:
        matches = [g for g in gids if g.netdev == target]
        what = f"netdev {target}"
    else:
        matches = [g for g in gids if g.netdev not in vlans]
        what = "any port"
    candidates = [g for g in matches if g.type == GidType.ROCE_V2]
    if candidates:

        def rank(g: Gid):
            port = ports.get((g.device, g.port))
            down = port is None or port.state != PortState.ACTIVE
            return (down, g.netdev in vlans, _family_rank(g), g.device, g.port, g.index)

        return min(candidates, key=rank)
    raise CommandFailed(
        f"no RoCE v2 GID for {what}",
        _why_none(gids, matches, target, ip, ports, vlans, iwarp_devices),
    )


_IB_HINT = "InfiniBand ports have no RoCE GIDs: address {} by LID"
_IWARP_HINT = "iWARP ports have no RoCE GIDs: iWARP connects through rdma_cm by IP address"


def _why_none(gids, matches, target, ip, ports, vlans, iwarp_devices) -> str:
    # An IPoIB netdev: its port is InfiniBand and its GIDs name no netdev.
    behind = [p for p in ports.values() if target and p.netdev == target]
    if behind and all(p.link_layer == LinkLayer.INFINIBAND for p in behind):
        return _IB_HINT.format(f"{behind[0].device}/{behind[0].port}")
    if matches and all(g.device in iwarp_devices for g in matches):
        return _IWARP_HINT
    if matches:
        if all(
            (p := ports.get((g.device, g.port))) is not None
            and p.link_layer == LinkLayer.INFINIBAND
            for g in matches
        ):
            return _IB_HINT.format("the port")
        types = sorted({g.type.label for g in matches if g.type is not None})
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
