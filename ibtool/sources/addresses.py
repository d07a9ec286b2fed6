"""The running kernel's IPv4 addresses per netdev (RTM_GETADDR through pyroute2), for what
only the whole host shows: several NICs with an address in one subnet, where strict reverse
path filtering and ARP flux break RoCE v2 (Documentation/networking/ip-sysctl.rst, rp_filter
and arp_ignore; rdma-core Documentation/librdmacm.md)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable


def _dump() -> list[tuple[str, str, int]]:
    from pyroute2 import IPRoute  # imported only when asked: ~0.25 s

    with IPRoute() as ipr:
        out = []
        for msg in ipr.get_addr(family=socket.AF_INET):
            address = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
            label = msg.get_attr("IFA_LABEL")
            if address and label:
                out.append((label.split(":")[0], address, int(msg["prefixlen"])))
        return out


def ipv4_addresses(dump: Callable[[], Iterable[tuple[str, str, int]]] = _dump):
    """(netdev, address, prefix length) of every IPv4 address; raises OSError when the kernel
    cannot be asked."""
    return list(dump())


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
