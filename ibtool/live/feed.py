"""The dashboard's face of the Engine: what each poll gives every panel.

A `Feed` has the Engine (ibtool.live.engine) read the host once per poll (ports, every
counter, the health checks now and then) and, on the same host, the GID table and resources of
the one port being looked at, and returns a `Frame`: the records, each counter's rate against
the poll before, per-port throughput and error deltas, each port's health, the events since
the poll before and a short history of every rate. Panels read frames; none of them reads the
kernel. No textual here: the dashboard imports this, never the other way round.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

from ibtool.errors import IbtoolError
from ibtool.live.engine import Engine, Hosts, Reading
from ibtool.model import counters as counterinfo
from ibtool.model.deferred import dataclass
from ibtool.model.events import Event
from ibtool.model.health import HealthResult, Status
from ibtool.model.names import escaped
from ibtool.model.rates import Rated
from ibtool.model.records import CounterSample, Gid, Port

HISTORY = 60  # rates kept per counter: a minute at the default refresh, as rdmatop keeps
PortKey = tuple[str, int]
CounterKey = tuple[str, int, str, str]  # device, port, source, name
# The kinds of the port check's findings that say a link trained below its rate: a face acts
# on the kind, so rewording a summary changes no screen.
SLOW = ("link_degraded", "link_below_configured")


@dataclass(frozen=True)
class Traffic:
    """A port's throughput in the last interval (per second; None: not counted or first poll),
    from the PMA data counters (octets, sysfs counters/ x 4) or a driver's own counters."""

    tx_bytes: float | None = None
    rx_bytes: float | None = None
    tx_packets: float | None = None
    rx_packets: float | None = None


@dataclass(frozen=True)
class PortRow:
    port: Port
    traffic: Traffic = Traffic()
    errors: int = 0  # error events counted since the dashboard started
    new_errors: int = 0  # of which in the last interval
    health: Status | None = None  # the worst finding about this port (None: not checked)
    degraded: str | None = None  # why the rate is below what this port should have
    findings: tuple[HealthResult, ...] = ()

    @property
    def key(self) -> PortKey:
        return (self.port.device, self.port.port)


@dataclass(frozen=True)
class Owned:
    """What one process (or kernel user) holds on a port: QPs, CQs and MRs, as `ibtool res`."""

    pid: int | None
    comm: str | None
    qp: int = 0
    cq: int = 0
    mr: int = 0


@dataclass(frozen=True)
class Focus:
    """The port being looked at closely: its GID table and resources, read for it alone."""

    device: str
    port: int
    gids: tuple[Gid, ...] = ()
    best_gid: int | None = None
    gid_note: str | None = None
    owners: tuple[Owned, ...] = ()
    resources_note: str | None = None  # why the resources are not shown (no netlink, ...)


@dataclass(frozen=True)
class Frame:
    number: int  # 1 for the first poll
    time: float  # wall clock of the poll
    interval: float | None  # seconds since the poll before (None: first poll or a capture)
    live: bool
    source: str  # what was read: "this host", a --root directory, a snapshot file
    rows: tuple[PortRow, ...] = ()
    counters: Mapping[PortKey, tuple[Rated, ...]] = field(default_factory=dict)
    # the last HISTORY rates of each counter of the focused port, oldest first
    history: Mapping[CounterKey, tuple[float | None, ...]] = field(default_factory=dict)
    host_findings: tuple[HealthResult, ...] = ()  # findings about no port ('' or a device)
    health_time: float | None = None
    events: tuple[Event, ...] = ()  # since the poll before, oldest first
    notes: tuple[str, ...] = ()  # warnings of this poll, each once
    focus: Focus | None = None
    error: str | None = None  # the poll found nothing to show, and why
    failed: bool = False  # the host could not be read (`error` says why): not "no devices"

    def row(self, key: PortKey) -> PortRow | None:
        return next((r for r in self.rows if r.key == key), None)


def counter_key(s: CounterSample) -> CounterKey:
    return (s.device, s.port, s.source, s.name)


def traffic(rated: tuple[Rated, ...] | list[Rated]) -> Traffic:
    """The port's throughput from its rated counters: the first of each TRAFFIC list it has."""
    by_name = {(r.sample.source, r.sample.name): r.rate for r in rated}
    picked = {}
    for what, candidates in counterinfo.TRAFFIC.items():
        picked[what] = next((by_name[c] for c in candidates if c in by_name), None)
    return Traffic(**picked)


def _stamp(wall: float) -> str:
    from datetime import datetime  # a feed's first event

    return datetime.fromtimestamp(wall).astimezone().isoformat(timespec="seconds")


class Feed:
    """The dashboard's face of the Engine. `host()` gives the Host to read, its `warn` being
    `note` (`live`: the running host, read anew each poll; else a capture, one Host); `poll()`
    is called from one thread at a time and returns a new Frame; `focus` is the port whose GIDs
    and resources the next poll reads (set from any thread)."""

    def __init__(
        self,
        host: Callable[[], Any] | Hosts,
        *,
        live: bool = True,
        source: str = "",
        checks: Mapping[str, Callable] | None = None,
        config: Any = None,
        health_every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        stamp: Callable[[float], str] = _stamp,
        boot_id: Callable[[Any], str | None] = lambda host: None,
    ) -> None:
        hosts = host if isinstance(host, Hosts) else Hosts(host, live=live, source=source)
        self.engine = Engine(
            hosts,
            checks=checks or None,  # no checks: no health shown, not "no check ran"
            config=config,
            check_every=health_every,
            clock=clock,
            wall=wall,
            boot_id=boot_id,
        )
        self.live, self.source = hosts.live, hosts.source
        self.wall, self.stamp = wall, stamp
        self.focus: PortKey | None = None
        self.latest: Frame | None = None
        self._history: dict[CounterKey, deque] = {}
        self._errors: dict[PortKey, int] = {}
        self._moved: dict[PortKey, int] = {}
        self._best: dict[PortKey, float] = {}

    def note(self, message: str) -> None:
        """A warning of the poll under way (give it to the Host as its `warn`): the frame
        carries it, for the dashboard to show once."""
        self.engine.note(message)

    def poll(self) -> Frame:
        reading = self.engine.poll(read=self._focused)
        frame = self._frame(reading)
        self.latest = frame
        return frame

    # -- one poll -------------------------------------------------------------------------------

    def _frame(self, reading: Reading) -> Frame:
        base = dict(
            number=reading.number,
            time=reading.time,
            interval=reading.interval,
            live=reading.live,
            source=self.source,
            notes=_once(reading.notes),
        )
        if reading.failed:
            return Frame(**base, error=reading.error, failed=True)
        self._moved = {}
        rated = self._rated(reading) if reading.rated is not None else []
        events = tuple(_timed(e, self.stamp(reading.time)) for e in reading.events)
        by_port: dict[PortKey, list[Rated]] = {}
        for r in rated:
            by_port.setdefault((r.sample.device, r.sample.port), []).append(r)
        findings = reading.findings
        ports = list(reading.ports)
        about = _by_port(findings, ports)
        rows = tuple(
            self._row(p, by_port.get((p.device, p.port), []), about.get((p.device, p.port), ()))
            for p in ports
        )
        keys = {(escaped(device), port) for device, port in (r.key for r in rows)}
        host_findings = tuple(
            f for f in findings if _port_of(f.subject) not in keys or not f.subject
        )
        return Frame(
            **base,
            rows=rows,
            counters={k: tuple(v) for k, v in by_port.items()},
            history=self._focus_history(),
            host_findings=host_findings,
            health_time=reading.health_time,
            events=events,
            focus=reading.extra,
            error=reading.error,
        )

    def _rated(self, reading: Reading) -> list[Rated]:
        rated = list(reading.rated or ())
        history = {}
        for r in rated:
            key = counter_key(r.sample)
            rates = self._history.get(key)
            if rates is None:
                rates = deque(maxlen=HISTORY)
            rates.append(r.rate)
            history[key] = rates
        self._history = history  # a counter gone is forgotten with its history
        for r, delta in zip(rated, reading.deltas):
            if delta and counterinfo.is_error(r.sample.name, r.sample.source):
                key = (r.sample.device, r.sample.port)
                self._moved[key] = self._moved.get(key, 0) + delta
        return rated

    def _focus_history(self) -> dict[CounterKey, tuple[float | None, ...]]:
        """The rates of the focused port's counters, oldest first: only the port detail draws
        them, and copying every port's at every poll would cost more than the rest of it."""
        if self.focus is None:
            return {}
        device, port = self.focus
        return {k: tuple(v) for k, v in self._history.items() if k[0] == device and k[1] == port}

    def _row(self, port: Port, rated: list[Rated], mine: tuple[HealthResult, ...]) -> PortRow:
        key = (port.device, port.port)
        new = self._moved.get(key, 0)
        self._errors[key] = self._errors.get(key, 0) + new
        status = Status.worst(f.status for f in mine) if mine else None
        return PortRow(
            port,
            traffic(rated),
            errors=self._errors[key],
            new_errors=new,
            health=status,
            degraded=self._degraded(port, mine),
            findings=mine,
        )

    def _degraded(self, port: Port, findings: tuple[HealthResult, ...]) -> str | None:
        """The port check's own finding of a link trained down (by its kind, never its
        wording), else a rate below the best this port had while the dashboard watched it."""
        said = next((f.summary for f in findings if f.kind in SLOW), None)
        if said is not None or port.rate is None:
            return said
        key = (port.device, port.port)
        best = max(self._best.get(key, 0.0), port.rate.gbps)
        self._best[key] = best
        if port.rate.gbps < best:
            return f"trained down: {port.rate.gbps:g} Gb/s, it had {best:g} Gb/s"
        return None

    # -- focus ----------------------------------------------------------------------------------

    def _focused(self, host, ports: tuple[Port, ...]) -> Focus | None:
        focus = self.focus
        if focus is None or focus not in {(p.device, p.port) for p in ports}:
            return None
        device, port = focus
        gids: tuple[Gid, ...] = ()
        best = gid_note = None
        try:
            gids = tuple(host.gids(f"{device}/{port}"))
            best = host.roce_gid_index(device, port)
        except IbtoolError as e:
            gid_note = e.message
        owners, note = _owners(host, device, port)
        return Focus(device, port, gids, best, gid_note, owners, note)


def _owners(host, device: str, port: int) -> tuple[tuple[Owned, ...], str | None]:
    """QPs (of this port), CQs and MRs (of its device) per holder, or why they are not known."""
    from ibtool.views.res import Owners

    try:
        netlink = host.netlink("resources are read from the running kernel over netlink")
        devices = netlink.devices(device)
        objects = {
            kind: netlink.resources(kind, devices, port if kind == "qp" else None, False)
            for kind in ("qp", "cq", "mr")
        }
    except IbtoolError as e:
        return (), e.message + (f" (hint: {e.hint})" if e.hint else "")
    names = Owners(host.comm)
    counts: dict[tuple[int | None, str | None], dict[str, int]] = {}
    for kind, records in objects.items():
        for record in records:
            holder = (record.owner.pid, names.comm(record.owner))
            tally = counts.setdefault(holder, {})
            tally[kind] = tally.get(kind, 0) + 1
    owned = [Owned(pid, comm, **tally) for (pid, comm), tally in counts.items()]
    owned.sort(key=lambda o: (-(o.qp + o.cq + o.mr), o.pid if o.pid is not None else -1))
    return tuple(owned), None


def _once(notes: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(notes))


def _timed(e: Event, stamp: str) -> Event:
    import dataclasses

    return dataclasses.replace(e, time=stamp)


def _port_of(subject: str) -> PortKey | None:
    device, _, port = subject.partition("/")
    return (device, int(port)) if port.isdigit() else None


def _by_port(findings: list[HealthResult], ports: list[Port]) -> dict[PortKey, tuple]:
    """Each port's findings: those about it, and those about its whole device. A subject
    holds the device's name escaped (HealthResult), so it is matched against that."""
    of_port: dict[PortKey, list[HealthResult]] = {}
    of_device: dict[str, list[HealthResult]] = {}
    for f in findings:
        key = _port_of(f.subject)
        if key is not None:
            of_port.setdefault(key, []).append(f)
        elif f.subject:
            of_device.setdefault(f.subject, []).append(f)
    out = {}
    for p in ports:
        shown = escaped(p.device)
        out[(p.device, p.port)] = tuple(of_device.get(shown, []) + of_port.get((shown, p.port), []))
    return out
