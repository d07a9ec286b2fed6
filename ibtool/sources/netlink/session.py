"""The run's RDMA netlink session: requests in the commands' terms, model records out.

One session per run, behind the host facade (`Host.netlink`): the client is opened on first
use and every command's reads and changes go through it. The client comes from the factory
the host was given: an NldevClient on the running kernel, a recorded one for a snapshot, a
fake kernel's in the tests. No raw reply leaves this module except to ibtool's own merging.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any, NamedTuple

from ibtool.errors import IbtoolError, NotFoundError, UnsupportedError
from ibtool.model.records import NetlinkFeature, Port, RdmaSystem

# What each resource dump lists, for the line saying the kernel lacks it.
LISTED = {
    "qp": "QPs are listed",
    "cm_id": "CM IDs are listed",
    "cq": "CQs are listed",
    "mr": "MRs are listed",
    "pd": "PDs are listed",
    "ctx": "contexts are listed",
    "srq": "SRQs are listed",
}


class NetlinkDevice(NamedTuple):
    name: str
    index: int
    port_count: int


class Summary(NamedTuple):
    """RES_GET of one device: how many objects of each type it has."""

    device: str
    index: int
    counts: dict[str, int]


class PortPoll(NamedTuple):
    """What one poll of devices and ports saw: device name -> index, and the ports."""

    devices: dict[str, int | None]
    ports: list[Port]


def open_nldev():
    """The running kernel's RDMA netlink, as a blocking client."""
    from ibtool.sources.netlink import NldevClient

    return NldevClient()


class NetlinkSession:
    def __init__(
        self,
        open_client: Callable[[], Any],
        warn: Callable[[str], None],
        note: Callable[[str], None],
        kernel_before: Callable[[int, int], bool],
    ):
        """`warn`, `note` (a diagnostic shown only under -d) and `kernel_before` (whether the
        running kernel is older than a version) are the Host's."""
        self._open = open_client
        self.warn = warn
        self.note = note
        self._kernel_before = kernel_before
        self._client: Any = None
        self._error: IbtoolError | None = None

    @property
    def client(self):
        """The client, opened on first use; the error that stopped it, every time after."""
        if self._client is None:
            if self._error is not None:
                raise self._error
            try:
                self._client = self._open()
            except IbtoolError as e:
                self._error = e
                raise
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- devices and ports ---------------------------------------------------------------------

    def device_replies(self) -> dict[str, dict]:
        return {
            r["RDMA_NLDEV_ATTR_DEV_NAME"]: r
            for r in self.client.devices()
            if "RDMA_NLDEV_ATTR_DEV_NAME" in r
        }

    def indexes(self) -> dict[str, int]:
        """Device name -> index, of the devices netlink shows (in exclusive netns mode, those
        of this network namespace)."""
        return {
            name: r["RDMA_NLDEV_ATTR_DEV_INDEX"]
            for name, r in self.device_replies().items()
            if "RDMA_NLDEV_ATTR_DEV_INDEX" in r
        }

    def devices(self, wanted: str | None = None) -> list[NetlinkDevice]:
        """Every device, or the one asked for (NotFoundError if netlink does not show it)."""
        from ibtool.sources.netlink import records

        found = []
        for reply in self.client.devices():
            device = records.device(reply)
            found.append(
                NetlinkDevice(device.name, reply["RDMA_NLDEV_ATTR_DEV_INDEX"], device.port_count)
            )
        if wanted is None:
            return found
        chosen = [d for d in found if d.name == wanted]
        if not chosen:
            names = ", ".join(d.name for d in found) or "none"
            raise NotFoundError(f"no RDMA device {wanted!r}", f"devices: {names}")
        return chosen

    def poll_ports(self) -> PortPoll:
        """Devices and their ports from GET and PORT_GET dumps; a device unregistered between
        the two is left out (the next poll says it is gone)."""
        from ibtool.sources.netlink import records

        devices: dict[str, int | None] = {}
        ports: list[Port] = []
        for reply in self.client.devices():
            name = reply.get("RDMA_NLDEV_ATTR_DEV_NAME")
            index = reply.get("RDMA_NLDEV_ATTR_DEV_INDEX")
            if name is None or index is None:
                continue
            try:
                port_replies = self.client.ports(index)
            except IbtoolError:
                continue
            devices[name] = index
            ports.extend(records.port(p) for p in port_replies if "RDMA_NLDEV_ATTR_PORT_INDEX" in p)
        return PortPoll(devices, ports)

    def device_of_netdev(self, netdev: str) -> str | None:
        """The RDMA device whose port serves `netdev`, if netlink says."""
        try:
            ports = self.poll_ports().ports
        except IbtoolError:
            return None
        return next((p.device for p in ports if p.netdev == netdev), None)

    def event_listener(self):
        """A socket that has joined the kernel's RDMA monitor events (Linux 6.12)."""
        from ibtool.sources.netlink import events

        return events.EventListener()

    def merger(self):
        """Devices and ports merged with what netlink says (ibtool.sources.netlink.merging)."""
        from ibtool.sources.netlink.merging import Merger

        return Merger(self)

    # -- system ------------------------------------------------------------------------------

    def system(self) -> RdmaSystem:
        """SYS_GET: the system-wide settings."""
        from ibtool.sources.netlink import records

        return records.rdma_system(self.client.system())

    def system_features(self) -> tuple[RdmaSystem, list[NetlinkFeature]]:
        """The settings, and the RDMA netlink features the kernel has, asked of it."""
        from ibtool.sources.netlink import features, records

        reply = self.client.system()
        recorded = getattr(self.client, "recorded_features", None)  # a snapshot's
        if recorded is not None:
            return records.rdma_system(reply), recorded
        return records.rdma_system(reply), features.probe(self.client, reply)

    def set_system(self, attribute: str, value: int, serves: str | None, name: str) -> None:
        """SYS_SET of one setting; a kernel without it is said in one line."""
        nl = self.client
        try:
            nl.set_system(attribute, value)
        except UnsupportedError as e:
            if self._lacks(attribute):
                from ibtool.sources.netlink import attrs as A
                from ibtool.sources.netlink.errors import not_in_kernel

                since = A.SYS_ATTRIBUTE_SINCE.get(attribute)
                raise not_in_kernel(attribute, since, serves, errno=e.errno) from e
            raise UnsupportedError(f"cannot set {name}: {e.message}", e.hint, errno=e.errno) from e

    def _lacks(self, attribute: str) -> bool:
        """Whether SYS_GET, which reports every setting the kernel has, leaves `attribute` out:
        then that is why SYS_SET refused it (a kernel older than the attribute rejects it as an
        unknown attribute type, nldev.c parses SYS_SET strictly)."""
        try:
            return attribute not in self.client.system()
        except IbtoolError:
            return False

    # -- counters ----------------------------------------------------------------------------

    def counter_status(self, indexes: dict[str, int], device: str, port: int):
        """Every driver counter of the port with its index; [] for a port without any."""
        from ibtool.sources.netlink import attrs as A
        from ibtool.sources.netlink import records
        from ibtool.sources.netlink.errors import missing_command

        if device not in indexes:
            raise NotFoundError(
                f"RDMA netlink does not show {device}",
                "in exclusive netns mode a device answers only in its own network namespace",
            )
        nl = self.client
        try:
            return records.hw_counter_status(nl.hw_counter_status(indexes[device], port))
        except UnsupportedError as e:
            # EINVAL: a kernel without the command (netlink.c rdma_nl_rcv_msg), or a port
            # without driver counters (nldev.c nldev_stat_get_counter_status_doit). STAT_GET,
            # which every kernel with optional counters has, answers for a port with counters.
            try:
                nl.hw_counters(indexes[device], port)
            except UnsupportedError:
                return []
            raise missing_command(
                A.RDMA_NLDEV_CMD_STAT_GET_STATUS, "optional counters are listed", errno=e.errno
            ) from e

    def set_optional_counters(self, index: int, port: int, enabled: list[int]) -> None:
        self.client.set_optional_counters(index, port, enabled)

    def counter_reader(self):
        """Driver counters netlink has and sysfs lacks (ibtool.sources.netlink.merging)."""
        from ibtool.sources.netlink.merging import CounterReader

        return CounterReader(self)

    # -- resources ---------------------------------------------------------------------------

    def summaries(self, devices: list[NetlinkDevice]) -> list[Summary]:
        from ibtool.sources.netlink import records

        wanted = {d.index for d in devices}
        summaries = []
        for reply in self.client.resource_summaries():
            index = reply.get("RDMA_NLDEV_ATTR_DEV_INDEX")
            if index in wanted:
                name = reply.get("RDMA_NLDEV_ATTR_DEV_NAME")
                summaries.append(Summary(name, index, records.resource_summary(reply)))
        return summaries

    def resources(
        self,
        kind: str,
        devices: list[NetlinkDevice],
        port: int | None,
        details: bool,
    ) -> list[Any]:
        """Every object of a kind on these devices, one dump per device. A device that
        disappears meanwhile is a warning; the others are still shown."""
        from ibtool.sources.netlink import records

        nl = self.client
        options = {}
        if kind == "cq":
            options["old_poll_context"] = self._kernel_before(5, 8)
        found = []
        for device in devices:
            try:
                replies = nl.resource_dump(kind, device.index, port, driver_details=details)
            except IbtoolError as e:
                if e.errno not in (errno.ENODEV, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                if e.errno != errno.EOPNOTSUPP and self._vanished(device.index):
                    self.warn(f"{device.name} disappeared while its {kind} objects were read")
                    continue
                if e.errno == errno.ENODEV:
                    raise
                # A kernel without the command answers EINVAL before looking at the request
                # (netlink.c rdma_nl_rcv_msg); the device is still there, so that is the cause.
                raise _unsupported(kind, e) from e
            # rdma lists the objects not bound to a port first: keep that order.
            objects = records.resources(kind, replies, **options)
            found += sorted(objects, key=lambda o: getattr(o, "port", None) is not None)
        return found

    def every_resource(self, devices: list[NetlinkDevice], details: bool) -> list[tuple[str, Any]]:
        """(kind, object) of every kind the kernel lists on these devices; a kind it does not
        list (or a dump that fails) is left out."""
        found = []
        for kind in LISTED:
            try:
                found += [(kind, o) for o in self.resources(kind, devices, None, details)]
            except IbtoolError:
                continue
        return found

    def _vanished(self, index: int) -> bool:
        try:
            self.client.device(index)
        except IbtoolError as e:
            return e.errno in (errno.ENODEV, errno.EINVAL)
        return False

    # -- links -------------------------------------------------------------------------------

    def new_link(self, name: str, link_type: str, netdev: str) -> None:
        self.client.new_link(name, link_type, netdev)

    def delete_link(self, index: int) -> None:
        self.client.delete_link(index)


def _unsupported(kind: str, e: IbtoolError) -> UnsupportedError:
    from ibtool.sources.netlink import attrs as A
    from ibtool.sources.netlink.errors import missing_command

    return missing_command(
        A.RESOURCE_COMMANDS[kind],
        LISTED[kind],
        "ibtool -d system lists the RDMA netlink commands this kernel has",
        errno=e.errno,
    )
