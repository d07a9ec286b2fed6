"""`ibtool exporter`'s engine: one poller, and a Prometheus endpoint serving its latest result.

A scrape never waits for the kernel: the poller (the main thread) reads the host every interval
and replaces one cached list of families; the HTTP server (prometheus_client's, in its own
thread) hands out whatever is cached. A device that hangs a read delays the next poll, never a
scrape, and the poll's age is itself a metric.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

from ibtool.api import MetricFamily
from ibtool.errors import UnsupportedError, UsageError

DEFAULT_PORT = 9877


def parse_listen(text: str) -> tuple[str, int]:
    """'ADDR:PORT', '[V6ADDR]:PORT', ':PORT' or 'PORT' -> (address, port); '' is every address,
    port 0 any free port (the one bound is printed)."""
    m = re.fullmatch(r"(?:\[([0-9A-Fa-f:.]+)\]|([^:\[\]]*)):([0-9]+)|([0-9]+)", text)
    if not m:
        raise UsageError(f"--listen {text!r}: not ADDR:PORT", "e.g. --listen :9877, [::1]:9877")
    port = int(m.group(3) or m.group(4))
    if not 0 <= port < 65536:
        raise UsageError(f"--listen {text!r}: port {port} is not 0-65535")
    return (m.group(1) or m.group(2) or ""), port


class Latest:
    """The families of the last poll, swapped whole under a lock, and the poll's own figures."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.families: list[MetricFamily] = []
        self.polled_at: float | None = None
        self.duration: float | None = None
        self.polls = 0
        self.errors = 0

    def store(self, families: list[MetricFamily], at: float, duration: float) -> None:
        with self.lock:
            self.families, self.polled_at, self.duration = families, at, duration
            self.polls += 1

    def failed(self) -> None:
        with self.lock:
            self.errors += 1

    def snapshot(self) -> list[MetricFamily]:
        with self.lock:
            families = list(self.families)
            polled_at, duration, polls, errors = (
                self.polled_at,
                self.duration,
                self.polls,
                self.errors,
            )
        own = [
            MetricFamily("ibtool_exporter_polls", "Polls of the host since start", "counter"),
            MetricFamily("ibtool_exporter_poll_errors", "Polls that failed", "counter"),
        ]
        own[0].add({}, polls)
        own[1].add({}, errors)
        if polled_at is not None:
            at = MetricFamily(
                "ibtool_exporter_last_poll_timestamp",
                "When the host was last read",
                "gauge",
                "seconds",
            )
            at.add({}, round(polled_at, 3))
            took = MetricFamily(
                "ibtool_exporter_poll_duration", "How long the last poll took", "gauge", "seconds"
            )
            took.add({}, round(duration or 0.0, 6))
            own += [at, took]
        return families + own


def _client_families(families: list[MetricFamily]):
    """ibtool's families as prometheus_client's, sample for sample."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for family in families:
        kind = CounterMetricFamily if family.type == "counter" else GaugeMetricFamily
        names = sorted({k for s in family.samples for k in s.labels})
        out = kind(family.name, family.documentation, labels=names)
        for labels, value in family.samples:
            out.add_metric([labels.get(n, "") for n in names], value)
        yield out


def serve(
    listen: tuple[str, int],
    poll: Callable[[], list[MetricFamily]],
    interval: float,
    warn: Callable[[str], None],
    *,
    clock: Callable[[], float] = time.time,
    stop: threading.Event | None = None,
    ready: Callable[[tuple[str, int]], None] | None = None,
) -> None:
    """Serves the latest `poll()` on `listen` until interrupted (or `stop` is set): a poll, then
    `interval` seconds of rest, and so on; a poll that raises is one warning, and the families
    of the poll before stay served."""
    try:
        from prometheus_client import start_http_server
        from prometheus_client.registry import CollectorRegistry
    except ImportError:
        raise UnsupportedError(
            "ibtool exporter needs the prometheus_client package",
            "pip install prometheus_client (Debian: python3-prometheus-client)",
        ) from None
    latest = Latest()

    class Collector:
        def collect(self):
            return _client_families(latest.snapshot())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    address, port = listen
    try:
        started = start_http_server(port, addr=address or "::", registry=registry)
    except OSError as e:
        if address == "" and e.errno in (97, 99):  # EAFNOSUPPORT, EADDRNOTAVAIL: no IPv6
            started = start_http_server(port, addr="0.0.0.0", registry=registry)
        else:
            raise UsageError(f"--listen {address}:{port}: {e.strerror}") from None
    server = started[0] if isinstance(started, tuple) else None
    if ready is not None:
        bound = server.server_address[:2] if server is not None else (address, port)
        ready(bound)
    stop = stop or threading.Event()
    try:
        while not stop.is_set():
            began = time.monotonic()
            try:
                families = poll()
            except Exception as e:  # one bad poll must not end the exporter
                latest.failed()
                warn(f"poll failed: {type(e).__name__}: {e}")
            else:
                latest.store(families, clock(), time.monotonic() - began)
            stop.wait(interval)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
