"""The kernel's monitor events (RDMA_NLDEV_CMD_MONITOR, Linux 6.12) as ibtool.model.events
Events: what the kernel's message says, completed from the latest poll where it leaves a name
out."""

from __future__ import annotations

import dataclasses
from typing import Any

from ibtool.model.events import Event, Seen
from ibtool.sources.netlink.attrs import EVENT_TYPES


def kernel_event(reply: dict[str, Any], last: Seen | None = None) -> Event:
    """A decoded RDMA_NLDEV_CMD_MONITOR message as an Event. `last` (the latest poll) names
    what the kernel leaves out: a renamed device's old name, a renamed netdev's port."""
    kind = reply["RDMA_NLDEV_ATTR_EVENT_TYPE"]
    name = EVENT_TYPES.get(kind)
    event = Event(
        event=name.lower() if name else "unknown",
        device=reply.get("RDMA_NLDEV_ATTR_DEV_NAME"),
        port=reply.get("RDMA_NLDEV_ATTR_PORT_INDEX"),
        device_index=reply.get("RDMA_NLDEV_ATTR_DEV_INDEX"),
        netdev=reply.get("RDMA_NLDEV_ATTR_NDEV_NAME"),
        netdev_index=reply.get("RDMA_NLDEV_ATTR_NDEV_INDEX"),
        event_type=kind,
    )
    if last is None:
        return event
    if event.event == "rename" and event.device_index is not None:
        old = next((n for n, i in last.devices.items() if i == event.device_index), None)
        if old is not None and old != event.device:
            event = dataclasses.replace(event, changes=(("ifname", old, event.device),))
    if event.event == "netdev_rename" and event.netdev_index is not None:
        for (device, port), p in sorted(last.ports.items()):
            if p.netdev_index == event.netdev_index:
                return dataclasses.replace(
                    event,
                    device=event.device or device,
                    port=event.port or port,
                    changes=(("netdev", p.netdev, event.netdev),),
                )
    return event
