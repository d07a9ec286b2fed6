"""The one engine every live face reads: the dashboard, the exporter, `ibtool health`.

As Glances' stats object (glances/stats.py) is updated once per refresh and every output reads
it, an `Engine` reads the host once per poll: its devices and ports, every counter against the
poll before (the Sampler), the health checks with the state they keep between polls, and
whatever else the face asks of the same host (`poll(read=...)`). It returns one `Reading`,
immutable; the faces turn readings into a dashboard frame, metric families or a report.

Where each poll's Host comes from is said once, in `Hosts`: the running host is read anew at
each poll, a capture is read once and kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ibtool.errors import IbtoolError, NoDevicesError
from ibtool.health import run as health
from ibtool.health.config import HealthConfig
from ibtool.health.state import Kept
from ibtool.model.deferred import dataclass
from ibtool.model.events import Event, Seen, diff
from ibtool.model.health import HealthResult
from ibtool.model.rates import Rated, Sampler
from ibtool.model.records import Port
from ibtool.plugin.commands import open_host

KEEP = Kept  # the default state: kept in memory between the polls of one process


class Hosts:
    """Where each poll's Host comes from. The running host (`live`) is built anew by `make` at
    every poll and closed after it: its caches (the VLAN table, a netlink session) would go
    stale in a long-running process. A capture (a --root tree, a snapshot) is one moment: built
    once, read again at every poll; `close` ends what it holds."""

    def __init__(
        self,
        make: Callable[[], Any],
        *,
        live: bool,
        source: str = "",
        close: Callable[[], None] | None = None,
    ) -> None:
        self.make, self.live, self.source = make, live, source
        self._close = close
        self._kept: Any = None

    def open(self):
        if self.live:
            return self.make()
        if self._kept is None:
            self._kept = self.make()
        return self._kept

    def done(self, host) -> None:
        if self.live:
            host.close()

    def close(self) -> None:
        if self._close is not None:
            self._close()

    def counter_names(self) -> set[str]:
        """The names of the host's counters (for a configured threshold of a driver counter)."""
        host = self.open()
        try:
            return {s.name for s in host.counters()}
        finally:
            self.done(host)


def hosts_for(inv, warn: Callable[[str], None], *, own_capture: bool = True) -> Hosts:
    """The hosts a command's options name, each opened by `open_host` (the one place that
    decides where a host comes from): this host (no --root, no --snapshot) anew at each
    poll, each warning to `warn`; else the capture, read once. `own_capture`: the capture is
    opened here with `warn` (and closed by `Hosts.close`); otherwise it is the invocation's
    host, its warnings the command's."""

    def make():
        return open_host(inv, warn, details=False).host

    if inv.root == "/" and inv.snapshot is None:
        return Hosts(make, live=True, source="this host")
    source = f"snapshot {inv.snapshot}" if inv.snapshot is not None else f"--root {inv.root}"
    if not own_capture:
        return Hosts(lambda: inv.host, live=False, source=source)
    if inv.snapshot is not None:
        capture = open_host(inv, warn, details=False)
        return Hosts(lambda: capture.host, live=False, source=source, close=capture.close)
    return Hosts(make, live=False, source=source)


@dataclass(frozen=True)
class Reading:
    """What one poll saw. `rated` is None where the counters were not sampled (no ports, a
    read that failed: `notes` says why), `deltas` its raw deltas row for row; `report` is the
    checks' last run (this poll's when `checked`), `health_time` when it ended."""

    number: int  # 1 for the first poll
    time: float  # wall clock of the poll
    interval: float | None  # seconds since the poll before (None: the first)
    live: bool
    source: str
    devices: tuple[str, ...] = ()
    ports: tuple[Port, ...] = ()
    rated: tuple[Rated, ...] | None = None
    deltas: tuple[int | None, ...] = ()
    events: tuple[Event, ...] = ()  # device, port and counter-reset changes, untimed
    report: health.Report | None = None
    checked: bool = False
    health_time: float | None = None
    notes: tuple[str, ...] = ()  # every warning of this poll, in order
    error: str | None = None  # no devices, and why
    failed: bool = False  # the host could not be read (`error` says why)
    extra: Any = None  # what `poll(read=...)` gave

    @property
    def findings(self) -> list[HealthResult]:
        return self.report.results if self.report is not None else []


class Engine:
    """Polls a host for every face. `poll()` is called from one thread at a time.

    `ports`, `counters`: whether a poll reads the devices and ports (and diffs them against
    the poll before) and samples every counter; `checks`: None runs none (not even to say none
    ran); `check_every`: None runs the checks at every
    poll, a number of seconds at the first poll, when a device or port changed, and that often
    on the running host only (a capture read again is the same moment). `state`: what the
    checks keep between polls (`KEEP`: in memory; a health.state.StateFile; None: nothing).
    `warn` is given each warning of a poll as it comes; the reading carries them all."""

    def __init__(
        self,
        hosts: Hosts,
        *,
        checks: Mapping[str, Callable] | None = None,
        config: HealthConfig | None = None,
        state: Any = KEEP,
        lock_wait: float = 0.0,
        datapath: bool = False,
        check_every: float | None = None,
        ports: bool = True,
        counters: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        boot_id: Callable[[Any], str | None] | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.hosts = hosts
        self.checks = None if checks is None else dict(checks)
        self.config = config if config is not None else HealthConfig()
        self.state = Kept() if state is KEEP else state
        self.lock_wait, self.datapath, self.check_every = lock_wait, datapath, check_every
        self.read_ports, self.read_counters = ports, counters
        self.clock, self.wall = clock, wall
        self._boot_id = boot_id if boot_id is not None else _boot_id
        self._warn = warn
        self._reading: Any = None
        self._sampler = Sampler(lambda: self._reading.counters(), clock)
        self._seen: Seen | None = None
        self._report: health.Report | None = None
        self._health_time: float | None = None
        self._checked_at: float | None = None
        self._polled_at: float | None = None
        self._number = 0
        self._notes: list[str] = []

    @property
    def live(self) -> bool:
        return self.hosts.live

    @property
    def source(self) -> str:
        return self.hosts.source

    def note(self, message: str) -> None:
        """A warning of the poll under way: give it to the Host as its `warn`."""
        self._notes.append(message)
        if self._warn is not None:
            self._warn(message)

    def poll(self, read: Callable[[Any, tuple[Port, ...]], Any] | None = None) -> Reading:
        """One poll; `read(host, ports)`, if given, reads what else the face needs of the same
        host, after the rest."""
        self._notes = []
        host = self.hosts.open()
        self._reading = host
        try:
            return self._poll(host, read)
        finally:
            self.hosts.done(host)
            self._reading = None

    def _poll(self, host, read) -> Reading:
        self._number += 1
        now, wall = self.clock(), self.wall()
        interval = None if self._polled_at is None else now - self._polled_at
        self._polled_at = now
        base = dict(number=self._number, time=wall, interval=interval)
        base.update(live=self.live, source=self.source)
        error = None
        names: list[str] = []
        ports: list[Port] = []
        seen = None
        events: list[Event] = []
        if self.read_ports:
            try:
                names = [name for name, _ in host.select(None)]
                ports = host.ports()
            except NoDevicesError as e:
                error = e.message + (f" (hint: {e.hint})" if e.hint else "")
            except IbtoolError as e:
                return Reading(**base, error=e.message, notes=tuple(self._notes), failed=True)
            seen = Seen.of(dict.fromkeys(names), ports)
            events = [] if self._seen is None else diff(self._seen, seen, "poll")
        rated = deltas = None
        if self.read_counters and ports:
            rated, deltas = self._sample()
            events += _resets(rated or [])
        checked = self._check(host, now, bool(events))
        # Only now is the change taken in: a poll that fails before the checks ran leaves it
        # for the next poll to report and check, not a DOWN port beside the last run's OK.
        if seen is not None:
            self._seen = seen
        extra = read(host, tuple(ports)) if read is not None else None
        return Reading(
            **base,
            devices=tuple(names),
            ports=tuple(ports),
            rated=None if rated is None else tuple(rated),
            deltas=tuple(deltas or ()),
            events=tuple(events),
            report=self._report,
            checked=checked,
            health_time=self._health_time,
            notes=tuple(self._notes),
            error=error,
            extra=extra,
        )

    def _sample(self) -> tuple[list[Rated] | None, list[int | None] | None]:
        if not self.live:
            self._sampler.last = None  # a capture read again is the same moment: no rates
        try:
            rated = self._sampler.sample()
        except IbtoolError as e:
            self.note(f"counters: {e.message}")
            return None, None
        return rated, list(self._sampler.deltas)

    def _check(self, host, now: float, changed: bool) -> bool:
        """Runs the checks when due (see the class); False when it kept the last run's."""
        if self.check_every is None:
            due = True
        else:
            timed = self.live and now - (self._checked_at or 0.0) >= self.check_every
            due = self._checked_at is None or changed or timed
        if self.checks is None or not due:
            return False
        boot = self._boot_id(host)
        if self.state is None:
            report = health.run(
                self.checks, host, self.config, None, boot_id=boot, datapath=self.datapath
            )
        else:
            with self.state.locked(self.lock_wait):
                saved = self.state.load()
                report = health.run(
                    self.checks, host, self.config, saved, boot_id=boot, datapath=self.datapath
                )
                if saved.problem:
                    self.note(saved.problem)
                self.state.save(report.kept)
        self._report, self._health_time, self._checked_at = report, self.wall(), now
        return True


def _boot_id(host) -> str | None:
    from ibtool.health import state as healthstate

    return healthstate.boot_id(host.root, host.fs)


def _resets(rated: list[Rated]) -> list[Event]:
    return [
        Event(
            "counter_reset",
            r.sample.device,
            r.sample.port or None,
            source=r.sample.source,
            changes=(("counter", None, r.sample.name),),
        )
        for r in rated
        if r.note == "reset"
    ]
