"""librdmacm's rping protocol (rdma-core librdmacm/examples/rping.c), both sides, over rdma_cm.

One rping iteration, which is one ibtool ping:

    client: SEND advertisement of its source buffer   -> server: RDMA READ of it
    server: SEND go-ahead                              -> client: SEND advertisement of its sink
    server: RDMA WRITE of what it read into the sink   -> server: SEND go-ahead

An advertisement is struct rping_rdma_info: be64 buf, be32 rkey, be32 size (16 bytes); a
go-ahead is the server's 16-byte send buffer, which rping never fills (zeros). The client's
payload is "rdma-ping-N: " and a rolling run of ASCII letters, NUL-terminated (rping_test_client);
`rping -V` compares the whole sink with the source after each iteration.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

from ibtool.errors import IbtoolError
from ibtool.model.deferred import dataclass
from ibtool.rdma import cm, wire
from ibtool.rdma.ladder import (
    ACCESS_LOCAL_WRITE,
    ACCESS_REMOTE_READ,
    ACCESS_REMOTE_WRITE,
    PathSpec,
)
from ibtool.rdma.ping.cmping import Gate
from ibtool.rdma.ping.options import ServeOptions
from ibtool.rdma.ping.serial import serve_clients

DEFAULT_PORT = 7174  # rping.c: cb->port = htobe16(7174)
DEFAULT_SIZE = 64  # rping.c: cb->size = 64
ADVERT = struct.Struct(">QII")  # struct rping_rdma_info
# rping.c: RPING_MIN_BUFSIZE, sizeof(stringify(INT_MAX)) + sizeof(RPING_MSG_FMT) = 11 + 15;
# RPING_BUFSIZE - 1 is the largest -S it takes.
MIN_SIZE, MAX_SIZE = 26, 64 * 1024 - 1
SQ_DEPTH, RQ_DEPTH = 16, 2  # rping.c: RPING_SQ_DEPTH, max_recv_wr
STEP_TIMEOUT = 30.0  # server: an RDMA READ or WRITE, or the sink advertisement after the read
BUFFER_ACCESS = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_WRITE
SERVER_MEMORY = MAX_SIZE + 2 * ADVERT.size  # what the server registers for a client
Log = Callable[[str], None]


class RpingProtocolError(wire.ProtocolError):
    """The peer sent what no rping sends."""


@dataclass(frozen=True)
class Advert:
    """struct rping_rdma_info: where the peer's buffer is and how many bytes to move."""

    addr: int
    rkey: int
    size: int


def encode(advert: Advert) -> bytes:
    return ADVERT.pack(advert.addr, advert.rkey, advert.size)


def decode(data: bytes, byte_len: int, limit: int, what: str) -> Advert:
    """The advertisement in a received message of `byte_len` bytes; `limit` bounds its size
    (the buffer it is read into or written from)."""
    if byte_len != ADVERT.size:
        # rping.c, server_recv and client_recv: "Received bogus data, size %d"
        raise RpingProtocolError(
            f"{what}: {byte_len}-byte message, an rping advertisement has {ADVERT.size}",
            "is the peer an rping (librdmacm's rping, or ibtool ping --compat rping)?",
        )
    advert = Advert(*ADVERT.unpack(data[: ADVERT.size]))
    if not 1 <= advert.size <= limit:
        raise RpingProtocolError(
            f"{what}: a {advert.size}-byte buffer advertised, expected 1..{limit}",
            f"rping pings are {MIN_SIZE}..{MAX_SIZE} bytes (rping -S); is the peer an rping?",
        )
    return advert


def payload(index: int, size: int) -> bytes:
    """What rping's client puts in its source buffer for iteration `index` (from 0)."""
    head = f"rdma-ping-{index}: ".encode()[: size - 1]
    first = 65 + index % 58  # rping_test_client: 'A'..'z', one further each iteration
    run = bytes(65 + (first - 65 + i) % 58 for i in range(size - 1 - len(head)))
    return head + run + b"\0"


# -- client ------------------------------------------------------------------------------------


class Client:
    """An rping client for client.run_client: connect(), ping(seq), close()."""

    hw_us = None  # rping's round trips are timed on the host's clock only

    def __init__(self, host: str, port: int, size: int, timeout: float):
        self.host, self.port, self.size, self.timeout = host, port, size, timeout
        self.server = cm.peer_name(host, port)
        self.session: cm.Connection | None = None
        self.device = "?"
        self.used: PathSpec | None = None  # the connection's path, as rdma_cm chose it
        self.connect()  # up front: a server not there is one error, not a loss per ping

    def connect(self) -> None:
        self.close()
        conn = cm.dial(self.host, self.port, SQ_DEPTH, RQ_DEPTH)
        try:
            self.source = conn.mr(self.size, BUFFER_ACCESS)
            self.sink = conn.mr(self.size, BUFFER_ACCESS)
            self.go_ahead = conn.mr(ADVERT.size, ACCESS_LOCAL_WRITE)
            # The two advertisements never change: registered and written once, sent as is.
            self.source_ad = conn.mr(ADVERT.size, 0)
            self.source_ad.write(encode(Advert(self.source.buf, self.source.rkey, self.size)), 16)
            self.sink_ad = conn.mr(ADVERT.size, 0)
            self.sink_ad.write(encode(Advert(self.sink.buf, self.sink.rkey, self.size)), 16)
            conn.post_recv(self.go_ahead, ADVERT.size)
            cm.connect_to(conn, self.host, self.port)
            self.device, self.used = conn.device, conn.path_used()
        except BaseException:
            conn.close()
            raise
        self.session = conn

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def ping(self, seq: int) -> float:
        """One rping iteration; its round trip in microseconds, from the post of the first
        advertisement to the second go-ahead."""
        s, size = self.session, self.size
        data = payload(seq - 1, size)
        self.source.write(data, size)
        self.sink.write(bytes(size), size)  # a reply must fill it again
        clock = time.perf_counter
        t0 = clock()
        deadline = time.monotonic() + self.timeout
        try:
            s.post_send(self.source_ad, ADVERT.size)
            self._go_ahead(s, deadline, f"ping {seq}: the server's go-ahead after its read")
            s.post_send(self.sink_ad, ADVERT.size)
            self._go_ahead(s, deadline, f"ping {seq}: the server's go-ahead after its write")
        except cm.Disconnected:
            hint = "a stock `rping -s` serves one client, then exits"
            if size > DEFAULT_SIZE:
                # rping.c reads the ping into its own -S buffer: a larger one fails the RDMA
                # READ there (LOC_PROT_ERR) and it disconnects.
                hint += f"; it also gives up on a ping larger than its -S: give it -S {size}"
            raise cm.Disconnected(f"the rping server at {self.server} disconnected", hint) from None
        t1 = clock()
        if self.sink.read(size, 0) != data:
            # rping.c, rping_test_client with -V: "data mismatch!"
            raise IbtoolError(f"reply {seq}: the data written back differs from the ping")
        return (t1 - t0) * 1e6

    def _go_ahead(self, s: cm.Connection, deadline: float, what: str) -> None:
        wc = s.wait(cm.IBV_WC_RECV, deadline, what)
        if wc.byte_len != ADVERT.size:
            raise RpingProtocolError(
                f"{what}: {wc.byte_len}-byte message, rping's go-ahead has {ADVERT.size}",
                f"is what listens at {self.server} an rping server?",
            )
        s.post_recv(self.go_ahead, ADVERT.size)


# -- server ------------------------------------------------------------------------------------


def serve(options: ServeOptions) -> None:
    """Serve rping clients one after another until interrupted (or `options.max_clients` were
    served), as `rping -s -a ADDR -p PORT` does for one; a client that sends no ping for
    `options.idle` seconds (--idle-timeout; None: no bound) is dropped, so that one idle
    client cannot hold the server. Each request passes `options.limits` first (cmping.Gate),
    before its QP is built. rdma_cm picks the device and the path: the options that would
    choose them are refused."""
    options.refuse("rping's server", "device", "device_port", "gid_index", "path", "pkey")
    log, idle = options.log, options.idle
    with cm.Listener(options.bind, options.listen_port) as listener:
        gate = Gate(listener, options.limits, log, lambda conn: SERVER_MEMORY)
        log(f"listening on {listener.where} (rdma_cm, rping), {listener.device}")
        serve_clients(
            lambda: listener.next_request(SQ_DEPTH, RQ_DEPTH, gate.admit, gate.tick),
            options.max_clients,
            log,
            lambda conn, who: _serve_client(listener, conn, log, who, idle),
        )


def _serve_client(
    listener: cm.Listener, conn: cm.Connection, log: Log, who: str, idle: float | None = None
) -> int:
    conn.busy = wire.encode_cm(wire.CmMessage.REFUSE, f"busy: serving {who}, one at a time")
    buf = conn.mr(MAX_SIZE, BUFFER_ACCESS)  # rping's rdma_buf, here as large as any -S
    recv = conn.mr(ADVERT.size, ACCESS_LOCAL_WRITE)
    go_ahead = conn.mr(ADVERT.size, 0)  # zeros, as rping's never-filled send_buf
    conn.post_recv(recv, ADVERT.size)
    listener.accept(conn)
    log(f"{who} connected on {conn.device}")
    answered = 0
    while True:
        quiet = None if idle is None else time.monotonic() + idle
        try:
            source = _advert(conn, recv, quiet, MAX_SIZE, "the ping's advertisement")
        except cm.Disconnected:
            return answered  # the client's way to say it is done
        except cm.CompletionTimeout:  # cm.wait's, from completions.py
            raise IbtoolError(f"sent nothing for {idle:g} s (--idle-timeout)") from None
        deadline = time.monotonic() + STEP_TIMEOUT
        conn.post_read(buf, source.size, source.addr, source.rkey)
        conn.wait(cm.IBV_WC_RDMA_READ, deadline, "the RDMA READ of the client's buffer")
        conn.post_send(go_ahead, ADVERT.size)
        sink = _advert(conn, recv, deadline, MAX_SIZE, "the sink's advertisement")
        if sink.size < source.size:
            raise RpingProtocolError(
                f"the sink holds {sink.size} bytes, the ping {source.size}",
                "is the peer an rping?",
            )
        # rping.c writes strlen(data) + 1 bytes back: the whole ping for rping's own payload,
        # NUL-terminated at its last byte. Here: exactly the bytes read.
        conn.post_write(buf, source.size, sink.addr, sink.rkey)
        conn.wait(cm.IBV_WC_RDMA_WRITE, deadline, "the RDMA WRITE into the client's sink")
        conn.post_send(go_ahead, ADVERT.size)
        answered += 1


def _advert(conn: cm.Connection, recv, deadline: float | None, limit: int, what: str) -> Advert:
    wc = conn.wait(cm.IBV_WC_RECV, deadline, what)
    advert = decode(recv.read(ADVERT.size, 0), wc.byte_len, limit, what)
    conn.post_recv(recv, ADVERT.size)
    return advert
