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

import select
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ibtool.errors import (
    EventsLost,
    IbtoolError,
    NoDevicesError,
    NotLiveError,
    UnsupportedError,
)
from ibtool.model.events import Event, Seen, diff


class NetlinkPoller:
    """Devices and ports from the host's netlink session (GET and PORT_GET dumps)."""

    source = "netlink"

    def __init__(self, session):
        self.session = session

    def poll(self) -> Seen:
        devices, ports = self.session.poll_ports()
        return Seen.of(devices, ports)


class SysfsPoller:
    """Devices and ports as sysfs has them (--root's tree, or a host without RDMA netlink),
    each poll read through a Host of its own (`open_host(warn)`): what the poll before warned
    about is news again, and cli shows each warning once."""

    source = "sysfs"

    def __init__(self, open_host: Callable[[Callable[[str], None]], Any], warn):
        self.open_host = open_host
        self.warn = warn

    def poll(self) -> Seen:
        notes: list[str] = []
        host = self.open_host(notes.append)
        try:
            try:
                names = host.device_names()
            except NoDevicesError:
                return Seen({}, {})  # no devices (yet): waiting for some is what monitors do
            found = {}
            for name in names:
                start = len(notes)
                ports = [host.port(name, n) for n in host.port_numbers(name)]
                found[name] = (ports, notes[start:])
            try:
                still = set(host.device_names())
            except NoDevicesError:
                still = set()
        finally:
            host.close()
        devices: dict[str, int | None] = {}
        ports = []
        for name, (read, said) in found.items():
            if name not in still:
                continue  # removed while being read: its unreadable files are no news
            for message in said:
                self.warn(message)
            devices[name] = None
            ports.extend(read)
        return Seen.of(devices, ports)


class Watch:
    """A poller, the kernel's event listener where there is one, and what was last seen."""

    def __init__(
        self, poller, listener, note: str | None, interval: float, warn, first: Seen | None = None
    ):
        self.poller = poller
        self.listener = listener
        self.note = note  # to say once the first poll is done
        self.interval = interval
        self.warn = warn
        self.last = first if first is not None else poller.poll()

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
                    yield from listener.events(self.last)
                except EventsLost as e:
                    self.warn(f"{e.message}: the next poll reports device changes too")
                    resync = True
            if time.monotonic() >= next_poll:
                new = self.poller.poll()
                devices = not from_kernel or resync
                yield from diff(self.last, new, self.poller.source, devices=devices)
                self.last, resync = new, False
                next_poll = max(next_poll + self.interval, time.monotonic())


@contextmanager
def watching(
    host, interval: float, reopen: Callable[[Callable[[str], None]], Any] | None = None
) -> Iterator[Watch]:
    """A Watch on the host: netlink polls and kernel events where it has them, sysfs polls
    (each through a Host of its own, `reopen(warn)`, as the engine reads the running host)
    where not. Without `reopen`, each is a Host on the same root."""
    every = f"every {interval:g} s"

    if reopen is None:
        from ibtool.host import Host

        def reopen(warn: Callable[[str], None]):
            return Host(root=host.root, warn=warn)

    def sysfs() -> SysfsPoller:
        return SysfsPoller(reopen, host.warn)

    try:
        session = host.netlink("monitor polls RDMA netlink")
    except NotLiveError:
        yield Watch(sysfs(), None, None, interval, host.warn)  # a --root tree: sysfs only
        return
    poller = NetlinkPoller(session)
    first = fallback = None
    try:
        events = session.system().monitor
    except IbtoolError as e:
        try:
            first = poller.poll()  # the session's client opens, or says why it cannot
        except IbtoolError as opening:
            fallback = f"monitor events are not supported by this kernel ({opening.message})"
        else:
            if not isinstance(e, UnsupportedError):
                raise
            events = False  # no SYS_GET: a kernel before 5.2
    if fallback is not None:
        yield Watch(sysfs(), None, f"{fallback}; polling sysfs {every}", interval, host.warn)
        return
    listener = None
    note = None
    try:
        if not events:
            note = f"monitor events are not supported by this kernel (needs 6.12); polling {every}"
        else:
            # Joined before the first poll: a change between the two is in one or the other.
            try:
                listener = session.event_listener()
            except IbtoolError as e:
                hint = f" ({e.hint})" if e.hint else ""
                note = f"no monitor events: {e.message}{hint}; polling {every}"
        yield Watch(poller, listener, note, interval, host.warn, first)
    finally:
        if listener is not None:
            listener.close()
