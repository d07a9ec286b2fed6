"""Who a ping server lets in, and how much of it each client may hold: plain bookkeeping, no
sockets, no verbs, every time read from an injected clock (the unit tests give a fake one).

`ibtool ping --server` runs for months on every node, reachable from the cluster network. What
is bounded here, each by a server option (ibtool-ping(8), LIMITS):

- who: `--allow CIDR` (repeatable; empty: everyone). An IPv4-mapped IPv6 peer (::ffff:a.b.c.d,
  what a dual-stack listener reports for an IPv4 client) is matched as the IPv4 address;
- how often: new connections per source address, a token bucket of `--max-rate` tokens a
  second and a burst of BURST_SECONDS times that, as OpenSSH's PerSourceMaxStartups and
  PerSourcePenalties (sshd_config(5)) bound what one address may start;
- how many at once: admitted connections (handshakes and sessions) per source
  (`--max-per-source`), sessions in total (`--max-sessions`);
- how much memory: bytes registered per client (at most MAX_PING_SIZE, session.py) and in total
  (`--max-memory`), reserved BEFORE the memory region is registered, and released after it
  was deregistered;
- how often one client may rebuild its QP: one QP per client at a time, and its reconnect
  requests through a token bucket of their own (RECONNECT_RATE a second, RECONNECT_BURST).

The rdma_cm servers (cmping.py, rping.py) ask the same of each connection request, by the
address the kernel tells (cm.request_source); where nobody can tell it (unknown()), a request
is refused under --allow, as nothing can be matched, and held to the total limits only
without it.

A refusal is logged once per source and reason per INTERVAL (60 s); the repeats are counted
and said in one line when the interval is over ("refused 10.0.0.5: 37 more connections over
--max-per-source 4 in the last 60 s"): a flood costs two lines a minute, never one per
connection. The tables are bounded: full buckets and quiet log entries are forgotten, and past
MAX_TRACKED sources the buckets are reset (a flood from more addresses than that gets, for one
instant, a fresh burst each, no more).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable
from dataclasses import field

from ibtool.argtypes import SIZE_UNITS
from ibtool.model.deferred import dataclass

Clock = Callable[[], float]
Log = Callable[[str], None]
Network = "ipaddress.IPv4Network | ipaddress.IPv6Network"

INTERVAL = 60.0  # seconds a refusal's repeats are counted before their line
BURST_SECONDS = 2.0  # a source's burst of new connections: this many seconds of --max-rate
RECONNECT_RATE = 1.0  # QP rebuilds a second a client may ask for, sustained
RECONNECT_BURST = 5
MAX_TRACKED = 4096  # sources whose buckets and log entries are kept


@dataclass(frozen=True)
class Limits:
    """The server's limits; the defaults never bind on a healthy cluster."""

    max_sessions: int = 16
    max_per_source: int = 4
    idle_timeout: float = 120.0
    max_rate: float = 10.0
    max_memory: int = 64 << 20
    allow: tuple = ()  # ipaddress networks; empty: everyone
    per_client_memory: int = 1 << 20  # ping.MAX_PING_SIZE, filled in by the server

    @property
    def burst(self) -> float:
        return max(1.0, self.max_rate * BURST_SECONDS)


def parse_network(text: str):
    """A CIDR (or one address) of --allow; ValueError names what is wrong. Host bits set are
    accepted (10.1.2.3/16 is 10.1.0.0/16), as ip(8) does."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(f"not an IPv4 or IPv6 address or CIDR: {text!r}") from None


def show_size(n: int) -> str:
    for unit in ("G", "M", "K"):
        if n and n % SIZE_UNITS[unit] == 0:
            return f"{n // SIZE_UNITS[unit]}{unit}"
    return str(n)


def source_of(host: str):
    """The source address of a peer as accept() or getpeername() gives it; an IPv4-mapped
    IPv6 address as its IPv4 address, a scope (%eth0) dropped."""
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class TokenBucket:
    """`rate` tokens a second, at most `burst` kept; take() spends one if there is one."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float, now: float):
        self.rate, self.burst, self.tokens, self.stamp = rate, burst, burst, now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = max(self.stamp, now)

    def take(self, now: float) -> bool:
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def wait(self, now: float) -> float:
        """Seconds until a token is there (0: one is)."""
        self._refill(now)
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def full(self, now: float) -> bool:
        self._refill(now)
        return self.tokens >= self.burst


class RefusalLog:
    """Lines about a source, at most one per (source, reason) and INTERVAL: the first said at
    once, the repeats counted and said in one line when the interval is over (flush(), or
    the next one after it). Thread-safe."""

    def __init__(self, log: Log, clock: Clock = time.monotonic, interval: float | None = None):
        self.log, self.clock, self.interval = log, clock, interval or INTERVAL
        self._open: dict[tuple, list] = {}  # key -> [window start, repeats, repeat line]
        self._lock = threading.Lock()

    def note(self, key: tuple, first: str, repeats: Callable[[int], str]) -> None:
        """`first` is the line of the first occurrence; `repeats(n)` the line of n more."""
        now = self.clock()
        lines = []
        with self._lock:
            entry = self._open.get(key)
            if entry is not None and now - entry[0] >= self.interval:
                if entry[1]:
                    lines.append(entry[2](entry[1]))
                entry = None
            if entry is None:
                self._open[key] = [now, 0, repeats]
                lines.append(first)
                self._bound(now)
            else:
                entry[1] += 1
                entry[2] = repeats
        for line in lines:
            self.log(line)

    def flush(self) -> None:
        """Say the repeats of each interval that is over; forget the keys that had none."""
        now = self.clock()
        lines = []
        with self._lock:
            for key, entry in list(self._open.items()):
                if now - entry[0] < self.interval:
                    continue
                if entry[1]:
                    lines.append(entry[2](entry[1]))
                    self._open[key] = [now, 0, entry[2]]  # a persistent flood: a line a minute
                else:
                    del self._open[key]
        for line in lines:
            self.log(line)

    def _bound(self, now: float) -> None:
        if len(self._open) > MAX_TRACKED:
            for key, entry in list(self._open.items()):
                if not entry[1]:
                    del self._open[key]

    def refused(self, source, reason: str) -> None:
        """A refused connection: "refused SRC: connection REASON", then "refused SRC: N more
        connections REASON in the last 60 s"."""
        self.note(
            (str(source), reason),
            f"refused {source}: connection {reason}",
            lambda n: (
                f"refused {source}: {n} more connection{'s' if n > 1 else ''} {reason} "
                f"in the last {self.interval:g} s"
            ),
        )


# Every `tell` starts "refused: "; the client reads it as wire.PeerError's "peer says: ...".
REFUSED = "peer says: refused: "


class Refused(Exception):
    """A connection or a request turned down; `reason` completes "connection ...", `tell` is
    what the client may be told (None: its connection is closed at once)."""

    def __init__(self, reason: str, tell: str | None):
        super().__init__(reason)
        self.reason, self.tell = reason, tell


@dataclass(eq=False)
class Ticket:
    """One admitted connection: its source, whether it holds a session, its memory, and the
    bucket of its QP rebuilds."""

    source: object
    session: bool = False
    memory: int = 0
    rebuilds: TokenBucket | None = field(default=None, repr=False)


class Admission:
    """The server's bookkeeping, shared by the acceptor and the session threads (a lock)."""

    def __init__(self, limits: Limits, log: Log, clock: Clock = time.monotonic):
        self.limits, self.clock = limits, clock
        self.refusals = RefusalLog(log, clock)
        self._lock = threading.Lock()
        self._buckets: dict[object, TokenBucket] = {}
        self._per_source: dict[object, int] = {}
        self.sessions = 0
        self.memory = 0

    # -- connections --

    def allowed(self, source) -> bool:
        allow = self.limits.allow
        return not allow or any(source.version == n.version and source in n for n in allow)

    def connection(self, host: str) -> Ticket:
        """Admit a new connection from `host` (an address as accept() gives it), or raise
        Refused (logged)."""
        source = source_of(host)
        try:
            with self._lock:
                return self._connection(source)
        except Refused as e:
            self.refusals.refused(source, e.reason)
            raise

    def _connection(self, source) -> Ticket:
        lim = self.limits
        if not self.allowed(source):
            raise Refused("not in --allow", None)
        now = self.clock()
        bucket = self._buckets.get(source)
        if bucket is None:
            self._prune(now)
            bucket = self._buckets[source] = TokenBucket(lim.max_rate, lim.burst, now)
        if not bucket.take(now):
            raise Refused(f"over --max-rate {lim.max_rate:g}/s", None)
        held = self._per_source.get(source, 0)
        if held >= lim.max_per_source:
            raise Refused(
                f"over --max-per-source {lim.max_per_source}",
                f"refused: {held} connection{'s' if held > 1 else ''} from {source} already, "
                f"the most --max-per-source {lim.max_per_source} allows",
            )
        if self.sessions >= lim.max_sessions:
            raise self._full()
        self._per_source[source] = held + 1
        return Ticket(source)

    def unknown(self, why: str) -> Ticket:
        """Admit a connection whose source address cannot be told (`why`), or raise Refused
        (logged): under --allow always, as nothing can be matched against it; without, over
        --max-sessions only (its memory is reserved as any other's)."""
        with self._lock:
            if self.limits.allow:
                refused = Refused(
                    "--allow cannot be matched",
                    "refused: this server takes only the networks of its --allow, and cannot "
                    "tell this client's address",
                )
            elif self.sessions >= self.limits.max_sessions:
                refused = self._full()
            else:
                refused = None
        if refused is None:
            self.refusals.note(
                ("?", "unknown"),
                f"a connection from an unknown address ({why}): only --max-sessions and "
                "--max-memory apply to it",
                lambda n: (
                    f"{n} more connection{'s' if n > 1 else ''} from unknown addresses in the "
                    f"last {self.refusals.interval:g} s"
                ),
            )
            return Ticket(None)
        self.refused(None, refused.reason, why)
        raise refused

    def refused(self, source, reason: str, why: str = "") -> None:
        """Log a refused connection of `source` (None: an address nobody could tell, `why`),
        once a source, reason and interval (RefusalLog)."""
        if source is not None:
            self.refusals.refused(source, reason)
            return
        self.refusals.note(
            ("?", reason),
            f"refused a connection from an unknown address: {reason}"
            + (f" ({why})" if why else ""),
            lambda n: (
                f"refused {n} more connection{'s' if n > 1 else ''} from unknown addresses "
                f"in the last {self.refusals.interval:g} s ({reason})"
            ),
        )

    def _full(self) -> Refused:
        n = self.limits.max_sessions
        return Refused(
            f"over --max-sessions {n}",
            f"refused: {n} clients served, the most --max-sessions allows",
        )

    def _prune(self, now: float) -> None:
        if len(self._buckets) < MAX_TRACKED:
            return
        for source, bucket in list(self._buckets.items()):
            if bucket.full(now) and source not in self._per_source:
                del self._buckets[source]
        if len(self._buckets) >= MAX_TRACKED:
            self._buckets.clear()

    def session(self, ticket: Ticket) -> None:
        """The handshake is done: the connection becomes a session, or Refused (logged) when
        --max-sessions are served."""
        refused = None
        with self._lock:
            if not ticket.session:
                if self.sessions >= self.limits.max_sessions:
                    refused = self._full()
                else:
                    ticket.session = True
                    self.sessions += 1
                    ticket.rebuilds = TokenBucket(RECONNECT_RATE, RECONNECT_BURST, self.clock())
        if refused is not None:
            self.refused(ticket.source, refused.reason)
            raise refused

    def release(self, ticket: Ticket) -> None:
        """The connection ended: its slot and its memory are free (once, however often)."""
        with self._lock:
            self.memory -= ticket.memory
            ticket.memory = 0
            if ticket.session:
                ticket.session = False
                self.sessions -= 1
            if ticket.source is not None:
                held = self._per_source.pop(ticket.source, 0) - 1
                if held > 0:
                    self._per_source[ticket.source] = held
            ticket.source = None  # released: a second call finds nothing to give back

    def held(self, source) -> int:
        with self._lock:
            return self._per_source.get(source_of(str(source)), 0)

    # -- memory and QPs --

    def reserve(self, ticket: Ticket, nbytes: int) -> None:
        """Reserve `nbytes` of registered memory for the client's (one) session, in place of
        what it held; Refused (logged) over the per-client or the total cap."""
        lim = self.limits
        with self._lock:
            if nbytes > lim.per_client_memory:
                refused = Refused(
                    f"over the {show_size(lim.per_client_memory)} a client may register",
                    f"refused: {nbytes} bytes to register, a client may have "
                    f"{lim.per_client_memory}",
                )
            elif self.memory - ticket.memory + nbytes > lim.max_memory:
                refused = Refused(
                    f"over --max-memory {show_size(lim.max_memory)}",
                    f"refused: {nbytes} bytes to register would pass --max-memory "
                    f"{show_size(lim.max_memory)} ({self.memory - ticket.memory} in use)",
                )
            else:
                self.memory += nbytes - ticket.memory
                ticket.memory = nbytes
                return
        self.refused(ticket.source, refused.reason)
        raise refused

    def free(self, ticket: Ticket) -> None:
        """The client's memory region was deregistered."""
        with self._lock:
            self.memory -= ticket.memory
            ticket.memory = 0

    def rebuild_wait(self, ticket: Ticket) -> float:
        """Seconds the client's next QP must wait (0: now); the wait is spent by the caller."""
        with self._lock:
            bucket = ticket.rebuilds
            if bucket is None:
                return 0.0
            now = self.clock()
            wait = bucket.wait(now)
            if wait == 0.0:
                bucket.take(now)
            else:  # spent now for then: the next caller waits behind it
                bucket.tokens -= 1.0
            return wait
