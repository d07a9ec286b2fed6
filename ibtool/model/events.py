"""Changes to RDMA devices and ports, as events: the one change engine.

What was seen at one moment is a `Seen` (device name -> index, and the Port records); `diff`
turns two of them into the events between. The kernel's own monitor events
(RDMA_NLDEV_CMD_MONITOR, Linux 6.12) become the same Event in
ibtool.sources.netlink.monitor; ibtool.views.events writes them as text and JSON. `ibtool
monitor` prints them, `ibtool snapshot diff` compares two snapshots with them, and the
dashboard consumes the same events.

Event names: register, unregister, rename (devices); netdev_attach, netdev_detach,
netdev_rename (a port's netdev); port_state (state or physical state); lid (LID, SM LID, LMC);
unknown (a kernel event type this tool does not know).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from ibtool.model.deferred import dataclass
from ibtool.model.names import natural_key
from ibtool.model.records import Port


@dataclass(frozen=True)
class Event:
    """One change to an RDMA device or port."""

    event: str
    device: str | None = None
    port: int | None = None
    device_index: int | None = None
    netdev: str | None = None
    netdev_index: int | None = None
    event_type: int | None = None  # RDMA_NLDEV_ATTR_EVENT_TYPE of a kernel event
    source: str = "kernel"  # kernel (an event), netlink or sysfs (seen by polling), snapshot
    changes: tuple[tuple[str, Any, Any], ...] = ()  # (field, before, now); before None: unknown
    time: str | None = None

    def now(self, key: str) -> Any:
        return next((new for k, _, new in self.changes if k == key), None)

    def before(self, key: str) -> Any:
        return next((old for k, old, _ in self.changes if k == key), None)


@dataclass(frozen=True)
class Seen:
    """Devices (name -> device index; None where sysfs was read) and their ports."""

    devices: dict[str, int | None]
    ports: dict[tuple[str, int], Port]

    @classmethod
    def of(cls, devices: dict[str, int | None], ports: Iterable[Port]) -> Seen:
        return cls(dict(devices), {(p.device, p.port): p for p in ports})


# -- what changed between two polls --------------------------------------------------------------


def _name(value) -> str | None:
    return value.name if value is not None else None


def _natural(key: tuple[str, int] | str):
    return (natural_key(key[0]), key[1]) if isinstance(key, tuple) else (natural_key(key), 0)


def diff(old: Seen, new: Seen, source: str, *, devices: bool = True) -> list[Event]:
    """The events that turn `old` into `new`. Without `devices`, only port state and LID
    changes (the kernel's own events report devices and netdevs)."""
    events: list[Event] = []
    gone = sorted((n for n in old.devices if n not in new.devices), key=_natural)
    came = sorted((n for n in new.devices if n not in old.devices), key=_natural)
    renamed: dict[str, str] = {}  # new name -> old name: same device index, another name
    came_by_index = {new.devices[n]: n for n in came if new.devices[n] is not None}
    for name in gone:
        index = old.devices[name]
        if index is not None and index in came_by_index:
            renamed[came_by_index[index]] = name
    ports = sorted(new.ports.items(), key=lambda i: _natural(i[0]))
    if devices:
        for name in gone:
            if name not in renamed.values():
                events.append(
                    Event("unregister", name, device_index=old.devices[name], source=source)
                )
        for name in came:
            index = new.devices[name]
            if name in renamed:
                events.append(
                    Event(
                        "rename",
                        name,
                        device_index=index,
                        source=source,
                        changes=(("ifname", renamed[name], name),),
                    )
                )
                continue
            events.append(Event("register", name, device_index=index, source=source))
            for (device, port), p in ports:
                if device == name and p.netdev:
                    events.append(_netdev_event("netdev_attach", device, port, p, source))
    for (device, port), p in ports:
        before = old.ports.get((renamed.get(device, device), port))
        if before is not None:
            events.extend(_port_events(device, port, before, p, source, devices))
    return events


def _netdev_event(kind: str, device: str, port: int, p: Port, source: str) -> Event:
    return Event(kind, device, port, netdev=p.netdev, netdev_index=p.netdev_index, source=source)


def _port_events(
    device: str, port: int, before: Port, now: Port, source: str, devices: bool
) -> list[Event]:
    events = []
    was = (_name(before.state), _name(before.physical_state))
    now_states = (_name(now.state), _name(now.physical_state))
    if was != now_states:
        changes = (("state", was[0], now_states[0]), ("physical_state", was[1], now_states[1]))
        events.append(Event("port_state", device, port, source=source, changes=changes))
    lids = [
        (key, getattr(before, key), getattr(now, key))
        for key in ("lid", "sm_lid", "lmc")
        if getattr(before, key) != getattr(now, key)
    ]
    if lids:
        events.append(Event("lid", device, port, source=source, changes=tuple(lids)))
    if devices and before.netdev != now.netdev:
        same = before.netdev_index is not None and before.netdev_index == now.netdev_index
        if before.netdev and now.netdev and same:
            events.append(
                dataclasses.replace(
                    _netdev_event("netdev_rename", device, port, now, source),
                    changes=(("netdev", before.netdev, now.netdev),),
                )
            )
        else:
            if before.netdev:
                events.append(_netdev_event("netdev_detach", device, port, before, source))
            if now.netdev:
                events.append(_netdev_event("netdev_attach", device, port, now, source))
    return events
