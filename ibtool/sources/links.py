"""Software RDMA devices (rxe, siw) created on a netdev and deleted, as `rdma link add/delete`
does (RDMA_NLDEV_CMD_NEWLINK, DELLINK), through the netlink session the Host gives (with the
kernel's release, and whether it is older than LINK_SINCE); what the kernel's refusals mean
(drivers/infiniband/core/nldev.c nldev_newlink and nldev_dellink, the drivers' newlink)."""

from __future__ import annotations

import errno
import socket

from ibtool.errors import IbtoolError, NotFoundError, UnsupportedError

# Where the kernel takes the netlink RDMA link commands from (iproute2: "from 5.1-rc1").
LINK_SINCE = (5, 1)
MODULES = {"rxe": "rdma_rxe", "siw": "siw"}


def _too_old(release: str, command: str, e: IbtoolError) -> UnsupportedError:
    return UnsupportedError(
        f"this kernel ({release}) cannot {command}: that needs Linux 5.1 or later",
        "on older kernels, rxe devices come from the rxe_cfg script of rdma-core",
        errno=e.errno,
    )


def _netdevs() -> str:
    names = sorted(name for _, name in socket.if_nameindex())
    return ", ".join(names) or "none"


def add(nl, release: str, too_old: bool, name: str, link_type: str, netdev: str) -> None:
    """A `link_type` device called `name` on `netdev`, through the netlink session `nl` of a
    kernel of `release` (`too_old`: before LINK_SINCE)."""
    if name in nl.indexes():
        raise IbtoolError(
            f"an RDMA device named {name} exists already",
            "choose another name, or delete it first: ibtool link delete " + name,
            errno=errno.EEXIST,
        )
    try:
        nl.new_link(name, link_type, netdev)
    except IbtoolError as e:
        raise _add_error(release, too_old, e, nl, name, link_type, netdev) from e


def _add_error(
    release: str, too_old: bool, e: IbtoolError, nl, name: str, link_type: str, netdev: str
) -> IbtoolError:
    """What NEWLINK's errno means."""
    if e.errno == errno.ENODEV:
        return NotFoundError(f"no netdev {netdev!r}", f"netdevs here: {_netdevs()}", errno=e.errno)
    if e.errno == errno.EEXIST:
        owner = nl.device_of_netdev(netdev)
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
        if too_old:
            return _too_old(release, "create RDMA links (RDMA_NLDEV_CMD_NEWLINK)", e)
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


def delete(nl, release: str, too_old: bool, name: str) -> None:
    """The rxe or siw device `name`, unregistered (`nl`, `release`, `too_old` as add's)."""
    indexes = nl.indexes()
    if name not in indexes:
        raise NotFoundError(
            f"unknown device {name!r}", f"devices here: {', '.join(indexes) or 'none'}"
        )
    try:
        nl.delete_link(indexes[name])
    except IbtoolError as e:
        if e.errno != errno.EINVAL:
            raise
        if too_old:
            raise _too_old(release, "delete RDMA links (RDMA_NLDEV_CMD_DELLINK)", e) from e
        # nldev_dellink: only devices registered with IBK_ALLOW_USER_UNREG (rxe, siw)
        raise IbtoolError(
            f"cannot delete {name}: only rxe and siw devices can be deleted",
            "a hardware device goes away with its driver (modprobe -r) or its PCI function",
            errno=e.errno,
        ) from e
