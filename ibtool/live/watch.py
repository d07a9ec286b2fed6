"""Watching RDMA devices and ports change, as `ibtool monitor` and a dashboard do.

Two ways of seeing changes, and both are used where they exist:

- the kernel's monitor events (Linux 6.12 and later, SYS_GET MONITOR_MODE = 1): devices
  registered, unregistered and renamed, netdevs attached to, detached from and renamed on ports;
- polling every `interval` seconds: netlink GET and PORT_GET dumps where the host has RDMA
  netlink, sysfs without it or under --root. Polling finds what no kernel event reports (port
  state, physical state, LID, SM LID and LMC changes) and, without kernel events, the device
  and netdev changes too, as the same events (ibtool.model.events).
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ibtool.errors import IbtoolError, NoDevicesError, UnsupportedError
from ibtool.model.events import Event, Seen, diff
from ibtool.sources.netlink.monitor import kernel_event


class NetlinkPoller:
    """Devices and ports from the host's netlink session."""

    source = "netlink"

    def __init__(self, session):
        self.session = session

    def poll(self) -> Seen:
        devices, ports = self.session.poll_ports()
        return Seen.of(devices, ports)


class SysfsPoller:
    """Devices and ports from the host's sysfs tree (--root's, or without RDMA netlink)."""

    source = "sysfs"

    def __init__(self, root: str, warn: Callable[[str], None]):
        from ibtool.sources.sysfs.infiniband import SysfsSource

        self.warn = warn
        self.sysfs = SysfsSource(root, self._note)
        self._notes: list[str] = []

    def _note(self, message: str) -> None:
        self._notes.append(message)

    def poll(self) -> Seen:
        try:
            names = self.sysfs.device_names()
        except NoDevicesError:
            return Seen({}, {})  # no devices (yet): waiting for some is what monitors do
        devices: dict[str, int | None] = {}
        ports = []
        self.sysfs.warned.clear()  # each poll notes what it finds; cli shows a warning once
        for name in names:
            self._notes = []
            found = [self.sysfs.port(name, n) for n in self.sysfs.port_numbers(name)]
            if not os.path.isdir(os.path.join(self.sysfs.class_dir, name)):
                continue  # removed while being read: its unreadable files are no news
            for message in self._notes:
                self.warn(message)
            devices[name] = None
            ports.extend(found)
        return Seen.of(devices, ports)


class Watch:
    """A poller, the kernel's event listener where there is one, and what was last seen."""

    def __init__(self, poller, listener, note: str | None, interval: float, warn):
        self.poller = poller
        self.listener = listener
        self.note = note  # to say once the first poll is done
        self.interval = interval
        self.warn = warn
        self.last = poller.poll()

    def events(self, deadline: float) -> Iterator[Event]:
        """Events as they happen, until `deadline` (time.monotonic())."""
        listener = self.listener
        from_kernel = listener is not None
        next_poll = time.monotonic() + self.interval
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
                        yield kernel_event(reply, self.last)
                except IbtoolError as e:
                    from ibtool.sources.netlink.events import EventsLost

                    if not isinstance(e, EventsLost):
                        raise
                    self.warn(f"{e.message}: the next poll reports device changes too")
                    resync = True
            if time.monotonic() >= next_poll:
                new = self.poller.poll()
                devices = not from_kernel or resync
                yield from diff(self.last, new, self.poller.source, devices=devices)
                self.last, resync = new, False
                next_poll = max(next_poll + self.interval, time.monotonic())


@contextmanager
def watching(host, interval: float) -> Iterator[Watch]:
    """A Watch on the host: netlink polls and kernel events where it has them."""
    every = f"every {interval:g} s"
    session = host.netlink_session
    if session is None:
        yield Watch(SysfsPoller(host.sysfs.root, host.warn), None, None, interval, host.warn)
        return
    try:
        session.client  # noqa: B018 (opens it)
    except IbtoolError as e:
        note = f"monitor events are not supported by this kernel ({e.message}); polling sysfs"
        poller = SysfsPoller(host.sysfs.root, host.warn)
        yield Watch(poller, None, f"{note} {every}", interval, host.warn)
        return
    listener = None
    note = None
    try:
        try:
            events = session.system().monitor
        except UnsupportedError:
            events = False  # no SYS_GET: a kernel before 5.2
        if not events:
            note = f"monitor events are not supported by this kernel (needs 6.12); polling {every}"
        else:
            try:
                listener = session.event_listener()
            except IbtoolError as e:
                hint = f" ({e.hint})" if e.hint else ""
                note = f"no monitor events: {e.message}{hint}; polling {every}"
        yield Watch(NetlinkPoller(session), listener, note, interval, host.warn)
    finally:
        if listener is not None:
            listener.close()
