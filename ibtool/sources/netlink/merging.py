"""What netlink adds to the sysfs records: devices and ports merged field by field under -d,
each field with its source, and the driver counters netlink has that sysfs does not show."""

from __future__ import annotations

import dataclasses

from ibtool.errors import IbtoolError, UnsupportedError
from ibtool.model.records import CounterSample, Device, Port

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
VERBS_FIELDS = ("active_mtu", "max_mtu", "max_vl_num", "auto_path_mig")
IB_DEVICE_AUTO_PATH_MIG = 1 << 4  # enum ib_device_cap_flags, the device's CAP_FLAGS
# Not model data with a source: keys, the sources themselves, and what change detection keeps.
_KEYS = ("name", "device", "port", "ports", "sources", "netdev_index")


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


class Merger:
    """Devices and ports as netlink sees them, merged into the sysfs records: each field from
    netlink where it answers, with its source. Without netlink, the records stand (a note
    under -d says why)."""

    def __init__(self, session):
        self.session = session
        self.replies: dict[str, dict] = {}
        self.port_replies: dict[str, dict[int, dict]] = {}
        self.off = False
        try:
            self.replies = session.device_replies()
        except IbtoolError as e:
            session.note(f"sysfs only: RDMA netlink: {e.message}")
            self.off = True

    def device(self, device: Device) -> Device:
        from ibtool.sources.netlink import records

        reply = self.replies.get(device.name)
        if reply is None:
            return _merged(device, device, (), {})
        return _merged(device, records.device(reply), reply, DEVICE_ATTRS)

    def port(self, port: Port) -> Port:
        from ibtool.sources.netlink import records

        reply = self._port_replies(port.device).get(port.port)
        if reply is None:
            merged = _merged(port, port, (), {})
        else:
            merged = _merged(port, records.port(reply), reply, PORT_ATTRS)
        return self._device_caps(merged)

    def _device_caps(self, port: Port) -> Port:
        """What the port has of its device's capabilities (GET's CAP_FLAGS: device_cap_flags),
        netlink's answer over verbs'."""
        caps = self.replies.get(port.device, {}).get("RDMA_NLDEV_ATTR_CAP_FLAGS")
        if caps is None:
            return port
        sources = {**(port.sources or {}), "auto_path_mig": "netlink"}
        apm = bool(caps & IB_DEVICE_AUTO_PATH_MIG)
        return dataclasses.replace(port, auto_path_mig=apm, sources=sources)

    def _port_replies(self, device: str) -> dict[int, dict]:
        if device not in self.port_replies:
            self.port_replies[device] = {}
            if not self.off and device in self.replies:
                try:
                    index = self.replies[device]["RDMA_NLDEV_ATTR_DEV_INDEX"]
                    self.port_replies[device] = {
                        r["RDMA_NLDEV_ATTR_PORT_INDEX"]: r for r in self.session.client.ports(index)
                    }
                except (IbtoolError, KeyError) as e:
                    self.session.warn(f"{device}: netlink ports: {getattr(e, 'message', e)}")
        return self.port_replies[device]


class CounterReader:
    """Driver counters from netlink STAT_GET that sysfs did not show, one port at a time.

    Asks for the device indexes on first use. Without RDMA netlink, or on a kernel without
    STAT_GET, the sysfs counters stand alone (a note under -d says why); a port whose request
    fails is warned about and the others are still asked."""

    def __init__(self, session):
        self.session = session
        self.indexes: dict[str, int] | None = None
        self.off = False

    def _open(self) -> bool:
        if self.indexes is not None or self.off:
            return not self.off
        try:
            self.indexes = self.session.indexes()
        except IbtoolError as e:
            self.off = True
            self.session.note(f"counters from sysfs only: RDMA netlink: {e.message}")
        return not self.off

    def extra(self, device: str, port: int, have: list[CounterSample]) -> list[CounterSample]:
        if not self._open() or device not in self.indexes:
            return []  # in exclusive netns mode sysfs may list devices netlink does not
        from ibtool.sources.netlink import records

        session, nl = self.session, self.session.client
        index = self.indexes[device]
        try:
            samples = records.hw_counters(nl.hw_counters(index, port))
        except UnsupportedError as e:
            session.note(f"{device}/{port}: no netlink counters: {e.message}")
            return []
        except IbtoolError as e:
            session.warn(f"{device}/{port}: netlink counters: {e.message}")
            return []
        known = {s.name for s in have if s.source == "hw"}
        extra = [s for s in samples if s.name not in known]
        if not extra or not known:
            return extra  # no sysfs hw_counters/ at all: netlink's are the driver counters
        optional = set()
        try:
            status = records.hw_counter_status(nl.hw_counter_status(index, port))
            optional = {c.name for c in status if c.optional}
        except UnsupportedError:
            # STAT_GET answered for this port, so it has driver counters and EINVAL means the
            # command is missing; optional counters came with it: the ones shown are all hw.
            from ibtool.sources.netlink import attrs as A
            from ibtool.sources.netlink.errors import missing_command

            missing = missing_command(
                A.RDMA_NLDEV_CMD_STAT_GET_STATUS, "optional counters are listed"
            )
            session.note(f"{device}/{port}: which counters are optional is unknown: {missing}")
        except IbtoolError as e:
            session.note(f"{device}/{port}: which counters are optional is unknown: {e.message}")
        return [
            dataclasses.replace(s, source="optional") if s.name in optional else s for s in extra
        ]
