"""Netdevs, VLANs and bonds: what the RDMA readers need of /sys/class/net and /proc/net/vlan."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ibtool.model.records import Bond, BondSlave
from ibtool.sources.sysfs.files import SysfsFiles, read_attr
from ibtool.sources.sysfs.values import (
    is_number,
    parse_decimal,
    parse_netdev,
    quoted,
    valid_netdev_name,
)

BOND_FILES = ("mode", "slaves", "active_slave")  # under /sys/class/net/BOND/bonding
BOND_SLAVE_FILES = ("state", "mii_status")  # under /sys/class/net/SLAVE/bonding_slave
BOND_SLAVE_STATES = ("active", "backup")
BOND_MII = ("up", "going down", "down", "going back")


def _parse_bond_mode(text: str) -> str:
    name, number = text.split(" ")
    if not name or not number.isdigit():
        raise ValueError(text)
    return name


def _parse_netdev_list(text: str) -> tuple[str, ...]:
    names = tuple(text.split())
    if not all(valid_netdev_name(n) for n in names) or len(set(names)) != len(names):
        raise ValueError(text)
    return names


def _parse_optional_netdev(text: str) -> str:
    return parse_netdev(text) if text else ""


def _parse_word(words: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in words:
            raise ValueError(text)
        return text

    return parse


class NetFiles(SysfsFiles):
    """The netdev side of a sysfs tree: VLANs (read once), bonds, carrier changes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._vlans: dict[str, tuple[int, str]] | None = None
        # The running kernel's tree (root "/", as Host decides "live"): where the VLANs file
        # is root's alone, rtnetlink is asked instead. A --root tree or a snapshot has only
        # files: never the kernel.
        self.live_kernel = self.root == "/"
        # What opens the NETLINK_ROUTE socket (tests give theirs); None: the kernel's.
        self.route_socket: Callable[[], Any] | None = None

    def vlans(self) -> dict[str, tuple[int, str]]:
        """VLAN netdev -> (VLAN id, lower netdev), from /proc/net/vlan/config (8021q's
        vlan_seq_show: two header lines, then 'NAME | VID | LOWER' per VLAN). 8021q makes it
        root's, mode 0600: where it cannot be read (EACCES, an unprivileged exporter) on the
        running kernel, from rtnetlink instead (RTM_GETLINK, which any user may dump)."""
        if self._vlans is None:
            self._vlans = {}
            path = os.path.join(self.root, "proc", "net", "vlan", "config")
            try:
                text = read_attr(path, self.fs)
            except FileNotFoundError:
                if self.fs.islink(path):
                    self.bad(path, "dangling link")
                return self._vlans  # no 8021q module
            except PermissionError as e:
                if self.live_kernel:
                    self._vlans_from_rtnetlink(path, e)
                else:
                    self.bad(path, f"cannot read: {e.strerror or e}")
                return self._vlans
            except OSError as e:
                self.bad(path, f"cannot read: {e.strerror or e}")
                return self._vlans
            lines = text.splitlines()
            if not lines or not lines[0].startswith("VLAN Dev name"):
                self.bad(path, f"malformed value {quoted(text)}")
                return self._vlans
            malformed = None
            for line in lines[2:]:
                parts = [s.strip() for s in line.split("|")]
                if (
                    len(parts) == 3
                    and is_number(parts[1])
                    and int(parts[1]) <= 4095
                    and valid_netdev_name(parts[0])
                    and valid_netdev_name(parts[2])
                ):
                    self._vlans[parts[0]] = (int(parts[1]), parts[2])
                elif malformed is None:
                    malformed = line
            if malformed is not None:
                self.bad(path, f"malformed line {quoted(malformed)}")
        return self._vlans

    def _vlans_from_rtnetlink(self, path: str, denied: OSError) -> None:
        """The VLANs of an RTM_GETLINK dump into self._vlans, checked as the file's lines are
        (a name the kernel accepts, an id of 12 bits, a known lower netdev); a failure is
        one warning naming the file and why rtnetlink could not stand in."""
        from ibtool.sources import rtnetlink  # lazily: most commands never need it

        try:
            links = rtnetlink.vlan_links(self.route_socket or rtnetlink.open_route_socket)
        except OSError as e:
            self.bad(
                path,
                f"cannot read: {denied.strerror or denied}; "
                f"nor ask rtnetlink (RTM_GETLINK): {e.strerror or e}",
            )
            return
        malformed = None
        for name, vid, lower in links:
            if (
                vid <= 4095
                and valid_netdev_name(name)
                and lower is not None
                and valid_netdev_name(lower)
            ):
                self._vlans[name] = (vid, lower)
            elif malformed is None:
                over = "an ifindex not in the dump" if lower is None else quoted(lower)
                malformed = f"VLAN {quoted(name)} id {vid} over {over}"
        if malformed is not None:
            self.bad("rtnetlink RTM_GETLINK", f"malformed {malformed}")

    def bond(self, netdev: str) -> Bond | None:
        """The bond `netdev` is, from its bonding/ directory; None when it is not a bond.

        bond_sysfs.c: mode "NAME NUMBER", slaves "A B ..." (an empty line without slaves),
        active_slave the name or nothing; bond_sysfs_slave.c, per slave: state "active" or
        "backup", mii_status "up", "going down", "down" or "going back"."""
        bonding = os.path.join(self.root, "sys", "class", "net", netdev, "bonding")
        if not self.fs.isdir(bonding):
            return None
        mode = self.parsed(os.path.join(bonding, "mode"), _parse_bond_mode)
        names = self.parsed(os.path.join(bonding, "slaves"), _parse_netdev_list) or ()
        active = self.parsed(
            os.path.join(bonding, "active_slave"), _parse_optional_netdev, required=False
        )
        slaves = []
        for name in names:
            slave_dir = os.path.join(self.root, "sys", "class", "net", name, "bonding_slave")
            state = self.parsed(os.path.join(slave_dir, "state"), _parse_word(BOND_SLAVE_STATES))
            mii = self.parsed(os.path.join(slave_dir, "mii_status"), _parse_word(BOND_MII))
            slaves.append(BondSlave(name, state, mii))
        return Bond(netdev, mode, tuple(slaves), active or None)

    def carrier_changes(self, netdev: str) -> int | None:
        """How often the netdev's carrier went up or down since it was created
        (/sys/class/net/NETDEV/carrier_changes, Linux 3.15); None where unreadable."""
        path = os.path.join(self.root, "sys", "class", "net", netdev, "carrier_changes")
        return self.parsed(path, parse_decimal(1 << 64), required=False)
