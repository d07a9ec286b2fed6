"""`ibtool monitor`: RDMA devices and ports as they change, one line (or JSON object) per event.

Two ways of seeing changes, and both are used where they exist:

- the kernel's monitor events (Linux 6.12 and later, SYS_GET MONITOR_MODE = 1): devices
  registered, unregistered and renamed, netdevs attached to, detached from and renamed on ports;
- polling every --interval seconds: netlink GET and PORT_GET dumps on the live host, sysfs
  without RDMA netlink or under --root. Polling finds what no kernel event reports (port state,
  physical state, LID, SM LID and LMC changes) and, without kernel events, the device and netdev
  changes too, as the same event names.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import select
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ibtool import hookimpl, render
from ibtool.commands import Invocation
from ibtool.errors import IbtoolError, NoDevicesError, UnsupportedError
from ibtool.model import PhysState, PortState

DEFAULT_INTERVAL = 1.0


@dataclass(frozen=True)
class Event:
    """One change to an RDMA device or port."""

    event: str  # register, unregister, rename, netdev_attach, netdev_detach, netdev_rename,
    #              port_state, lid; unknown for a kernel event type this tool does not know
    device: str | None = None
    port: int | None = None
    device_index: int | None = None
    netdev: str | None = None
    netdev_index: int | None = None
    event_type: int | None = None  # RDMA_NLDEV_ATTR_EVENT_TYPE of a kernel event
    source: str = "kernel"  # kernel (an event), netlink or sysfs (seen by polling)
    changes: tuple[tuple[str, Any, Any], ...] = ()  # (field, before, now); before None: unknown
    time: str | None = None

    def now(self, key: str) -> Any:
        return next((new for k, _, new in self.changes if k == key), None)

    def before(self, key: str) -> Any:
        return next((old for k, old, _ in self.changes if k == key), None)


def _change(key: str) -> list[render.Field]:
    return [
        render.Field(key, lambda e: e.now(key)),
        render.Field(f"old_{key}", lambda e: e.before(key)),
    ]


# JSON keys; time, event, ifname, port and source are in every object, the others only when
# the event has them.
FIELDS = [
    render.Field("time", lambda e: e.time),
    render.Field("event", lambda e: e.event),
    render.Field("ifname", lambda e: e.device),
    render.Field("port", lambda e: e.port),
    render.Field("dev_index", lambda e: e.device_index),
    render.Field("netdev", lambda e: e.now("netdev") or e.netdev),
    render.Field("netdev_index", lambda e: e.netdev_index),
    render.Field("event_type", lambda e: e.event_type),
    render.Field("old_ifname", lambda e: e.before("ifname")),
    render.Field("old_netdev", lambda e: e.before("netdev")),
    *_change("state"),
    *_change("physical_state"),
    *_change("lid"),
    *_change("sm_lid"),
    *_change("lmc"),
    render.Field("source", lambda e: e.source),
]
ALWAYS = {"time", "event", "ifname", "port", "source"}


def event_json(e: Event) -> dict[str, Any]:
    row = render.record_json(e, FIELDS, True)
    return {k: v for k, v in row.items() if k in ALWAYS or v is not None}


def event_line(e: Event) -> str:
    where = (e.device or "-") + (f"/{e.port}" if e.port is not None else "")
    parts = [e.time or "-", e.event, where]
    if e.event == "unknown":
        parts.append(f"event_type {e.event_type}")
    shown = set()
    for key, old, new in e.changes:
        shown.add(key)
        if key == "ifname":
            parts.append(f"(was {old})")
            continue
        parts.append(f"{key} {_text(new)}")
        if old is not None and old != new:
            parts.append(f"(was {_text(old)})")
    if e.netdev and "netdev" not in shown and e.event.startswith("netdev"):
        parts.append(f"netdev {e.netdev}")
    if e.netdev_index is not None and e.event.startswith("netdev"):
        parts.append(f"ifindex {e.netdev_index}")
    return " ".join(parts)


def _text(value: Any) -> str:
    return "none" if value is None else str(value)


# -- kernel events --------------------------------------------------------------------------------


def kernel_event(reply: dict[str, Any], last: Snapshot | None = None) -> Event:
    """A decoded RDMA_NLDEV_CMD_MONITOR message as an Event. `last` (the latest poll) names
    what the kernel leaves out: a renamed device's old name, a renamed netdev's port."""
    from ibtool.sources.netlink.events import EVENT_TYPES

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
        for (device, port), view in sorted(last.ports.items()):
            if view.netdev_index == event.netdev_index:
                return dataclasses.replace(
                    event,
                    device=event.device or device,
                    port=event.port or port,
                    changes=(("netdev", view.netdev, event.netdev),),
                )
    return event


# -- polling --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PortView:
    """What polling compares of a port."""

    state: str | None = None
    physical_state: str | None = None
    lid: int | None = None
    sm_lid: int | None = None
    lmc: int | None = None
    netdev: str | None = None
    netdev_index: int | None = None


@dataclass(frozen=True)
class Snapshot:
    devices: dict[str, int | None]  # name -> device index (None from sysfs)
    ports: dict[tuple[str, int], PortView]


def _enum_name(enum, value: int | None) -> str | None:
    if value is None:
        return None
    member = enum.parse(value)
    return member.name if member is not None else str(value)


def _natural(key: tuple[str, int] | str):
    from ibtool.sources.sysfs import natural_key

    return (natural_key(key[0]), key[1]) if isinstance(key, tuple) else (natural_key(key), 0)


def diff(old: Snapshot, new: Snapshot, source: str, *, devices: bool = True) -> list[Event]:
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
            for (device, port), view in sorted(new.ports.items(), key=lambda i: _natural(i[0])):
                if device == name and view.netdev:
                    events.append(_netdev_event("netdev_attach", device, port, view, source))
    for (device, port), view in sorted(new.ports.items(), key=lambda i: _natural(i[0])):
        before = old.ports.get((renamed.get(device, device), port))
        if before is not None:
            events.extend(_port_events(device, port, before, view, source, devices))
    return events


def _netdev_event(kind: str, device: str, port: int, view: PortView, source: str) -> Event:
    return Event(
        kind, device, port, netdev=view.netdev, netdev_index=view.netdev_index, source=source
    )


def _port_events(
    device: str, port: int, before: PortView, now: PortView, source: str, devices: bool
) -> list[Event]:
    events = []
    if (before.state, before.physical_state) != (now.state, now.physical_state):
        changes = (
            ("state", before.state, now.state),
            ("physical_state", before.physical_state, now.physical_state),
        )
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


class NetlinkPoller:
    """Devices and ports from GET and PORT_GET dumps."""

    source = "netlink"

    def __init__(self, client):
        self.client = client

    def snapshot(self) -> Snapshot:
        devices: dict[str, int | None] = {}
        ports: dict[tuple[str, int], PortView] = {}
        for reply in self.client.devices():
            name = reply.get("RDMA_NLDEV_ATTR_DEV_NAME")
            index = reply.get("RDMA_NLDEV_ATTR_DEV_INDEX")
            if name is None or index is None:
                continue
            try:
                port_replies = self.client.ports(index)
            except IbtoolError:
                continue  # unregistered since the GET dump: gone, as the next poll will say
            devices[name] = index
            for p in port_replies:
                number = p.get("RDMA_NLDEV_ATTR_PORT_INDEX")
                if number is not None:
                    ports[(name, number)] = _port_view(p)
        return Snapshot(devices, ports)

    def close(self) -> None:
        self.client.close()


def _port_view(reply: dict[str, Any]) -> PortView:
    return PortView(
        state=_enum_name(PortState, reply.get("RDMA_NLDEV_ATTR_PORT_STATE")),
        physical_state=_enum_name(PhysState, reply.get("RDMA_NLDEV_ATTR_PORT_PHYS_STATE")),
        lid=reply.get("RDMA_NLDEV_ATTR_LID"),
        sm_lid=reply.get("RDMA_NLDEV_ATTR_SM_LID"),
        lmc=reply.get("RDMA_NLDEV_ATTR_LMC"),
        netdev=reply.get("RDMA_NLDEV_ATTR_NDEV_NAME"),
        netdev_index=reply.get("RDMA_NLDEV_ATTR_NDEV_INDEX"),
    )


class SysfsPoller:
    """Devices and ports from /sys/class/infiniband (of --root, or without RDMA netlink)."""

    source = "sysfs"

    def __init__(self, root: str, warn: Callable[[str], None]):
        from ibtool.sources.sysfs import SysfsSource

        self.root = root
        self.warn = warn
        self.sysfs = SysfsSource(root, self._note)
        self._notes: list[str] = []

    def _note(self, message: str) -> None:
        self._notes.append(message)

    def snapshot(self) -> Snapshot:
        try:
            names = self.sysfs.device_names()
        except NoDevicesError:
            return Snapshot({}, {})  # no devices (yet): waiting for some is what monitors do
        devices: dict[str, int | None] = {}
        ports: dict[tuple[str, int], PortView] = {}
        self.sysfs.warned.clear()  # each poll notes what it finds; cli shows a warning once
        for name in names:
            self._notes = []
            views = {}
            for number in self.sysfs.port_numbers(name):
                p = self.sysfs.port(name, number)
                views[(name, number)] = PortView(
                    state=p.state.name if p.state is not None else None,
                    physical_state=p.physical_state.name if p.physical_state is not None else None,
                    lid=p.lid,
                    sm_lid=p.sm_lid,
                    lmc=p.lmc,
                    netdev=p.netdev,
                )
            if not os.path.isdir(os.path.join(self.sysfs.class_dir, name)):
                continue  # removed while being read: its unreadable files are no news
            for message in self._notes:
                self.warn(message)
            devices[name] = None
            ports.update(views)
        return Snapshot(devices, ports)

    def close(self) -> None:
        pass


# -- the command ----------------------------------------------------------------------------------


class _Enough(Exception):
    """--count events have been shown."""


def _positive(kind: type, what: str) -> Callable[[str], Any]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, not {text!r}") from None
        if not value > 0 or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{what} must be above 0, not {text}")
        return value

    return parse


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval",
        type=_positive(float, "--interval"),
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"poll every SECONDS (default {DEFAULT_INTERVAL:g})",
    )
    parser.add_argument(
        "--count", type=_positive(int, "--count"), metavar="N", help="stop after N events"
    )
    parser.add_argument(
        "--timeout",
        type=_positive(float, "--timeout"),
        metavar="SECONDS",
        help="stop after SECONDS",
    )


@contextmanager
def _sources(inv: Invocation, interval: float) -> Iterator[tuple[Any, Any, str | None]]:
    """(poller, event listener or None, the note to give once the first poll is done)."""
    every = f"every {interval:g} s"
    if inv.root != "/":
        poller = SysfsPoller(inv.root, inv.warn)
        yield poller, None, None
        return
    try:
        from ibtool.sources.netlink import NldevClient

        client = NldevClient()
    except IbtoolError as e:
        note = f"monitor events are not supported by this kernel ({e.message}); polling sysfs"
        yield SysfsPoller("/", inv.warn), None, f"{note} {every}"
        return
    poller = NetlinkPoller(client)
    listener = None
    note = None
    try:
        try:
            events = bool(client.system().get("RDMA_NLDEV_SYS_ATTR_MONITOR_MODE"))
        except UnsupportedError:
            events = False  # no SYS_GET: a kernel before 5.2
        if not events:
            note = f"monitor events are not supported by this kernel (needs 6.12); polling {every}"
        else:
            from ibtool.sources.netlink.events import EventListener

            try:
                listener = EventListener()
            except IbtoolError as e:
                hint = f" ({e.hint})" if e.hint else ""
                note = f"no monitor events: {e.message}{hint}; polling {every}"
        yield poller, listener, note
    finally:
        if listener is not None:
            listener.close()
        poller.close()


def run(inv: Invocation) -> None:
    args = inv.args
    deadline = time.monotonic() + args.timeout if args.timeout else math.inf
    shown = 0

    def emit(event: Event) -> None:
        nonlocal shown
        event = dataclasses.replace(event, time=_timestamp())
        if inv.json:
            inv.emit_json(event_json(event))
        else:
            inv.print(event_line(event))
        inv.out.flush()
        shown += 1
        if args.count is not None and shown >= args.count:
            raise _Enough

    with _sources(inv, args.interval) as (poller, listener, note):
        last = poller.snapshot()
        if note:
            inv.warn(note)
        try:
            _watch(poller, listener, last, args.interval, deadline, emit, inv.warn)
        except _Enough:
            pass


def _watch(poller, listener, last: Snapshot, interval: float, deadline: float, emit, warn):
    from_kernel = listener is not None
    next_poll = time.monotonic() + interval
    resync = False
    while True:
        now = time.monotonic()
        if now >= deadline:
            return
        wait = max(0.0, min(next_poll, deadline) - now)
        if listener is None:
            time.sleep(wait)
        elif select.select([listener], [], [], wait)[0]:
            try:
                for reply in listener.read():
                    emit(kernel_event(reply, last))
            except IbtoolError as e:
                from ibtool.sources.netlink.events import EventsLost

                if not isinstance(e, EventsLost):
                    raise
                warn(f"{e.message}: the next poll reports device changes too")
                resync = True
        if time.monotonic() >= next_poll:
            new = poller.snapshot()
            for event in diff(last, new, poller.source, devices=not from_kernel or resync):
                emit(event)
            last, resync = new, False
            next_poll = max(next_poll + interval, time.monotonic())


def _timestamp() -> str:
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "monitor",
        run,
        help="RDMA device, port and netdev changes as they happen, one line per event",
        configure=_configure,
    )
