"""Decoded NLDEV replies ({uapi name: value}) as ibtool's model records.

A reply without an attribute the kernel always sends (a device without DEV_NAME) is a DataError
naming it; attributes that depend on the kernel version or the port type become None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ibtool.model import (
    CounterSample,
    Device,
    HwCounterStatus,
    NetnsMode,
    NodeType,
    PhysState,
    Port,
    PortState,
    Protocol,
    RdmaSystem,
)
from ibtool.sources.netlink.errors import malformed

Reply = Mapping[str, Any]


def guid(value: int | None) -> str | None:
    """A host-order u64 GUID as sysfs and rdma(8) print it: four groups of four hex digits."""
    if value is None:
        return None
    text = f"{value:016x}"
    return ":".join(text[i : i + 4] for i in range(0, 16, 4))


def _required(reply: Reply, name: str, what: str) -> Any:
    if name not in reply:
        raise malformed(f"{what} without {name}")
    return reply[name]


def _flag(value: int | None) -> bool | None:
    return None if value is None else bool(value)


def device(reply: Reply) -> Device:
    """A GET reply. Its PORT_INDEX is the number of ports (rdma_end_port), not a port."""
    protocol = reply.get("RDMA_NLDEV_ATTR_DEV_PROTOCOL")
    node_type = reply.get("RDMA_NLDEV_ATTR_DEV_NODE_TYPE")
    return Device(
        name=_required(reply, "RDMA_NLDEV_ATTR_DEV_NAME", "a device"),
        node_type=NodeType.parse(node_type) if node_type is not None else None,
        protocol=Protocol(protocol) if protocol in Protocol._value2member_map_ else None,
        fw_ver=reply.get("RDMA_NLDEV_ATTR_FW_VERSION"),
        node_guid=guid(reply.get("RDMA_NLDEV_ATTR_NODE_GUID")),
        sys_image_guid=guid(reply.get("RDMA_NLDEV_ATTR_SYS_IMAGE_GUID")),
        port_count=reply.get("RDMA_NLDEV_ATTR_PORT_INDEX", 0),
    )


def port(reply: Reply) -> Port:
    """A PORT_GET reply. LID, SM LID, LMC and capabilities come only for InfiniBand ports."""
    state = reply.get("RDMA_NLDEV_ATTR_PORT_STATE")
    phys = reply.get("RDMA_NLDEV_ATTR_PORT_PHYS_STATE")
    caps = reply.get("RDMA_NLDEV_ATTR_CAP_FLAGS")
    return Port(
        device=_required(reply, "RDMA_NLDEV_ATTR_DEV_NAME", "a port"),
        port=_required(reply, "RDMA_NLDEV_ATTR_PORT_INDEX", "a port"),
        state=PortState.parse(state) if state is not None else None,
        physical_state=PhysState.parse(phys) if phys is not None else None,
        lid=reply.get("RDMA_NLDEV_ATTR_LID"),
        sm_lid=reply.get("RDMA_NLDEV_ATTR_SM_LID"),
        lmc=reply.get("RDMA_NLDEV_ATTR_LMC"),
        # Low 32 bits: PortInfo CapabilityMask, what sysfs cap_mask holds; high: CapabilityMask2.
        cap_mask=caps & 0xFFFFFFFF if caps is not None else None,
        netdev=reply.get("RDMA_NLDEV_ATTR_NDEV_NAME"),
    )


def rdma_system(reply: Reply) -> RdmaSystem:
    """A SYS_GET reply: each setting the kernel reports; a kernel reports those it has."""
    mode = reply.get("RDMA_NLDEV_SYS_ATTR_NETNS_MODE")
    return RdmaSystem(
        netns_mode=NetnsMode.parse(mode) if mode is not None else None,
        privileged_qkey=_flag(reply.get("RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE")),
        monitor=_flag(reply.get("RDMA_NLDEV_SYS_ATTR_MONITOR_MODE")),
        copy_on_fork=_flag(reply.get("RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK")),
    )


def hw_counters(reply: Reply) -> list[CounterSample]:
    """A STAT_GET reply for a port: its default (driver) counters, optional ones included."""
    device = _required(reply, "RDMA_NLDEV_ATTR_DEV_NAME", "a counter reply")
    port = _required(reply, "RDMA_NLDEV_ATTR_PORT_INDEX", "a counter reply")
    samples = []
    for entry in reply.get("RDMA_NLDEV_ATTR_STAT_HWCOUNTERS", []):
        if not isinstance(entry, Mapping):
            continue  # a bare STAT_HWCOUNTER_INDEX: only requests carry those
        name = _required(entry, "RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME", "a counter")
        value = entry.get("RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_VALUE")
        samples.append(CounterSample(device, port, name, value, source="hw", via="netlink"))
    return samples


def hw_counter_status(reply: Reply) -> list[HwCounterStatus]:
    """A STAT_GET_STATUS reply: each driver counter of the port, optional ones marked."""
    device = _required(reply, "RDMA_NLDEV_ATTR_DEV_NAME", "a counter status reply")
    port = _required(reply, "RDMA_NLDEV_ATTR_PORT_INDEX", "a counter status reply")
    counters = []
    for entry in reply.get("RDMA_NLDEV_ATTR_STAT_HWCOUNTERS", []):
        if not isinstance(entry, Mapping):
            continue
        name = _required(entry, "RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME", "a counter")
        index = _required(entry, "RDMA_NLDEV_ATTR_STAT_HWCOUNTER_INDEX", f"counter {name}")
        dynamic = entry.get("RDMA_NLDEV_ATTR_STAT_HWCOUNTER_DYNAMIC")
        counters.append(
            HwCounterStatus(device, port, name, index, dynamic is not None, dynamic != 0)
        )
    return counters


def resource_summary(reply: Reply) -> dict[str, int]:
    """A RES_GET reply: resource type ("pd", "cq", "qp", ...) -> how many exist now."""
    summary = {}
    for entry in reply.get("RDMA_NLDEV_ATTR_RES_SUMMARY", []):
        name = _required(entry, "RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY_NAME", "a resource summary")
        summary[name] = entry.get("RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY_CURR", 0)
    return summary
