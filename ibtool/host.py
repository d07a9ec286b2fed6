"""One facade over the sources: selection by DEV[/PORT], per-device fault isolation, merging.

The sources are sysfs (always), verbs (only with details on the live host) and RDMA netlink
(on the live host, for what sysfs does not show).
"""

from __future__ import annotations

import dataclasses
import platform
import re
from collections.abc import Callable
from typing import Any

from ibtool.errors import IbtoolError, NotFoundError, NotLiveError, UsageError
from ibtool.model import CounterSample, Device, Gid, LinkLayer, Port
from ibtool.sources.sysfs import PORT_DETAILS, PORT_FIELDS, PORT_NETDEV, SysfsSource


def parse_selector(selector: str) -> tuple[str, int | None]:
    """'mlx5_0' -> ('mlx5_0', None); 'mlx5_0/1' -> ('mlx5_0', 1)."""
    name, sep, port = selector.partition("/")
    if not name or (sep and not port.isdigit()):
        raise UsageError(f"bad device selector {selector!r}", "use DEV or DEV/PORT, e.g. mlx5_0/1")
    return name, int(port) if sep else None


class Host:
    def __init__(
        self,
        root: str = "/",
        warn: Callable[[str], None] | None = None,
        details: bool = False,
        *,
        sysfs: SysfsSource | None = None,
    ):
        """`sysfs`: the source to read instead of root's (tests give the live host a tree)."""
        self.warn = warn or (lambda message: None)
        self.root = root
        self.details = details
        self.live = root == "/"  # the running kernel: netlink and verbs can be asked too
        self.sysfs = sysfs or SysfsSource(root, self.warn)
        self._verbs: Any = None
        self._verbs_error: IbtoolError | None = None

    # -- the running kernel ------------------------------------------------------------------

    def require_live(
        self, what: str, why: str = "--root trees hold only sysfs", hint: str | None = None
    ) -> None:
        """The one check for what only the running kernel can answer or do: NotLiveError
        (a usage error) under --root, saying what was asked and why a tree cannot."""
        if not self.live:
            raise NotLiveError(f"{what}; {why}", hint)

    @staticmethod
    def kernel_release() -> str:
        return platform.release()

    def kernel_before(self, major: int, minor: int) -> bool:
        """Whether the running kernel is older than major.minor; False when its release string
        does not start with a version (a custom build): the kernel's answer decides then."""
        m = re.match(r"(\d+)\.(\d+)", self.kernel_release())
        return m is not None and (int(m.group(1)), int(m.group(2))) < (major, minor)

    # -- selection ---------------------------------------------------------------------------

    def select(self, selector: str | None) -> list[tuple[str, int | None]]:
        """The (device, port) pairs a selector names; port None means every port."""
        names = self.sysfs.device_names()
        if not selector:
            return [(n, None) for n in names]
        name, port = parse_selector(selector)
        if name not in names:
            raise NotFoundError(f"unknown device {name!r}", f"devices here: {', '.join(names)}")
        if port is not None:
            ports = self.sysfs.port_numbers(name)
            if port not in ports:
                have = ", ".join(f"{name}/{p}" for p in ports) or "none"
                raise NotFoundError(f"{name} has no port {port}", f"ports of {name}: {have}")
        return [(name, port)]

    # -- records -----------------------------------------------------------------------------

    def devices(self, selector: str | None = None) -> list[Device]:
        devices = [
            self.sysfs.device(name, details=self.details) for name, _ in self.select(selector)
        ]
        if not self._merging():
            return devices
        with _NetlinkRecords(self) as nl:
            return [nl.merge_device(d) for d in devices]

    def ports(
        self, selector: str | None = None, fields: tuple[str, ...] | None = None
    ) -> list[Port]:
        """Ports with `fields` read from sysfs (default: what `port` shows, with -d the details
        too); a command that shows less asks for less, and so warns only about what it shows."""
        if fields is None:
            fields = PORT_FIELDS + PORT_NETDEV + (PORT_DETAILS if self.details else ())
        ports = []
        for name, port in self.select(selector):
            numbers = [port] if port is not None else self.sysfs.port_numbers(name)
            ports.extend(self._with_verbs(self.sysfs.port(name, p, fields)) for p in numbers)
        if not self._merging():
            return ports
        with _NetlinkRecords(self) as nl:
            return [nl.merge_port(p) for p in ports]

    def _merging(self) -> bool:
        """Under -d on the live host, devices and ports are what netlink says where it answers,
        sysfs (and verbs) for the rest, each field with its source. Without -d: sysfs alone,
        which needs no netlink library and is as fast as a directory walk."""
        return self.details and self.live

    def gids(self, selector: str | None = None) -> list[Gid]:
        gids = []
        for name, port in self.select(selector):
            numbers = [port] if port is not None else self.sysfs.port_numbers(name)
            iwarp = self.is_iwarp(name)
            for p in numbers:
                link_layer = self.sysfs.link_layer(name, p)
                gids.extend(self.sysfs.gids(name, p, link_layer, iwarp=iwarp))
        return gids

    def counters(self, selector: str | None = None) -> list[CounterSample]:
        """Counters of the selected ports; with a whole device, its device-wide ones too.

        sysfs gives the PMA and driver counters; on the live host netlink STAT_GET adds the
        driver counters sysfs does not show: enabled optional counters (never in sysfs) and,
        where sysfs lacks hw_counters/, all of them."""
        samples = []
        netlink = _NetlinkCounters(self) if self.live else None
        try:
            for name, port in self.select(selector):
                if port is None:
                    samples.extend(self.sysfs.counters(name, 0))
                numbers = [port] if port is not None else self.sysfs.port_numbers(name)
                for p in numbers:
                    port_samples = self.sysfs.counters(name, p)
                    samples.extend(port_samples)
                    if netlink is not None:
                        samples.extend(netlink.extra(name, p, port_samples))
        finally:
            if netlink is not None:
                netlink.close()
        return samples

    def note(self, message: str) -> None:
        """A diagnostic that matters only to someone asking for details (-d)."""
        if self.details:
            self.warn(message)

    def is_iwarp(self, device: str) -> bool:
        return self.sysfs.iwarp(device)

    def roce_gid_index(self, device: str, port: int) -> int | None:
        """The GID index the data path uses on a RoCE port (the `gids --best` rule), or None
        for an InfiniBand port, which is addressed by LID."""
        from ibtool.gidrule import best_gid

        p = self.sysfs.port(device, port, ("link_layer", "netdev"))
        if p.link_layer != LinkLayer.ETHERNET:
            return None
        gids = list(self.sysfs.gids(device, port, p.link_layer))
        return best_gid(gids, {(device, port): p}, self.sysfs.vlans(), p.netdev or "").index

    # -- verbs (details only) ----------------------------------------------------------------

    def verbs(self):
        """The verbs source, or None after one warning saying what is missing."""
        if self._verbs is None and self._verbs_error is None:
            if self.root != "/":
                self._verbs_error = IbtoolError("verbs details need the live host, not --root")
            else:
                try:
                    from ibtool.sources.verbs import VerbsSource

                    self._verbs = VerbsSource()
                except IbtoolError as e:
                    self._verbs_error = e
            if self._verbs_error is not None:
                e = self._verbs_error
                self.warn(f"-d: {e.message}" + (f" (hint: {e.hint})" if e.hint else ""))
        return self._verbs

    def device_caps(self, name: str) -> dict[str, Any] | None:
        verbs = self.verbs()
        if verbs is None:
            return None
        try:
            return verbs.device_caps(name)
        except IbtoolError as e:
            self.warn(e.message)
            return None

    def _with_verbs(self, port: Port) -> Port:
        if not self.details or self.verbs() is None:
            return port
        try:
            attrs = self._verbs.port_attrs(port.device, port.port)
        except IbtoolError as e:
            self.warn(e.message)
            return port
        return dataclasses.replace(port, active_mtu=attrs["active_mtu"], max_mtu=attrs["max_mtu"])


# Model fields and the NLDEV attributes that answer them (GET for devices, PORT_GET for ports).
DEVICE_ATTRS = {
    "node_type": "RDMA_NLDEV_ATTR_DEV_NODE_TYPE",
    "protocol": "RDMA_NLDEV_ATTR_DEV_PROTOCOL",
    "fw_ver": "RDMA_NLDEV_ATTR_FW_VERSION",
    "node_guid": "RDMA_NLDEV_ATTR_NODE_GUID",
    "sys_image_guid": "RDMA_NLDEV_ATTR_SYS_IMAGE_GUID",
    "port_count": "RDMA_NLDEV_ATTR_PORT_INDEX",
}
PORT_ATTRS = {
    "state": "RDMA_NLDEV_ATTR_PORT_STATE",
    "physical_state": "RDMA_NLDEV_ATTR_PORT_PHYS_STATE",
    "lid": "RDMA_NLDEV_ATTR_LID",
    "sm_lid": "RDMA_NLDEV_ATTR_SM_LID",
    "lmc": "RDMA_NLDEV_ATTR_LMC",
    "cap_mask": "RDMA_NLDEV_ATTR_CAP_FLAGS",
    "netdev": "RDMA_NLDEV_ATTR_NDEV_NAME",
}
VERBS_FIELDS = ("active_mtu", "max_mtu")
_KEYS = ("name", "device", "port", "ports", "sources")


def _merged(record, nl_record, answered, attrs: dict[str, str]):
    """`record` with every field netlink answered taken from `nl_record`, and its sources."""
    changes, sources = {}, {}
    for f in dataclasses.fields(record):
        if f.name in _KEYS:
            continue
        if attrs.get(f.name) in answered and getattr(nl_record, f.name) is not None:
            changes[f.name] = getattr(nl_record, f.name)
            sources[f.name] = "netlink"
        elif getattr(record, f.name) not in (None, ()):
            sources[f.name] = "verbs" if f.name in VERBS_FIELDS else "sysfs"
    return dataclasses.replace(record, **changes, sources=sources)


class _NetlinkRecords:
    """Devices and ports as netlink sees them, for merging with sysfs (details only)."""

    def __init__(self, host: Host):
        self.host = host
        self.client: Any = None
        self.replies: dict[str, dict] = {}
        self.port_replies: dict[str, dict[int, dict]] = {}
        try:
            from ibtool.sources.netlink import NldevClient

            self.client = NldevClient()
            self.replies = {
                r["RDMA_NLDEV_ATTR_DEV_NAME"]: r
                for r in self.client.devices()
                if "RDMA_NLDEV_ATTR_DEV_NAME" in r
            }
        except IbtoolError as e:
            host.note(f"sysfs only: RDMA netlink: {e.message}")
            self.close()

    def merge_device(self, device: Device) -> Device:
        from ibtool.sources.netlink import records

        reply = self.replies.get(device.name)
        if reply is None:
            return _merged(device, device, (), {})
        return _merged(device, records.device(reply), reply, DEVICE_ATTRS)

    def merge_port(self, port: Port) -> Port:
        from ibtool.sources.netlink import records

        reply = self._port_replies(port.device).get(port.port)
        if reply is None:
            return _merged(port, port, (), {})
        return _merged(port, records.port(reply), reply, PORT_ATTRS)

    def _port_replies(self, device: str) -> dict[int, dict]:
        if device not in self.port_replies:
            self.port_replies[device] = {}
            if self.client is not None and device in self.replies:
                try:
                    index = self.replies[device]["RDMA_NLDEV_ATTR_DEV_INDEX"]
                    self.port_replies[device] = {
                        r["RDMA_NLDEV_ATTR_PORT_INDEX"]: r for r in self.client.ports(index)
                    }
                except (IbtoolError, KeyError) as e:
                    self.host.warn(f"{device}: netlink ports: {getattr(e, 'message', e)}")
        return self.port_replies[device]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def __enter__(self) -> _NetlinkRecords:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _NetlinkCounters:
    """Driver counters from netlink STAT_GET that sysfs did not show, one port at a time.

    Opened on first use. Without RDMA netlink, or on a kernel without STAT_GET, the sysfs
    counters stand alone (a note under -d says why); a port whose request fails is warned
    about and the others are still asked."""

    def __init__(self, host: Host):
        self.host = host
        self.client: Any = None
        self.indexes: dict[str, int] | None = None
        self.off = False

    def _open(self) -> bool:
        if self.indexes is not None or self.off:
            return not self.off
        try:
            from ibtool.sources.netlink import NldevClient

            self.client = NldevClient()
            self.indexes = {
                r["RDMA_NLDEV_ATTR_DEV_NAME"]: r["RDMA_NLDEV_ATTR_DEV_INDEX"]
                for r in self.client.devices()
                if "RDMA_NLDEV_ATTR_DEV_NAME" in r and "RDMA_NLDEV_ATTR_DEV_INDEX" in r
            }
        except IbtoolError as e:
            self.off = True
            self.host.note(f"counters from sysfs only: RDMA netlink: {e.message}")
            self.close()
        return not self.off

    def extra(self, device: str, port: int, have: list[CounterSample]) -> list[CounterSample]:
        from ibtool.errors import UnsupportedError

        if not self._open() or device not in self.indexes:
            return []  # in exclusive netns mode sysfs may list devices netlink does not
        from ibtool.sources.netlink import records

        index = self.indexes[device]
        try:
            samples = records.hw_counters(self.client.hw_counters(index, port))
        except UnsupportedError as e:
            self.host.note(f"{device}/{port}: no netlink counters: {e.message}")
            return []
        except IbtoolError as e:
            self.host.warn(f"{device}/{port}: netlink counters: {e.message}")
            return []
        known = {s.name for s in have if s.source == "hw"}
        extra = [s for s in samples if s.name not in known]
        if not extra or not known:
            return extra  # no sysfs hw_counters/ at all: netlink's are the driver counters
        optional = set()
        try:
            status = records.hw_counter_status(self.client.hw_counter_status(index, port))
            optional = {c.name for c in status if c.optional}
        except UnsupportedError:
            # STAT_GET answered for this port, so it has driver counters and EINVAL means the
            # command is missing; optional counters came with it: the ones shown are all hw.
            from ibtool.sources.netlink import attrs as A
            from ibtool.sources.netlink.errors import missing_command

            missing = missing_command(
                A.RDMA_NLDEV_CMD_STAT_GET_STATUS, "optional counters are listed"
            )
            self.host.note(f"{device}/{port}: which counters are optional is unknown: {missing}")
        except IbtoolError as e:
            self.host.note(f"{device}/{port}: which counters are optional is unknown: {e.message}")
        return [
            dataclasses.replace(s, source="optional") if s.name in optional else s for s in extra
        ]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
