"""A small HTTP/1.1 server for `ibtool exporter`, bounded in every dimension.

prometheus_client's start_http_server gives every connection a thread, with no cap and no idle
timeout, listens with a backlog of 5 and never answers a request line without a version: on a
node reachable from the network for months, a few hundred idle sockets exhaust it. Here one
thread does all socket I/O without blocking (accept, the TLS handshake, reading request heads,
writing responses), so an idle or slow connection costs an fd and a few KB, never a thread; only
the handler runs in a small pool. Every wait has a deadline (as Go's net/http Server has
ReadHeaderTimeout, IdleTimeout and WriteTimeout), connections have a cap, and at the cap the
connection idle the longest makes room for a new one.

An optional auth stage runs ahead of the handler and of the count of requests in flight (as
exporter-toolkit's web/handler.go wraps the metrics handler, whose promhttp in-flight cap then
counts only requests already authenticated): a credential known good or known bad is answered
by the loop at once, and only an uncached check (bcrypt, slow on purpose) goes to one thread,
with a small waiting room; see HTTPServer.
"""

from __future__ import annotations

import collections
import email.utils
import errno
import heapq
import http
import itertools
import os
import queue
import re
import resource
import selectors
import socket
import ssl
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable
from dataclasses import field

from ibtool.model.deferred import dataclass


@dataclass
class Request:
    """A request head as parsed; its body, if any, is never read."""

    method: str
    path: str
    query: dict[str, list[str]]
    version: str
    headers: dict[str, str]
    peer: tuple[str, int]
    tls: bool
    peer_cert: dict | None


@dataclass
class Response:
    """What a handler returns; Content-Length, Connection and Date are the server's."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    # may be shared by many responses (the exporter's cached page): sent, never mutated
    body: bytes = b""


@dataclass(frozen=True)
class Limits:
    """Every resource a client can make the server hold, bounded."""

    # handlers running at once; over it the loop answers 503 itself
    max_requests: int = 40
    # uncached credential checks (the auth stage's slow path) queued or running; over it the
    # loop answers 503 itself. Each is a bcrypt check, 50-300 ms at costs 10-12, run one at
    # a time: 8 waiting is at most a few seconds' wait, well inside a scrape timeout.
    max_auth_pending: int = 8
    # None: min(4096, soft RLIMIT_NOFILE - 64), at least 16
    max_connections: int | None = None
    # the TLS handshake and the first request head from the accept, a later head from its
    # first byte (Go's Server.ReadHeaderTimeout)
    read_timeout: float = 10.0
    # a keep-alive connection waiting for its next request (Go's Server.IdleTimeout)
    idle_timeout: float = 60.0
    # a whole response (Go's Server.WriteTimeout)
    write_timeout: float = 10.0
    # requests on one connection, then Connection: close
    keepalive_requests: int = 100
    # over it: 414 (RFC 9112 3 recommends supporting request lines of at least 8000 octets)
    max_request_line: int = 8192
    # request line and header fields; over it: 431 (RFC 6585 5)
    max_header_bytes: int = 16384
    # header field lines; over it: 431
    max_headers: int = 100
    # listen(2) backlog, capped by the kernel at net.core.somaxconn
    backlog: int = 1024


# stats()["closed"] always has these keys, so a reader can index them before the first event
REASONS = (
    "read_timeout",
    "idle_timeout",
    "write_timeout",
    "evicted",
    "too_large",
    "bad_request",
    "tls_handshake",
    "accept_error",
    "peer",
    "done",
    "shutdown",
    "error",
)

_HANDSHAKE, _READ, _HANDLER, _WRITE, _LINGER = range(5)
_LISTEN, _WAKE = object(), object()

# fds left to the rest of the process when the cap comes from RLIMIT_NOFILE: the exporter's
# poller reads sysfs and netlink while connections are open
_FD_RESERVE = 64
_SAY_EVERY = 60.0  # a repeated log line is said at most once a minute, with its count
WORKER_IDLE = 60.0  # an idle handler thread exits after this
# Go's net/http closeWriteAndWait: after a final response, half-close and wait a little for the
# client to read it, so that unread input does not make the kernel reset the connection (and
# destroy the response) on close (rstAvoidanceDelay, 500 ms; RFC 9112 9.6's staged close)
_LINGER_TIME = 0.5
_ACCEPT_BURST = 256  # accepts per loop turn: a connect flood cannot starve the other sockets
_ACCEPT_BACKOFF = 0.1  # no fd even for the spare: stop accepting this long rather than spin
_TLS_CHUNK = 65536

# Before a TLS handshake, what the client's first bytes may be when it speaks plain HTTP: an
# upper-case method (RFC 9110 9.1: methods are case-sensitive, the registered ones upper-case),
# then a space and the target. Go's net/http looks at the same 5 bytes, the first record
# header (server.go tlsRecordHeaderLooksLikeHTTP: "GET /", "HEAD ", "POST ", "PUT /",
# "OPTIO"); this takes any such method. A partial match may still become one.
_PLAIN_HTTP = re.compile(rb"[A-Z]{1,5}|[A-Z]{1,4} [\x21-\x7e]*")
_PLAIN_HTTP_BYTES = 5
# Go's words (server.go), so that `curl http://` at the TLS port says what is wrong
_PLAIN_HTTP_ANSWER = b"Client sent an HTTP request to an HTTPS server.\n"

# RFC 9110 5.6.2: token = 1*tchar
_TCHAR = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
_TOKEN_STR = re.compile(_TCHAR.decode() + "+")
# RFC 9112 3: request-line = method SP request-target SP HTTP-version (2.2: a bare LF ends it
# too, the CR is stripped before this)
_REQUEST_LINE = re.compile(rb"(%s+) ([\x21-\x7e]+) HTTP/([0-9])\.([0-9])" % _TCHAR)
# any start of a request line that may still become one: garbage, a TLS ClientHello or a
# binary protocol is refused at its first bytes, not when a line end happens to come
_REQUEST_START = re.compile(
    rb"%s*(?: [\x21-\x7e]*(?: (?:H(?:T(?:T(?:P(?:/(?:[0-9](?:\.[0-9]?)?)?)?)?)?)?)?)?)?\r?" % _TCHAR
)
_LINE_BYTES = re.compile(rb"[\x20-\x7e\r]*")
# RFC 9112 5.1: field-line = field-name ":" OWS field-value OWS, no whitespace before the colon
_FIELD = re.compile(rb"(%s+):[ \t]*(.*?)[ \t]*" % _TCHAR)
# RFC 9110 5.5: no CTL in a field value but HTAB (a bare CR included: RFC 9112 2.2)
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_CTL_STR = re.compile("[\x00-\x08\x0a-\x1f\x7f]")
_DIGITS = re.compile(r"[0-9]+")

_REASON_PHRASES = {s.value: s.phrase for s in http.HTTPStatus}


def _peer(addr) -> tuple[str, int]:
    host, port = addr[0], addr[1]
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]
    return host, port


def _default_cap() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, min(4096, soft - _FD_RESERVE))


def encode_response(
    status: int, headers: list[tuple[str, str]], body, *, head: bool, keep: bool
) -> tuple[bytes, memoryview | None]:
    """The status line and header block, and the body as a view (not copied).

    Content-Length, Connection and Date are the server's: a handler's own are dropped, since
    framing the message is the server's job. A header with a CR or LF raises (response
    splitting), and the request then gets a 500."""
    if not isinstance(status, int) or not 100 <= status <= 999:
        raise ValueError(f"bad status {status!r}")
    view = memoryview(body).cast("B")
    # RFC 9110 8.6: no Content-Length in a 1xx or 204 response; 304 has no content
    bodiless = status < 200 or status in (204, 304)
    lines = [f"HTTP/1.1 {status} {_REASON_PHRASES.get(status, 'Unknown')}"]
    if not bodiless:
        lines.append(f"Content-Length: {view.nbytes}")
    lines.append("Connection: keep-alive" if keep else "Connection: close")
    lines.append("Date: " + email.utils.formatdate(usegmt=True))
    for name, value in headers:
        if not isinstance(name, str) or not _TOKEN_STR.fullmatch(name):
            raise ValueError(f"bad response header name {name!r}")
        if not isinstance(value, str) or _CTL_STR.search(value):
            raise ValueError(f"bad response header value {name}: {value!r}")
        if name.lower() in ("content-length", "connection", "date", "transfer-encoding"):
            continue
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    out = "\r\n".join(lines).encode("latin-1")
    if head or bodiless or not view.nbytes:
        return out, None
    return out, view


class _Conn:
    __slots__ = (
        "sock",
        "peer",
        "tls",
        "peer_cert",
        "state",
        "events",
        "buf",
        "pos",
        "scan",
        "line",
        "fields",
        "deadline",
        "nreq",
        "out",
        "close_after",
        "reason",
        "ctx",
    )

    def __init__(self, sock, peer: tuple[str, int]) -> None:
        self.sock = sock
        self.peer = peer
        self.tls = False
        self.peer_cert: dict | None = None
        self.state = _READ
        self.events = 0
        self.buf = bytearray()
        self.pos = 0  # start of the next line not parsed yet
        self.scan = 0  # how far buf was searched for a line end
        self.line: tuple | None = None  # the request line's parts, once parsed
        self.fields: list[tuple[str, str]] = []
        self.deadline: float | None = None
        self.nreq = 0
        self.out: collections.deque = collections.deque()
        self.close_after = False
        self.reason = "done"
        # the TLS context, until the client's first byte says it speaks TLS (then wrapped)
        self.ctx: ssl.SSLContext | None = None


class _Pool:
    """At most `size` handler threads, started when needed; one idle for a while exits."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: set[threading.Thread] = set()
        self.busy = 0  # tasks queued or running
        self.stopping = False

    def submit(self, fn: Callable[[], None]) -> None:
        with self.lock:
            if self.stopping:
                return
            self.busy += 1
            self.tasks.put(fn)
            if self.busy > len(self.threads) and len(self.threads) < self.size:
                t = threading.Thread(target=self._work, name="httpserve-handler", daemon=True)
                self.threads.add(t)
                t.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                fn = self.tasks.get(timeout=WORKER_IDLE)
            except queue.Empty:
                with self.lock:
                    # the others idle can take whatever is queued
                    if self.stopping or self.busy < len(self.threads):
                        self.threads.discard(me)
                        return
                continue
            if fn is None:
                with self.lock:
                    self.threads.discard(me)
                return
            try:
                fn()
            finally:
                with self.lock:
                    self.busy -= 1

    def stop(self, timeout: float) -> list[threading.Thread]:
        """Stops every thread; returns those still running a handler after `timeout`."""
        with self.lock:
            self.stopping = True
            threads = list(self.threads)
        for _ in threads:
            self.tasks.put(None)
        end = time.monotonic() + timeout
        me = threading.current_thread()
        for t in threads:
            if t is not me:  # shutdown() called by a handler
                t.join(max(0.0, end - time.monotonic()))
        return [t for t in threads if t.is_alive() and t is not me]


class HTTPServer:
    """HTTP/1.1 on one event-loop thread; `handler` runs in at most max_requests threads.

    `tls`, if given, is called in the loop thread for every accepted connection: it returns
    the context to use (a new one after a certificate rotation; None: plaintext), so it must
    be cheap, a cached context. `log` gets one line per notable event, each kind at most once
    a minute.

    `auth`, if given, is the auth stage: called in the loop thread for every request before
    it counts against max_requests, so it must be cheap (a cache lookup). It returns None to
    let the request through to the handler, a Response to answer it at once (401, 403), or a
    callable for what is not cheap (a bcrypt check), which one auth thread runs, each in turn,
    and which returns None or a Response in the same way. At most max_auth_pending of those
    wait or run; more are answered 503 at once.

    Why a stage of its own: exporter-toolkit (web/handler.go) authenticates before its
    wrapped handler runs, and promhttp's MaxRequestsInFlight wraps the metrics handler, so
    its cap counts only authenticated requests, and a cached credential never waits for
    bcryptMtx. Counted as handlers, requests waiting for the one bcrypt at a time filled
    max_requests under a flood of wrong passwords, and the scraper whose credential was
    cached got 503 on every try. Here the flood waits in a room of its own, bounded in
    length and in threads (Go's goroutines queue on bcryptMtx without a bound, which threads
    cannot afford), and the excess is refused at once, never left waiting."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: Callable[[Request], Response],
        limits: Limits = Limits(),  # noqa: B008 (frozen: one shared default is safe)
        *,
        tls: Callable[[], ssl.SSLContext | None] | None = None,
        log: Callable[[str], None] = lambda line: None,
        auth: Callable[[Request], Response | Callable[[], Response | None] | None] | None = None,
    ) -> None:
        self.address = address
        self.limits = limits
        self.max_connections = (
            limits.max_connections if limits.max_connections is not None else _default_cap()
        )
        self._handler = handler
        self._tls = tls
        self._auth = auth
        self._log = log
        self._lock = threading.Lock()  # the counters, which stats() copies
        self._accepted = 0
        self._in_flight = 0
        self._auth_pending = 0
        self._responses: dict[int, int] = {}
        self._closed = dict.fromkeys(REASONS, 0)
        self._said_lock = threading.Lock()
        self._said: dict[str, list] = {}  # key -> [when last said, times since]
        self._listener: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._spare = -1
        self._thread: threading.Thread | None = None
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._stopping = False
        self._conns: set[_Conn] = set()
        # connections nobody waits on (no request being answered), the longest idle first
        self._evictable: collections.OrderedDict[_Conn, None] = collections.OrderedDict()
        self._heap: list = []  # (deadline, seq, conn), stale entries skipped when popped
        self._seq = itertools.count()
        self._results: collections.deque = collections.deque()
        self._ready: list[_Conn] = []  # back to reading: parse what is buffered next turn
        self._listening = False
        self._accept_at: float | None = None  # accepting paused until then (no fd)
        self._pool = _Pool(limits.max_requests)
        # one thread: bcrypt is CPU by design, one check at a time (web/handler.go bcryptMtx)
        self._auth_pool = _Pool(1)
        self._auth_results: collections.deque = collections.deque()

    # -- the public side -------------------------------------------------------------------

    def bind(self) -> tuple[str, int]:
        """Binds and listens; returns the address really bound (port 0 gets one)."""
        if self._listener is not None or self._stopped:
            raise RuntimeError("bind() once, before shutdown()")
        host, port = self.address
        if host == "":
            # every address: one IPv6 socket taking IPv4 too, or IPv4 alone without IPv6
            try:
                sock = self._listen_on(socket.AF_INET6, ("::", port), dual=True)
            except OSError as e:
                if e.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                    raise
                sock = self._listen_on(socket.AF_INET, ("0.0.0.0", port))
        else:
            info = socket.getaddrinfo(
                host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
            )
            family, _type, _proto, _name, sockaddr = info[0]
            sock = self._listen_on(family, sockaddr)
        try:
            # the spare fd exists from the start: at EMFILE it is what lets a connection be
            # accepted (and closed) so that the listening socket stops being readable
            self._spare = self._open_spare()
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._sel = selectors.DefaultSelector()
            self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
            self._sel.register(sock, selectors.EVENT_READ, _LISTEN)
        except BaseException:
            sock.close()
            self._close_all()
            raise
        self._listener = sock
        self._listening = True
        bound = sock.getsockname()
        return bound[0], bound[1]

    def start(self) -> None:
        """Runs the event loop in a daemon thread (binding first if bind() was not called)."""
        if self._thread is not None or self._stopped:
            raise RuntimeError("start() once, before shutdown()")
        if self._listener is None:
            self.bind()
        self._thread = threading.Thread(target=self._run, name="httpserve", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Closes every connection and the listening socket, and joins every thread."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        self._stopping = True
        if self._thread is not None:
            self._wakeup()
            self._thread.join()
        else:
            self._close_all()
        # a handler that never returns cannot be interrupted: waited for a write timeout
        stuck = self._pool.stop(max(1.0, self.limits.write_timeout))
        stuck += self._auth_pool.stop(max(1.0, self.limits.write_timeout))
        if stuck:
            self._log(f"http server shut down with {len(stuck)} handler(s) still running")

    def stats(self) -> dict:
        """A consistent copy of the counters (the exporter serves them as metrics)."""
        with self._lock:
            return {
                "connections": len(self._conns),
                "in_flight": self._in_flight,
                "auth_pending": self._auth_pending,
                "accepted": self._accepted,
                "responses": dict(self._responses),
                "closed": dict(self._closed),
            }

    # -- helpers ---------------------------------------------------------------------------

    def _listen_on(self, family: int, sockaddr, dual: bool = False) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if dual:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(sockaddr)
            sock.listen(self.limits.backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    @staticmethod
    def _open_spare() -> int:
        try:
            return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1

    def _say(self, key: str, text: str) -> None:
        """Logs text at most once a minute per key, with the times it happened since."""
        now = time.monotonic()
        with self._said_lock:
            said = self._said.get(key)
            if said is not None and now - said[0] < _SAY_EVERY:
                said[1] += 1
                return
            if said is None and len(self._said) >= 1024:
                # per-address keys of a scan from many sources: forget the quiet ones
                for k in [k for k, v in self._said.items() if now - v[0] >= _SAY_EVERY]:
                    del self._said[k]
                if len(self._said) >= 1024:
                    return
            count = 1 + (said[1] if said is not None else 0)
            self._said[key] = [now, 0]
        try:
            self._log(f"{text} ({count} since last said)")
        except Exception:  # a broken log must not take the server down with it
            pass

    def _count(self, reason: str) -> None:
        with self._lock:
            self._closed[reason] = self._closed.get(reason, 0) + 1

    def _wakeup(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (OSError, AttributeError):  # full (a wake-up is pending anyway) or closed
            pass

    def _set_events(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if not conn.events:
            self._sel.register(conn.sock, events, conn)
        elif not events:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _set_deadline(self, conn: _Conn, when: float | None) -> None:
        conn.deadline = when
        if when is not None:
            heapq.heappush(self._heap, (when, next(self._seq), conn))

    def _close(self, conn: _Conn, reason: str) -> None:
        if conn.sock is None:
            return
        if conn.events:
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.events = 0
        # counted first: whoever sees the close then sees it counted
        with self._lock:
            self._conns.discard(conn)
            self._closed[reason] = self._closed.get(reason, 0) + 1
        try:
            conn.sock.close()
        except OSError:
            pass
        conn.sock = None
        conn.deadline = None
        conn.out.clear()
        conn.buf = bytearray()
        self._evictable.pop(conn, None)

    def _close_all(self) -> None:
        for conn in list(self._conns):
            self._close(conn, "shutdown")
        self._heap.clear()
        self._ready.clear()
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        if self._sel is not None:
            self._sel.close()
        if self._spare >= 0:
            os.close(self._spare)
            self._spare = -1

    # -- the event loop --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                events = self._sel.select(self._timeout())
                # drained before the results are taken, never after: a result handed over
                # in between would lose its wake-up byte and wait for some other event
                if any(key.data is _WAKE for key, _mask in events):
                    self._drain_wake()
                self._collect()
                for key, _mask in events:
                    data = key.data
                    if data is _WAKE:
                        continue
                    if data is _LISTEN:
                        try:
                            self._accept()
                        except Exception as e:
                            self._say("accept-bug", f"accepting: {type(e).__name__}: {e}")
                            # the listening socket may still be readable: no spinning on it
                            self._pause_listen(time.monotonic() + _ACCEPT_BACKOFF)
                    elif data.sock is not None:
                        self._guarded(self._on_event, data)
                if self._ready:
                    ready, self._ready = self._ready, []
                    for conn in ready:
                        if conn.sock is not None and conn.state == _READ:
                            self._guarded(self._resume, conn)
                self._expire(time.monotonic())
                self._maybe_listen()
        except BaseException as e:
            self._log(f"http server stopped: {type(e).__name__}: {e}")
            raise
        finally:
            self._close_all()

    def _guarded(self, fn, conn: _Conn, *args) -> None:
        """A bug met by one connection closes it, not the server."""
        try:
            fn(conn, *args)
        except Exception as e:
            where = traceback.extract_tb(e.__traceback__)[-1]
            self._say(
                "error:" + type(e).__name__,
                f"http connection from {conn.peer[0]} failed: {type(e).__name__}: "
                f"{e} at {os.path.basename(where.filename)}:{where.lineno}",
            )
            self._close(conn, "error")

    def _timeout(self) -> float | None:
        if self._ready:
            return 0
        heap = self._heap
        if len(heap) > 2 * len(self._conns) + 64:
            heap[:] = [e for e in heap if e[2].sock is not None and e[2].deadline == e[0]]
            heapq.heapify(heap)
        while heap and (heap[0][2].sock is None or heap[0][2].deadline != heap[0][0]):
            heapq.heappop(heap)
        when = heap[0][0] if heap else None
        if self._accept_at is not None and (when is None or self._accept_at < when):
            when = self._accept_at
        if when is None:
            return None
        return max(0.0, when - time.monotonic())

    def _expire(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _seq, conn = heapq.heappop(heap)
            if conn.sock is None or conn.deadline != when:
                continue
            if conn.state == _READ and conn.nreq and not conn.buf:
                reason = "idle_timeout"
            elif conn.state in (_READ, _HANDSHAKE):
                reason = "read_timeout"
            elif conn.state == _WRITE:
                reason = "write_timeout"
            else:
                reason = conn.reason
            self._close(conn, reason)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _on_event(self, conn: _Conn) -> None:
        state = conn.state
        if state == _READ:
            self._read(conn)
        elif state == _WRITE:
            self._write(conn)
        elif state == _HANDSHAKE:
            self._handshake(conn)
        elif state == _LINGER:
            self._linger(conn)

    # -- accepting -------------------------------------------------------------------------

    def _maybe_listen(self) -> None:
        if self._listening or self._stopping:
            return
        if self._accept_at is not None:
            if time.monotonic() < self._accept_at:
                return
            self._accept_at = None
            if self._spare < 0:
                self._spare = self._open_spare()
        elif len(self._conns) >= self.max_connections and not self._evictable:
            return
        self._sel.register(self._listener, selectors.EVENT_READ, _LISTEN)
        self._listening = True

    def _pause_listen(self, until: float | None) -> None:
        """Stops watching the listening socket, which stays readable: connections wait in the
        backlog until there is room (until is None) or until the fd shortage may be over."""
        if self._listening:
            self._sel.unregister(self._listener)
            self._listening = False
        self._accept_at = until

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BURST):
            if len(self._conns) >= self.max_connections and not self._evictable:
                # every connection is being answered: the new ones wait in the backlog
                self._pause_listen(None)
                return
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Linux fails accept() for want of an fd before it looks at the queue:
                    # whether another connection waits, only select() can say
                    self._out_of_fds(e)
                    return
                # ECONNABORTED, EPROTO, EPERM (a firewall), ...: that connection is gone, the
                # next may be fine (as Go's Server.Serve retries a temporary error)
                continue
            if len(self._conns) >= self.max_connections:
                self._evict()
            self._admit(sock, addr)

    def _out_of_fds(self, e: OSError) -> None:
        """EMFILE/ENFILE: the pending connection is accepted with the spare fd and closed, or
        the listening socket (readable until it is) would make the loop spin."""
        self._count("accept_error")
        self._say(
            "accept",
            f"cannot accept: {os.strerror(e.errno)}",
        )
        if self._spare >= 0:
            os.close(self._spare)
            self._spare = -1
            try:
                sock, _addr = self._listener.accept()
                sock.close()
            except OSError:
                pass
            self._spare = self._open_spare()
            if self._spare >= 0:
                return
        # not even the spare: another thread took the fd; look again a little later
        self._pause_listen(time.monotonic() + _ACCEPT_BACKOFF)

    def _evict(self) -> None:
        conn = next(iter(self._evictable))
        self._close(conn, "evicted")
        self._say(
            "evict",
            f"{self.max_connections} connections open: closed the longest idle",
        )

    def _admit(self, sock: socket.socket, addr) -> None:
        now = time.monotonic()
        with self._lock:
            self._accepted += 1
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            self._count("peer")
            sock.close()
            return
        peer = _peer(addr)
        ctx = None
        if self._tls is not None:
            try:
                ctx = self._tls()
            except Exception as e:
                self._count("tls_handshake")
                sock.close()
                self._say(
                    "tls-context",
                    f"TLS for {peer[0]}: {type(e).__name__}: {e}",
                )
                return
        conn = _Conn(sock, peer)
        with self._lock:
            self._conns.add(conn)
        self._evictable[conn] = None
        # RFC 9112 has no timeout; Go's ReadHeaderTimeout runs from the accept and covers the
        # TLS handshake and the first request head
        self._set_deadline(conn, now + self.limits.read_timeout)
        if ctx is not None:
            conn.ctx = ctx
            conn.state = _HANDSHAKE
            self._handshake(conn)
        else:
            self._set_events(conn, selectors.EVENT_READ)

    def _handshake(self, conn: _Conn) -> None:
        if conn.ctx is not None and not self._sniff(conn):
            return
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._set_events(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._set_events(conn, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as e:
            peer = conn.peer[0]
            self._say(
                "tls:" + peer,
                f"TLS handshake with {peer} failed: {e}",
            )
            self._close(conn, "tls_handshake")
            return
        conn.peer_cert = conn.sock.getpeercert() or None
        conn.state = _READ
        self._set_events(conn, selectors.EVENT_READ)
        # the client may have sent its request with its last handshake message
        self._read(conn)

    def _sniff(self, conn: _Conn) -> bool:
        """Before the TLS handshake: whether the client speaks TLS (then its socket is
        wrapped, True), or plain HTTP, answered as Go's net/http answers it (server.go: 400
        "Client sent an HTTP request to an HTTPS server."), rather than with a close that
        says nothing. A TLS client's first byte is a record type (handshake, 22: RFC 8446
        5.1) or, in an SSLv2-format hello, 0x80 or more; an upper-case letter is neither, so
        only then are bytes taken off the socket (at most 5, as Go reads one record header),
        and anything else is left whole to OpenSSL. The read_timeout from the accept covers
        this wait as it covers the handshake."""
        if not conn.buf:
            try:
                first = conn.sock.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                self._set_events(conn, selectors.EVENT_READ)
                return False
            except OSError:
                self._close(conn, "peer")
                return False
            if not first:
                self._close(conn, "peer")
                return False
            if not first.isupper():  # one byte: A to Z
                return self._wrap(conn)
        while len(conn.buf) < _PLAIN_HTTP_BYTES:
            try:
                data = conn.sock.recv(_PLAIN_HTTP_BYTES - len(conn.buf))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._close(conn, "peer")
                return False
            if not data:
                self._close(conn, "peer")
                return False
            conn.buf += data
        peer = conn.peer[0]
        if not _PLAIN_HTTP.fullmatch(conn.buf):
            self._say("tls:" + peer, f"TLS handshake with {peer} failed: not a TLS handshake")
            self._close(conn, "tls_handshake")
            return False
        if len(conn.buf) < _PLAIN_HTTP_BYTES:
            self._set_events(conn, selectors.EVENT_READ)  # "GE": wait for the rest
            return False
        self._say(
            "tls:" + peer,
            f"TLS handshake with {peer} failed: client sent an HTTP request to an HTTPS server",
        )
        conn.ctx = None
        conn.buf.clear()
        self._evictable.pop(conn, None)
        head, body = encode_response(
            400,
            [("Content-Type", "text/plain; charset=utf-8")],
            _PLAIN_HTTP_ANSWER,
            head=False,
            keep=False,
        )
        # answered in plain text, then the staged close: the rest of the request is unread
        self._start_write(conn, 400, head, body, False, "tls_handshake")
        return False

    def _wrap(self, conn: _Conn) -> bool:
        ctx, conn.ctx = conn.ctx, None
        # the selector knows the plain socket object; the SSL socket is another one
        self._set_events(conn, 0)
        try:
            conn.sock = ctx.wrap_socket(conn.sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as e:
            peer = conn.peer[0]
            self._say("tls:" + peer, f"TLS handshake with {peer} failed: {e}")
            self._close(conn, "tls_handshake")
            return False
        conn.tls = True
        return True

    # -- reading and parsing ---------------------------------------------------------------

    def _resume(self, conn: _Conn) -> None:
        """After a response: what was pipelined behind the request, then the socket."""
        if conn.buf and self._parse(conn):
            return
        self._read(conn)

    def _read(self, conn: _Conn) -> None:
        limit = self.limits.max_header_bytes + 1
        self._set_events(conn, selectors.EVENT_READ)
        while True:
            room = limit - len(conn.buf)
            if room <= 0:
                self._fail(conn, 431)
                return
            try:
                data = conn.sock.recv(min(room, 65536))
            except (BlockingIOError, ssl.SSLWantReadError):
                return
            except ssl.SSLWantWriteError:
                self._set_events(conn, selectors.EVENT_WRITE)
                return
            except InterruptedError:
                continue
            except OSError:
                self._close(conn, "peer")
                return
            if not data:
                self._close(conn, "peer")
                return
            if not conn.buf and conn.nreq:
                # a later request: its head has read_timeout from its first byte
                self._set_deadline(conn, time.monotonic() + self.limits.read_timeout)
            conn.buf += data
            # an SSL socket may hold decrypted bytes that select() does not see (pending()):
            # reading on until SSLWantReadError takes them
            if self._parse(conn):
                return

    def _parse(self, conn: _Conn) -> bool:
        """Parses what conn.buf holds; True once the connection stopped reading (a request
        is being answered, or it was refused)."""
        lim = self.limits
        buf = conn.buf
        while True:
            nl = buf.find(b"\n", conn.scan)
            if nl < 0:
                start, conn.scan = conn.scan, len(buf)
                if conn.line is None:
                    if len(buf) - conn.pos > lim.max_request_line:
                        return self._fail(conn, 414)
                    if len(buf) - conn.pos <= 64:
                        ok = _REQUEST_START.fullmatch(buf, conn.pos)
                    else:
                        ok = _LINE_BYTES.fullmatch(buf, start)
                    if not ok:
                        return self._fail(conn, 400)
                elif len(buf) > lim.max_header_bytes:
                    return self._fail(conn, 431)
                return False
            if nl + 1 > lim.max_header_bytes:
                return self._fail(conn, 431)
            line = bytes(buf[conn.pos : nl])
            conn.pos = conn.scan = nl + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if conn.line is None:
                if not line:
                    # RFC 9112 2.2: a server SHOULD ignore an empty line before the request
                    # line (bounded: every byte counts against max_header_bytes)
                    continue
                if len(line) > lim.max_request_line:
                    return self._fail(conn, 414)
                m = _REQUEST_LINE.fullmatch(line)
                if m is None:
                    return self._fail(conn, 400)
                if m.group(3) != b"1" or m.group(4) not in (b"0", b"1"):
                    return self._fail(conn, 505)  # RFC 9110 15.6.6
                conn.line = m.groups()
                conn.fields = []
                continue
            if not line:
                return self._complete(conn)
            if len(conn.fields) >= lim.max_headers:
                return self._fail(conn, 431)
            if line[:1] in (b" ", b"\t"):
                return self._fail(conn, 400)  # RFC 9112 5.2: obs-fold, rejected
            m = _FIELD.fullmatch(line)
            if m is None or _CTL.search(m.group(2)):
                return self._fail(conn, 400)
            conn.fields.append((m.group(1).decode("ascii").lower(), m.group(2).decode("latin-1")))

    def _complete(self, conn: _Conn) -> bool:
        method_b, target_b, _major, minor = conn.line
        fields = conn.fields
        end = conn.pos
        conn.line, conn.fields = None, []
        del conn.buf[:end]
        conn.pos = conn.scan = 0
        method = method_b.decode("ascii")
        version = "HTTP/1.1" if minor == b"1" else "HTTP/1.0"
        headers: dict[str, str] = {}
        for name, value in fields:
            if name in headers:
                if name in ("content-length", "host"):
                    # RFC 9112 6.3 (a repeated Content-Length is an unrecoverable framing
                    # error) and 3.2 (more than one Host: 400)
                    return self._fail(conn, 400, method == "HEAD")
                headers[name] += ", " + value
            else:
                headers[name] = value
        if version == "HTTP/1.1" and "host" not in headers:
            return self._fail(
                conn, 400, method == "HEAD"
            )  # RFC 9112 3.2, and Go's "missing required Host"
        length = headers.get("content-length")
        if length is not None and not _DIGITS.fullmatch(length):
            return self._fail(conn, 400, method == "HEAD")  # RFC 9110 8.6: Content-Length = 1*DIGIT
        target = target_b.decode("ascii")
        if target == "*":
            if method != "OPTIONS":
                return self._fail(
                    conn, 400, method == "HEAD"
                )  # RFC 9112 3.2.4: asterisk-form is OPTIONS'
            path, query = "*", ""
        elif target.startswith("/"):  # origin-form (RFC 9112 3.2.1)
            path, _, query = target.partition("#")[0].partition("?")
        elif target[:7].lower() == "http://" or target[:8].lower() == "https://":
            parts = urllib.parse.urlsplit(target)  # absolute-form (RFC 9112 3.2.2)
            path, query = parts.path or "/", parts.query
        else:
            return self._fail(
                conn, 400, method == "HEAD"
            )  # authority-form: CONNECT, not served here
        connection = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        if version == "HTTP/1.1":  # RFC 9112 9.3: persistent unless "close"
            keep = "close" not in connection
        else:  # RFC 9112 9.3 and C.2.2: HTTP/1.0 only with keep-alive
            keep = "keep-alive" in connection and "close" not in connection
        # a body is never read: the connection cannot be used after it (RFC 9112 9.6)
        has_body = "transfer-encoding" in headers or bool(length and length.strip("0"))
        conn.nreq += 1
        if has_body:
            keep = False
            conn.buf.clear()
        if conn.nreq >= self.limits.keepalive_requests:
            keep = False
        request = Request(
            method=method,
            path=urllib.parse.unquote(path),
            query=urllib.parse.parse_qs(query, keep_blank_values=True),
            version=version,
            headers=headers,
            peer=conn.peer,
            tls=conn.tls,
            peer_cert=conn.peer_cert,
        )
        self._evictable.pop(conn, None)
        self._set_events(conn, 0)
        self._set_deadline(conn, None)
        conn.state = _HANDLER
        if self._auth is None:
            return self._dispatch(conn, request, keep)
        try:
            verdict = self._auth(request)
        except Exception as e:
            verdict = e
        return self._authenticated(conn, request, keep, verdict, first=True)

    def _authenticated(
        self, conn: _Conn, request: Request, keep: bool, verdict, first: bool = False
    ) -> bool:
        """What the auth stage said of a request: None, to the handler; a Response, answered;
        a callable (first time only), to the auth thread if there is room; an exception, 500."""
        if verdict is None:
            return self._dispatch(conn, request, keep)
        head_only = request.method == "HEAD"
        if isinstance(verdict, Response):
            try:
                head, body = encode_response(
                    verdict.status, verdict.headers, verdict.body, head=head_only, keep=keep
                )
                status = verdict.status
            except ValueError as e:
                status, head, body = self._failed(request, e, keep)
        elif isinstance(verdict, BaseException) or not (first and callable(verdict)):
            status, head, body = self._failed(request, verdict, keep)
        else:
            with self._lock:
                room = self._auth_pending < self.limits.max_auth_pending
                if room:
                    self._auth_pending += 1
            if room:
                self._auth_pool.submit(lambda: self._check(conn, request, keep, verdict))
                return True
            status = 503
            head, body = encode_response(
                503,
                [("Content-Type", "text/plain; charset=utf-8"), ("Retry-After", "1")],
                b"too many credential checks waiting\n",
                head=head_only,
                keep=keep,
            )
        self._start_write(conn, status, head, body, keep, "done")
        return True

    def _check(self, conn: _Conn, request: Request, keep: bool, check) -> None:
        """In the auth thread: the slow check, handed back to the loop."""
        if self._stopping:
            return  # shutting down: every connection is being closed anyway
        try:
            verdict = check()
        except BaseException as e:
            verdict = e
        self._auth_results.append((conn, request, keep, verdict))
        self._wakeup()

    def _dispatch(self, conn: _Conn, request: Request, keep: bool) -> bool:
        """To the handler pool, or 503 at once when max_requests are being answered."""
        method = request.method
        with self._lock:
            if self._in_flight >= self.limits.max_requests:
                busy = True
            else:
                busy = False
                self._in_flight += 1
        if busy:
            head, body = encode_response(
                503,
                [("Content-Type", "text/plain; charset=utf-8")],
                b"too many requests in flight\n",
                head=method == "HEAD",
                keep=keep,
            )
            self._start_write(conn, 503, head, body, keep, "done")
            return True
        self._pool.submit(lambda: self._call(conn, request, keep))
        return True

    def _fail(self, conn: _Conn, status: int, head_only: bool | None = None) -> bool:
        """Answers a request that cannot be served, at once, and closes the connection."""
        if head_only is None:
            head_only = conn.line is not None and conn.line[0] == b"HEAD"
        text = {
            400: "bad request\n",
            414: "request line too long\n",
            431: "request header too large\n",
            505: "HTTP version not supported\n",
        }[status]
        head, body = encode_response(
            status,
            [("Content-Type", "text/plain; charset=utf-8")],
            text.encode(),
            head=head_only,
            keep=False,
        )
        conn.buf.clear()
        conn.line, conn.fields = None, []
        conn.pos = conn.scan = 0
        self._evictable.pop(conn, None)
        reason = "too_large" if status in (414, 431) else "bad_request"
        self._start_write(conn, status, head, body, False, reason)
        return True

    # -- the handler -----------------------------------------------------------------------

    def _call(self, conn: _Conn, request: Request, keep: bool) -> None:
        """In a pool thread: the handler's response, encoded, handed back to the loop."""
        status = 500
        try:
            response = self._handler(request)
            status = response.status
            head, body = encode_response(
                status, response.headers, response.body, head=request.method == "HEAD", keep=keep
            )
        except BaseException as e:
            status, head, body = self._failed(request, e, keep)
        self._results.append((conn, status, head, body, keep))
        self._wakeup()

    def _failed(self, request: Request, e, keep: bool) -> tuple[int, bytes, memoryview | None]:
        """A handler or the auth stage raised (or returned what it may not): a 500, said."""
        if isinstance(e, BaseException):
            tb = traceback.extract_tb(e.__traceback__)
            where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
            what = f"{type(e).__name__}: {e}{where}"
            key = type(e).__name__
        else:
            what = key = f"returned {type(e).__name__}"
        self._say(
            "handler:" + key, f"{request.method} {request.path} from {request.peer[0]}: {what}"
        )
        head, body = encode_response(
            500,
            [("Content-Type", "text/plain; charset=utf-8")],
            b"internal server error\n",
            head=request.method == "HEAD",
            keep=keep,
        )
        return 500, head, body

    def _collect(self) -> None:
        while self._results:
            conn, status, head, body, keep = self._results.popleft()
            with self._lock:
                self._in_flight -= 1
            if conn.sock is not None:
                self._guarded(self._start_write, conn, status, head, body, keep, "done")
        while self._auth_results:
            conn, request, keep, verdict = self._auth_results.popleft()
            with self._lock:
                self._auth_pending -= 1
            if conn.sock is not None:
                self._guarded(self._authenticated, conn, request, keep, verdict)

    # -- writing ---------------------------------------------------------------------------

    def _start_write(
        self, conn: _Conn, status: int, head: bytes, body, keep: bool, reason: str
    ) -> None:
        with self._lock:
            self._responses[status] = self._responses.get(status, 0) + 1
        conn.state = _WRITE
        conn.close_after = not keep
        conn.reason = reason
        conn.out.clear()
        conn.out.append(memoryview(head))
        if body is not None:
            conn.out.append(body)
        # Go's WriteTimeout: the whole response, however slowly the client reads
        self._set_deadline(conn, time.monotonic() + self.limits.write_timeout)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        out = conn.out
        while out:
            try:
                if conn.tls:
                    # the same chunk again after SSLWantWriteError, as OpenSSL requires
                    sent = conn.sock.send(out[0][:_TLS_CHUNK])
                else:
                    sent = conn.sock.sendmsg(list(itertools.islice(out, 2)))
            except (BlockingIOError, ssl.SSLWantWriteError):
                self._set_events(conn, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self._set_events(conn, selectors.EVENT_READ)
                return
            except InterruptedError:
                continue
            except OSError:
                self._close(conn, "peer")
                return
            while sent:
                first = out[0]
                if sent >= first.nbytes:
                    sent -= first.nbytes
                    out.popleft()
                else:
                    out[0] = first[sent:]
                    sent = 0
        if conn.close_after:
            self._start_linger(conn)
            return
        conn.state = _READ
        self._evictable[conn] = None
        now = time.monotonic()
        wait = self.limits.read_timeout if conn.buf else self.limits.idle_timeout
        self._set_deadline(conn, now + wait)
        self._set_events(conn, selectors.EVENT_READ)
        # pipelined bytes (or decrypted ones an SSL socket holds) are parsed next turn: a
        # chain of requests answered by the loop itself does not recurse
        self._ready.append(conn)

    def _start_linger(self, conn: _Conn) -> None:
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn, conn.reason)
            return
        conn.state = _LINGER
        conn.buf = bytearray()
        self._set_events(conn, selectors.EVENT_READ)
        self._set_deadline(conn, time.monotonic() + min(_LINGER_TIME, self.limits.read_timeout))
        # the first to go at the cap: it has had its answer
        self._evictable[conn] = None
        self._evictable.move_to_end(conn, last=False)
        self._linger(conn)

    def _linger(self, conn: _Conn) -> None:
        """Discards input until the client closes (or the linger deadline)."""
        for _ in range(16):
            try:
                data = conn.sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except InterruptedError:
                continue
            except OSError:
                break
            if not data:
                break
        else:
            return
        self._close(conn, conn.reason)
