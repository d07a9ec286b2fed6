"""`ibtool exporter`: the Engine's face for Prometheus, and an HTTP endpoint serving its latest
poll.

A scrape never waits for the kernel: the poller (the main thread) has the Engine read the host
every interval and replaces one cached list of families; the HTTP server (ibtool.web.server:
one event loop for every connection, a bounded pool of workers for the answers) hands out
whatever is cached. A device that hangs a read delays the next poll, never a scrape, and the
poll's age is itself a metric. What faces the network is bounded as node_exporter's
exporter-toolkit bounds it (`--web.max-requests`, its web configuration file for TLS and basic
auth).
"""

from __future__ import annotations

import gzip
import html
import re
import threading
import time
from collections.abc import Callable, Iterator

from ibtool.errors import UnsupportedError, UsageError
from ibtool.live.fabric import DEFAULT_INTERVAL, DEFAULT_MADS_PER_SECOND
from ibtool.views.prometheus import METRIC_TYPES, MetricFamily, exposition

DEFAULT_PORT = 9877
# exporter-toolkit's --web.max-requests default (node_exporter). Each answer is built from the
# cached poll in milliseconds: over a thousand at once is a flood, not scrapes.
MAX_REQUESTS, MAX_REQUESTS_MAX = 40, 1000
METRICS_PATH = "/metrics"
# --fabric: the scans' interval from a second to a day, and the PMA queries a second they may
# send (defaults: ibtool.live.fabric's). A scan sends one query at a time and waits for its
# answer, so round trips hold it below the ceiling anyway; at the floor a 648-HCA tree's
# 5,900 queries (ClassPortInfo a LID, PortCounters and PortCountersExtended a port) take 10
# minutes.
FABRIC_INTERVAL, FABRIC_INTERVAL_MIN, FABRIC_INTERVAL_MAX = DEFAULT_INTERVAL, 1.0, 86400.0
FABRIC_MADS, FABRIC_MADS_MIN, FABRIC_MADS_MAX = DEFAULT_MADS_PER_SECOND, 10, 20000


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
        self.faults = 0

    def store(self, families: list[MetricFamily], at: float, duration: float) -> None:
        with self.lock:
            self.families, self.polled_at, self.duration = families, at, duration
            self.polls += 1

    def failed(self) -> None:
        with self.lock:
            self.errors += 1

    def faulted(self, count: int, *, error: bool = True) -> None:
        """A poll could not read `count` things (a device, a file, a counter, a socket when
        the process ran out of descriptors), each one a warning: the poll counts as an error
        (`error`, unless it failed and was counted so already)."""
        with self.lock:
            self.faults += count
            self.errors += error

    def snapshot(self) -> list[MetricFamily]:
        with self.lock:
            families = list(self.families)
            polled_at, duration, polls, errors, faults = (
                self.polled_at,
                self.duration,
                self.polls,
                self.errors,
                self.faults,
            )
        own = [
            MetricFamily("ibtool_exporter_polls", "Polls of the host since start", "counter"),
            MetricFamily(
                "ibtool_exporter_poll_errors",
                "Polls that failed or could not read part of the host",
                "counter",
            ),
            MetricFamily(
                "ibtool_exporter_poll_faults",
                "Things polls could not read (a device, file, counter or socket), each a warning",
                "counter",
            ),
        ]
        own[0].add({}, polls)
        own[1].add({}, errors)
        own[2].add({}, faults)
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


class Faults:
    """The warnings of a poll, passed on and counted: the poller hands `warn` to the host it
    reads, and the exporter takes the count after each poll."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn, self._count, self._lock = warn, 0, threading.Lock()

    def warn(self, text: str) -> None:
        with self._lock:
            self._count += 1
        self._warn(text)

    def take(self) -> int:
        with self._lock:
            count, self._count = self._count, 0
        return count


TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
EOF = b"# EOF\n"  # OpenMetrics' last line (prometheus_client's openmetrics.exposition)


class FabricSeries:
    """The fabric's series (`ibtool exporter --fabric`) of a FabricWatch's latest scan, for
    the scrapes: written out by `refresh` (the poller's, once a poll; it starts the watch
    after the first poll, and its owner stops it) when a new scan has ended, never at a
    scrape, which copies the text (`text`). Another format (OpenMetrics) is
    written once a scan too, at the first scrape that asks for it; only a scrape that names
    families (`name[]`) has them built again (`families`). What is held between scans is the
    scan and its texts: tens of thousands of series are kept as text, not as objects.

    Nothing before the first scan ends; after, every port's families and the scan's own, so
    that a failed or stale scan is seen (ibtool_fabric_up,
    ibtool_fabric_last_scan_timestamp_seconds)."""

    def __init__(self, watch, warn: Callable[[str], None]) -> None:
        self.watch, self.warn = watch, warn
        # the scan served and its texts by content type, swapped whole
        self._current: tuple[object, dict[str, bytes]] = (None, {})
        self._seen = None
        self._started = False
        self._error: str | None = None  # the last scan's, said once
        self._lock = threading.Lock()  # one scrape writes a new format, the others wait

    def refresh(self) -> None:
        """After each poll: the watch started after the first (the host's own first read done
        before the scans begin, not beside them), the scan served when a new one has ended."""
        if not self._started:
            self._started = True
            self.watch.start()
        seen = self.watch.latest
        if seen is None or seen is self._seen:
            return
        self._seen = seen
        if seen.error and seen.error != self._error:  # said once, until it changes
            self.warn(f"fabric: {seen.error}")
        self._error = seen.error
        try:
            # family by family, each let go once written: one held at a time, not 60,000
            # series and their lines for a 648-HCA tree
            text = b"".join(exposition((f,)).encode() for f in fabric_families(seen))
        except Exception as e:  # one scan that cannot be served must not end the exporter
            self.warn(f"fabric: scan {seen.number} not served: {type(e).__name__}: {e}")
        else:
            self._current = (seen, {TEXT_FORMAT: text})  # one swap: a scrape sees one whole

    def families(self) -> list[MetricFamily]:
        """The families of the scan served, built again (for a scrape with `name[]`, or the
        encoder of a format not written out yet)."""
        seen = self._current[0]
        return list(fabric_families(seen)) if seen is not None else []

    def text(self, content_type: str = TEXT_FORMAT, encoder=None) -> bytes:
        """The series as `encoder` writes them for `content_type` (default: the text format
        0.0.4, written by `refresh`), without OpenMetrics' closing "# EOF"; written once a
        scan."""
        seen, texts = self._current
        found = texts.get(content_type)
        if found is not None or seen is None:
            return found or b""
        with self._lock:
            seen, texts = self._current
            if content_type not in texts:
                texts[content_type] = b"".join(
                    _unclosed(_encoded(encoder, [f])) for f in fabric_families(seen)
                )  # family by family, as refresh writes the text format
            return texts[content_type]


def _unclosed(body: bytes) -> bytes:
    """An encoder's text without OpenMetrics' closing "# EOF", for more to follow."""
    return body[: -len(EOF)] if body.endswith(EOF) else body


def _encoded(encoder, families: list[MetricFamily]) -> bytes:
    """`families` as one of prometheus_client's encoders writes them."""
    from prometheus_client.registry import CollectorRegistry

    class Collector:
        def collect(self):
            return _client_families(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return encoder(registry)


def fabric_families(seen) -> Iterator[MetricFamily]:
    """The families of one FabricSeen: every port's (none where the scan failed), then the
    scan's own; one at a time, for a writer that lets each go once written."""
    from ibtool.views.fabric_metrics import port_families, scan_families

    nodes = seen.fabric.nodes.values() if seen.fabric is not None else ()
    own = scan_families(
        number=seen.number,
        at=seen.time,
        duration=seen.duration,
        mads=seen.mads,
        warnings=len(seen.notes),
        error=seen.error,
        nodes=nodes,
        sms=seen.sms.sms if seen.sms is not None else (),
    )
    if seen.fabric is not None:
        yield from port_families(seen.fabric, seen.counters)
    yield from own


def fabric_watch(inv, warn: Callable[[str], None], **options):
    """The exporter's FabricWatch (ibtool.live.fabric.watch_for): `interval`, `bounds`, `via`,
    `mads_per_second`; not started."""
    from ibtool.live.fabric import watch_for

    return watch_for(inv, warn, **options)


def poller(inv, checks: dict, config, warn: Callable[[str], None] | None = None):
    """What one poll gives: the health results and every collector's families, both of one
    Engine poll. The checks keep their baselines in memory, so their counter deltas are per
    poll interval. What cannot be read goes to `warn` (default: the invocation's warnings),
    which the exporter counts; a capture is the invocation's host, its warnings the command's."""
    from ibtool.health import run as health
    from ibtool.health import textfile as metrics
    from ibtool.live.engine import Engine, hosts_for

    engine: Engine | None = None

    def note(message: str) -> None:
        engine.note(message)  # type: ignore[union-attr]  (built before the first poll)

    hosts = hosts_for(inv, note, own_capture=False)
    engine = Engine(
        hosts, checks=checks, config=config, ports=False, counters=False, warn=warn or inv.warn
    )

    def poll() -> list[MetricFamily]:
        reading = engine.poll(read=lambda host, ports: metrics.collected(inv.plugins, host, note))
        return health.status_families(reading.report) + reading.extra

    return poll


def _server_families(stats: dict) -> list[MetricFamily]:
    """The HTTP server's own figures, as promhttp's promhttp_metric_handler_* are Go's."""
    requests = MetricFamily(
        "ibtool_exporter_http_responses", "HTTP responses sent, by status code", "counter"
    )
    for code, n in sorted(stats["responses"].items()):
        requests.add({"code": str(code)}, n)
    closed = MetricFamily(
        "ibtool_exporter_http_connections_closed",
        "HTTP connections the server closed, by why (timeouts, evicted at the cap, refused input)",
        "counter",
    )
    for reason, n in sorted(stats["closed"].items()):
        closed.add({"reason": reason}, n)
    open_now = MetricFamily("ibtool_exporter_http_connections", "HTTP connections open", "gauge")
    open_now.add({}, stats["connections"])
    in_flight = MetricFamily(
        "ibtool_exporter_http_requests_in_flight", "Requests being answered", "gauge"
    )
    in_flight.add({}, stats["in_flight"])
    accepted = MetricFamily(
        "ibtool_exporter_http_connections_accepted", "HTTP connections accepted", "counter"
    )
    accepted.add({}, stats["accepted"])
    return [accepted, open_now, closed, in_flight, requests]


def _build_info() -> MetricFamily:
    import platform

    from ibtool import __version__

    info = MetricFamily(
        "ibtool_build_info", "ibtool's version and the Python running it; always 1", "gauge"
    )
    info.add({"version": __version__, "pythonversion": platform.python_version()}, 1)
    return info


def _client_families(families: list[MetricFamily]):
    """ibtool's families as prometheus_client's, sample for sample: for the OpenMetrics format,
    which ibtool does not write itself."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for family in families:
        kind = CounterMetricFamily if family.type == "counter" else GaugeMetricFamily
        names = sorted({k for s in family.samples for k in s.labels})
        out = kind(family.name, family.documentation, labels=names)
        for labels, value in family.samples:
            out.add_metric([labels.get(n, "") for n in names], value)
        yield out


def _process_families(process) -> list[MetricFamily]:
    """prometheus_client's process_* metrics (its ProcessCollector reads /proc/self) as
    ibtool's families: a counter and gauges, which is all it collects."""
    families = []
    for metric in process.collect():
        if metric.type not in METRIC_TYPES:
            continue
        family = MetricFamily(metric.name, metric.documentation, metric.type)
        for sample in metric.samples:
            family.add(sample.labels, sample.value)
        families.append(family)
    return families


def _named(family: MetricFamily, names: set[str]) -> bool:
    """Prometheus' `name[]` parameter: a family is wanted when the name is the family's or its
    samples' (a counter `x` exposes `x_total`)."""
    return family.name in names or family.exposed_name in names


LANDING = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>ibtool exporter</title></head>
<body>
<h1>ibtool exporter</h1>
<p>This node's RDMA health and counters for Prometheus.</p>
<ul><li><a href="{path}">{path}</a></li></ul>
<p>ibtool {version}</p>
</body>
</html>
"""


# RFC 9110 12.4.2: qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
_QVALUE = re.compile(r"0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?")
# RFC 9110 12.4.2: weight = OWS ";" OWS "q=" qvalue, the "q" in any case
_WEIGHT = re.compile(r"[ \t]*;[ \t]*[qQ]=([^ \t]*)[ \t]*")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def accepts_gzip(header: str | None) -> bool:
    """Whether a response may be gzip-compressed for this Accept-Encoding (RFC 9110 12.5.3):
    when gzip (or x-gzip, 8.4.1.3) has a weight above 0, from its own entry or else from "*",
    and at least that of identity (its own entry or "*"; not listed, it is acceptable but
    never preferred). q=0 is "not acceptable". An entry whose weight is not a qvalue, or that
    has another parameter, counts as q=0: identity is always acceptable to send. An empty
    header asks for no coding; none at all allows any (12.5.3), but a client that says
    nothing may not decode one, so it gets identity too, as from promhttp.

    The work is bounded by the header's size, which the server caps (max_header_bytes)."""
    if not header:
        return False
    listed: dict[str, float] = {}
    for element in header.split(","):
        coding, sep, params = element.partition(";")
        coding = coding.strip(" \t").lower()
        if not coding:
            continue  # RFC 9110 5.6.1.2: empty list elements are ignored
        if not _TOKEN.fullmatch(coding):
            continue  # not a coding: it names nothing this could send
        q = 1.0
        if sep:
            m = _WEIGHT.fullmatch(sep + params)
            q = float(m.group(1)) if m and _QVALUE.fullmatch(m.group(1)) else 0.0
        if coding == "x-gzip":
            coding = "gzip"
        # said twice: the lower weight, so that a q=0 anywhere forbids
        listed[coding] = min(q, listed.get(coding, q))
    star = listed.get("*")
    gzip_q = listed.get("gzip", star if star is not None else 0.0)
    identity_q = listed.get("identity", star if star is not None else 0.0)
    return gzip_q > 0 and gzip_q >= identity_q


class Endpoint:
    """The answers: /metrics (GET, HEAD) in the format the scraper asks for, with `name[]`
    honoured and gzip when accepted; a landing page at /; 404 and 405 elsewhere.

    With a web configuration, auth() is the server's auth stage, ahead of __call__ and of the
    count of requests in flight (HTTPServer's `auth`): a client certificate outside
    client_allowed_sans is 403, a request without the right basic-auth credentials 401,
    before anything else. __call__ does not check them again: it is never called without
    auth() before it (serve() passes both)."""

    def __init__(
        self,
        latest: Latest,
        server_stats: Callable[[], dict],
        web=None,
        fabric: FabricSeries | None = None,
    ) -> None:
        from prometheus_client import ProcessCollector

        self.latest, self.server_stats, self.web = latest, server_stats, web
        self.fabric = fabric
        self.process = ProcessCollector(registry=None)
        self.info = _build_info()

    def auth(self, request):
        """In the server's event loop, for every request: None (let through), a 403 or 401
        Response, or, for credentials not checked before, the bcrypt check to run off the
        loop. A known scraper is let through from the cache without waiting for any check
        under way: exporter-toolkit's web/handler.go looks in its cache before it takes
        bcryptMtx, and its in-flight cap (promhttp) counts only what got past it."""
        config = self.web.current() if self.web is not None else None
        if config is None:
            return None
        if not config.allowed_peer(request.peer_cert):
            return self._plain(403, "Forbidden\n", config)
        authorization = request.headers.get("authorization")
        known = config.cached(authorization)
        if known is not None:
            return None if known else self._unauthorized(config)

        def check():
            return None if config.authorized(authorization) else self._unauthorized(config)

        return check

    def _unauthorized(self, config):
        reply = self._plain(401, "Unauthorized\n", config)
        reply.headers.append(("WWW-Authenticate", 'Basic realm="ibtool exporter"'))
        return reply

    def __call__(self, request):
        from ibtool.web.server import Response

        config = self.web.current() if self.web is not None else None
        if request.path not in (METRICS_PATH, "/"):
            return self._plain(404, "Not Found\n", config)
        if request.method not in ("GET", "HEAD"):
            reply = self._plain(405, "Method Not Allowed\n", config)
            reply.headers.append(("Allow", "GET, HEAD"))
            return reply
        if request.path == "/":
            from ibtool import __version__

            body = LANDING.format(path=METRICS_PATH, version=html.escape(__version__)).encode()
            return Response(200, self._headers(config, "text/html; charset=utf-8"), body)
        body, content_type = self.metrics(
            request.headers.get("accept", ""), request.query.get("name[]")
        )
        headers = self._headers(config, content_type)
        if accepts_gzip(request.headers.get("accept-encoding")):
            body = gzip.compress(body, compresslevel=6)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Vary", "Accept-Encoding"))
        return Response(200, headers, body)

    def metrics(self, accept: str, names: list[str] | None) -> tuple[bytes, str]:
        """The answer in the format the scraper asks for (prometheus_client's choice from its
        Accept header): the text format 0.0.4 from ibtool's encoder, the one its textfiles are
        written by; OpenMetrics, and the text format 1.0.0 with its name escaping, from
        prometheus_client's."""
        from prometheus_client.exposition import choose_encoder, generate_latest

        encoder, content_type = choose_encoder(accept)
        text = encoder is generate_latest
        if self.fabric is not None and not names:
            # the fabric's series as written once for its scan: a scrape copies them, never
            # encodes them again (tens of thousands of series)
            fabric = self.fabric.text(TEXT_FORMAT if text else content_type, encoder)
            head, tail = self.latest.snapshot(), self._own()
            if text:
                body = exposition(head).encode() + fabric + exposition(tail).encode()
            else:
                body = _unclosed(_encoded(encoder, head)) + fabric + _encoded(encoder, tail)
            return body, content_type
        families = self.families(names)
        if text:
            return exposition(families).encode(), content_type
        return _encoded(encoder, families), content_type

    def families(self, names: list[str] | None = None) -> list[MetricFamily]:
        """What an answer holds: the last poll's families, the fabric's (with --fabric), the
        server's, the build and the process; only those `names` (Prometheus' `name[]`) asks
        for, if any."""
        families = self.latest.snapshot()
        if self.fabric is not None:
            families += self.fabric.families()
        families += self._own()
        if names:
            wanted = set(names)
            families = [f for f in families if _named(f, wanted)]
        return families

    def _own(self) -> list[MetricFamily]:
        """The server's families, the build's and the process'."""
        return _server_families(self.server_stats()) + [self.info] + _process_families(self.process)

    @staticmethod
    def _headers(config, content_type: str) -> list[tuple[str, str]]:
        headers = [("Content-Type", content_type)]
        if config is not None:
            headers += list(config.headers)
        return headers

    def _plain(self, status: int, text: str, config):
        from ibtool.web.server import Response

        return Response(status, self._headers(config, "text/plain; charset=utf-8"), text.encode())


def serve(
    listen: tuple[str, int],
    poll: Callable[[], list[MetricFamily]],
    interval: float,
    warn: Callable[[str], None],
    *,
    clock: Callable[[], float] = time.time,
    stop: threading.Event | None = None,
    ready: Callable[[tuple[str, int]], None] | None = None,
    max_requests: int = MAX_REQUESTS,
    web=None,
    faults: Faults | None = None,
    limits=None,
    fabric: FabricSeries | None = None,
) -> None:
    """Serves the latest `poll()` on `listen` until interrupted (or `stop` is set): a poll, then
    `interval` seconds of rest, and so on; a poll that raises is one warning, and the families
    of the poll before stay served. `web`: exporter-toolkit's web configuration file (TLS,
    basic auth) as a webconfig.Watcher, which re-reads it when it or a file it names changes.
    `faults`: what `poll` warned about, taken after each poll (a poll with faults counts as an
    error). `fabric`: the fabric's families, refreshed after each poll and served after the
    poll's."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UnsupportedError(
            "ibtool exporter needs the prometheus_client package",
            "pip install prometheus_client (Debian: python3-prometheus-client)",
        ) from None
    from ibtool.web import server as httpserve

    limits = limits or httpserve.Limits(max_requests=max_requests)
    latest = Latest()
    server: httpserve.HTTPServer | None = None
    endpoint = Endpoint(latest, lambda: server.stats() if server else _no_stats(), web, fabric)
    address, port = listen
    server = httpserve.HTTPServer(
        (address, port),
        endpoint,
        limits,
        tls=web.tls if web is not None else None,
        log=warn,
        auth=endpoint.auth if web is not None else None,
    )
    try:
        bound = server.bind()
    except OSError as e:
        raise UsageError(f"--listen {address}:{port}: {e.strerror or e}") from None
    server.start()
    if ready is not None:
        ready(bound)
    stop = stop or threading.Event()
    try:
        while not stop.is_set():
            began, failed = time.monotonic(), False
            try:
                families = poll()
            except Exception as e:  # one bad poll must not end the exporter
                failed = True
                latest.failed()
                warn(f"poll failed: {type(e).__name__}: {e}")
            else:
                latest.store(families, clock(), time.monotonic() - began)
            count = faults.take() if faults is not None else 0
            if count:
                latest.faulted(count, error=not failed)
            if fabric is not None:
                fabric.refresh()
            stop.wait(interval)
    finally:
        server.shutdown()


def _no_stats() -> dict:
    return {"connections": 0, "in_flight": 0, "accepted": 0, "responses": {}, "closed": {}}
