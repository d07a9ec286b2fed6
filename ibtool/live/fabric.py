"""The InfiniBand fabric for the live faces, scanned on its own interval, never at a scrape or
a frame: the exporter's --fabric series and the dashboard's fabric screen read the latest scan
that `FabricWatch` keeps.

A scan is what `ibtool fabric errors` reads: the subnet as libibnetdisc discovers it, every
port's PMA counters (the data counters too), and the subnet managers' SMInfo. It runs in a
thread of its own, so a slow subnet never delays the host's own polls, and is bounded:

- in time, by the scan's Bounds (libibnetdisc's window of SMPs, each MAD's timeout and
  retries) and by the interval (a scan that overruns it is followed by the next at once, never
  by two at a time);
- in MADs a second, by a pace the PMA reads keep (`mads_per_second`; the discovery itself is
  held by its window of outstanding SMPs);
- in memory, by keeping one scan (the latest, replaced whole) besides the one under way; a
  subnet has at most 49,151 unicast LIDs (IBTA vol. 1, 4.1.3), and a saved fabric is held to
  as many nodes.

Each scan's counters against the one before give every port's rates (per second), as the
dashboard's port detail shows a local port's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import field
from typing import Any

from ibtool.errors import IbtoolError
from ibtool.model.deferred import dataclass
from ibtool.model.fabric import Bounds, Fabric, PortCounters, SmScan

DEFAULT_INTERVAL = 60.0  # seconds between scans: ibqueryerrors-driven exporters' own default
DEFAULT_MADS_PER_SECOND = 2000  # PMA reads a second: a 648-HCA tree's 1,300 ports in ~2 s


@dataclass(frozen=True)
class FabricSeen:
    """One scan: the fabric, every port's counters (by node GUID and port), the SMs, and the
    counters' rates against the scan before (per second, in each counter's own unit:
    PortXmitData and PortRcvData count 4-byte words, IBTA vol. 1 16.1.3.5; absent on a first
    scan or for a counter that went down: cleared). `error` says why a scan gave nothing (no
    InfiniBand port, the discovery failed); `notes` what did not answer."""

    number: int
    time: float  # wall clock at its end
    duration: float
    fabric: Fabric | None = None
    counters: dict[tuple[int, int], PortCounters] = field(default_factory=dict)
    sms: SmScan | None = None
    rates: dict[tuple[int, int], dict[str, float]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    error: str | None = None
    mads: int = 0  # SMPs and PMA MADs it sent


class Pace:
    """At most `rate` calls a second, on average over the calls since the first: each call
    sleeps until its turn (`sleep`, `clock` given for tests). `count` is how many it let go."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.rate, self.clock, self.sleep = rate, clock, sleep
        self.began: float | None = None
        self.count = 0

    def __call__(self) -> None:
        now = self.clock()
        if self.began is None:
            self.began = now
        due = self.began + self.count / self.rate
        if due > now:
            self.sleep(due - now)
        self.count += 1


def rates(
    before: dict[tuple[int, int], PortCounters],
    after: dict[tuple[int, int], PortCounters],
    seconds: float,
) -> dict[tuple[int, int], dict[str, float]]:
    """Each port's counters' growth a second between two scans `seconds` apart: a counter
    that went down was cleared (no rate), one that wrapped at its width counted on from 0."""
    found: dict[tuple[int, int], dict[str, float]] = {}
    if seconds <= 0:
        return found
    for key, new in after.items():
        old = before.get(key)
        if old is None:
            continue
        mine = {}
        for name, value in new.values.items():
            was = old.values.get(name)
            if was is None or value < was or old.bits.get(name) != new.bits.get(name):
                continue
            mine[name] = (value - was) / seconds
        found[key] = mine
    return found


class FabricWatch:
    """Scans the fabric every `interval` seconds in a thread of its own (start, stop), through
    `via` (DEV[/PORT], default the first active InfiniBand port), from a Host `open_host` gives
    (and `done` closes); `latest` is the last scan, or None before the first ends. A capture
    holding a saved fabric is scanned once: it is one moment. `scan` does one scan in the
    caller's thread."""

    def __init__(
        self,
        open_host: Callable[[Callable[[str], None]], Any],
        done: Callable[[Any], None] = lambda host: None,
        *,
        interval: float = DEFAULT_INTERVAL,
        bounds: Bounds | None = None,
        via: str | None = None,
        mads_per_second: float = DEFAULT_MADS_PER_SECOND,
        live: bool = True,
        warn: Callable[[str], None] | None = None,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.open_host, self.done = open_host, done
        self.interval, self.bounds, self.via = interval, bounds or Bounds(), via
        self.mads_per_second, self.live = mads_per_second, live
        self.warn, self.wall, self.clock = warn, wall, clock
        self._latest: FabricSeen | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._number = 0
        self._scanned_at: float | None = None

    @property
    def latest(self) -> FabricSeen | None:
        with self._lock:
            return self._latest

    def scan(self) -> FabricSeen:
        """One scan, kept as the latest and returned; never raises for the fabric's sake (an
        IbtoolError is the scan's `error`)."""
        self._number += 1
        began = self.clock()
        notes: list[str] = []

        def note(text: str) -> None:
            notes.append(text)
            if self.warn is not None:
                self.warn(f"fabric: {text}")

        host = None
        try:
            host = self.open_host(note)
            seen = self._read(host, began, notes)
        except IbtoolError as e:
            error = e.message + (f" (hint: {e.hint})" if e.hint else "")
            seen = FabricSeen(self._number, self.wall(), self.clock() - began, error=error)
        finally:
            if host is not None:
                self.done(host)
        before = self.latest  # one thread scans: the latest is only ever this thread's
        if before is not None and before.counters and seen.counters:
            seconds = seen.time - before.time
            seen = dataclasses.replace(seen, rates=rates(before.counters, seen.counters, seconds))
        with self._lock:
            self._latest = seen
        return seen

    def _read(self, host, began: float, notes: list[str]) -> FabricSeen:
        fabric = host.fabric(self.via, self.bounds)
        pace = Pace(self.mads_per_second)
        read = host.fabric_counters(fabric, self.bounds, pace=pace)
        notes += list(fabric.unanswered) + list(read.unanswered)
        try:
            sms = host.fabric_sms(fabric, self.bounds, wait=0)
        except IbtoolError as e:
            sms = None
            notes.append(f"subnet managers: {e.message}")
        counters = {(c.node, c.port): c for c in read.counters}
        return FabricSeen(
            self._number,
            self.wall(),
            self.clock() - began,
            fabric=fabric,
            counters=counters,
            sms=sms,
            notes=tuple(notes),
            mads=fabric.mads + pace.count + (len(sms.sms) if sms is not None else 0),
        )

    # -- its own thread --------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="ibtool-fabric", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            began = self.clock()
            try:
                self.scan()
            except Exception as e:  # one bad scan must not end the watch
                if self.warn is not None:
                    self.warn(f"fabric: scan failed: {type(e).__name__}: {e}")
            if not self.live:
                return  # a capture is one moment: scanned once
            self._stop.wait(max(self.interval - (self.clock() - began), 0.0))


def watch_for(inv, warn: Callable[[str], None] | None = None, **options) -> FabricWatch:
    """The FabricWatch of a command's invocation: on the running host a Host opened anew for
    each scan (open_host, the one place that decides where a host comes from) and closed
    after; on a capture the invocation's own host, scanned once (a snapshot's saved fabric;
    a --root tree holds none, and says so as the scan's error)."""
    from ibtool.plugin.commands import open_host

    if inv.root == "/" and inv.snapshot is None:
        return FabricWatch(
            lambda note: open_host(inv, note, details=False).host,
            lambda host: host.close(),
            live=True,
            warn=warn,
            **options,
        )
    return FabricWatch(lambda note: inv.host, live=False, warn=warn, **options)
