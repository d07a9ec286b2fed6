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

from ibtool.errors import (
    EventsLost,
    IbtoolError,
    NoDevicesError,
    NotLiveError,
    UnsupportedError,
)
from ibtool.model.events import Event, Seen, diff


def netlink_seen(host) -> Seen:
    """Devices (with their kernel index, so that a rename is known) and ports from the host's
    RDMA netlink session: its GET and PORT_GET dumps."""
    devices, ports = host.netlink("monitor polls RDMA netlink").poll_ports()
    return Seen.of(devices, ports)


def sysfs_seen(host, warn: Callable[[str], None], said: list[str]) -> Seen:
    """Devices and ports as sysfs has them (--root's tree, or a host without RDMA netlink).
    `said` holds what the host warned about while reading: a device removed while it was read
    is left out with its warnings (its unreadable files are no news: the next poll says it is
    gone); the others' warnings are given to `warn`."""
    try:
        names = host.device_names()
    except NoDevicesError:
        return Seen({}, {})  # no devices (yet): waiting for some is what monitors do
    found = {}
    for name in names:
        start = len(said)
        ports = [host.port(name, n) for n in host.port_numbers(name)]
        found[name] = (ports, said[start:])
    try:
        still = set(host.device_names())
    except NoDevicesError:
        still = set()
    devices: dict[str, int | None] = {}
    seen = []
    for name, (read, notes) in found.items():
        if name not in still:
            continue
        for message in notes:
            warn(message)
        devices[name] = None
        seen.extend(read)
    return Seen.of(devices, seen)


class Poll:
    """Each poll of a watch, as an Engine face: the Engine opens the poll's host where every
    face gets one (live.engine.Hosts: the running host anew each time, a --root tree kept) and
    this reads what a watch compares, by netlink or by sysfs (`source`)."""

    def __init__(self, engine, source: str, said: list[str], warn: Callable[[str], None]):
        self.engine, self.source, self.said, self.warn = engine, source, said, warn

    def __call__(self) -> Seen:
        self.said.clear()
        return self.engine.poll(read=self._read).extra

    def _read(self, host, ports) -> Seen:
        if self.source == "netlink":
            seen = netlink_seen(host)
            for message in self.said:
                self.warn(message)
            return seen
        return sysfs_seen(host, self.warn, self.said)


class Watch:
    """The polls, the kernel's event listener where there is one, and what was last seen."""

    def __init__(
        self,
        poll: Poll,
        listener,
        note: str | None,
        interval: float,
        warn,
        first: Seen | None = None,
    ):
        self.poll = poll
        self.listener = listener
        self.note = note  # to say once the first poll is done
        self.interval = interval
        self.warn = warn
        self.last = first if first is not None else poll()

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
                new = self.poll()
                devices = not from_kernel or resync
                yield from diff(self.last, new, self.poll.source, devices=devices)
                self.last, resync = new, False
                next_poll = max(next_poll + self.interval, time.monotonic())


@contextmanager
def watching(inv, interval: float) -> Iterator[Watch]:
    """A Watch on the invocation's host: netlink polls and kernel events where it has them,
    sysfs polls where not, each poll through an Engine (where its host comes from is said by
    live.engine.hosts_for, as for every face)."""
    from ibtool.live.engine import Engine, hosts_for

    host, warn = inv.host, inv.warn
    every = f"every {interval:g} s"
    said: list[str] = []  # what the poll under way's host warned about
    engine = Engine(hosts_for(inv, said.append), ports=False, counters=False)

    def polls(source: str) -> Poll:
        return Poll(engine, source, said, warn)

    try:
        try:
            session = host.netlink("monitor polls RDMA netlink")
        except NotLiveError:
            yield Watch(polls("sysfs"), None, None, interval, warn)  # a --root tree: sysfs only
            return
        first = fallback = None
        try:
            events = session.system().monitor
        except IbtoolError as e:
            try:
                first = polls("netlink")()  # the session's client opens, or says why it cannot
            except IbtoolError as opening:
                fallback = f"monitor events are not supported by this kernel ({opening.message})"
            else:
                if not isinstance(e, UnsupportedError):
                    raise
                events = False  # no SYS_GET: a kernel before 5.2
        if fallback is not None:
            note = f"{fallback}; polling sysfs {every}"
            yield Watch(polls("sysfs"), None, note, interval, warn)
            return
        listener = None
        note = None
        try:
            if not events:
                note = (
                    f"monitor events are not supported by this kernel (needs 6.12); polling {every}"
                )
            else:
                # Joined before the first poll: a change between the two is in one or the other.
                try:
                    listener = session.event_listener()
                except IbtoolError as e:
                    hint = f" ({e.hint})" if e.hint else ""
                    note = f"no monitor events: {e.message}{hint}; polling {every}"
            yield Watch(polls("netlink"), listener, note, interval, warn, first)
        finally:
            if listener is not None:
                listener.close()
    finally:
        engine.hosts.close()
