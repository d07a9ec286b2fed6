"""The running kernel's IPv4 addresses per netdev (RTM_GETADDR, sources/rtnetlink.py), for what
only the whole host shows: several NICs with an address in one subnet, where strict reverse
path filtering and ARP flux break RoCE v2 (Documentation/networking/ip-sysctl.rst, rp_filter
and arp_ignore; rdma-core Documentation/librdmacm.md)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable


def ipv4_addresses(dump: Callable[[], Iterable[tuple[str, str, int]]] | None = None):
    """(netdev, address, prefix length) of every IPv4 address; raises OSError when the kernel
    cannot be asked."""
    from ibtool.sources.rtnetlink import ipv4_addresses as dump_addresses

    return list((dump or dump_addresses)())


def same_subnet(netdev: str, addresses: Iterable[tuple[str, str, int]]) -> tuple[str, ...]:
    """The other netdevs with an address in a subnet of one of `netdev`'s addresses."""
    addresses = list(addresses)
    nets = [ipaddress.ip_interface(f"{a}/{p}").network for n, a, p in addresses if n == netdev]
    others = {
        n
        for n, a, _ in addresses
        if n != netdev and any(ipaddress.ip_address(a) in net for net in nets)
    }
    return tuple(sorted(others))
