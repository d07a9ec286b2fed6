"""ibtool.web.server against hostile clients: every limit is crossed and seen to hold.

Timeouts are small (a fraction of a second) so the file runs fast; nothing sleeps to wait for
the server: a test polls a condition with a deadline, or blocks on a socket with a timeout.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ibtool.web.server import HTTPServer, Limits, Request, Response

REPO = Path(__file__).resolve().parents[2]


def wait_for(cond, timeout: float = 5.0, what: str = "condition"):
    end = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def echo(request: Request) -> Response:
    body = json.dumps(
        {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "version": request.version,
            "headers": request.headers,
            "peer": request.peer[0],
            "tls": request.tls,
            "cert": request.peer_cert is not None,
        }
    ).encode()
    return Response(200, [("Content-Type", "application/json")], body)


class Client:
    """A raw socket and what it has read but not consumed (for pipelined responses)."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0, sock=None):
        self.sock = sock or socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.buf = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def get(self, path: str = "/", extra: str = "", version: str = "HTTP/1.1") -> None:
        self.send(f"GET {path} {version}\r\nHost: x\r\n{extra}\r\n".encode())

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def response(self, head_only: bool = False):
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise EOFError(f"closed after {self.buf!r}")
        head, rest = self.buf.split(b"\r\n\r\n", 1)
        self.buf = bytearray(rest)
        lines = head.decode("latin-1").split("\r\n")
        _version, status, _reason = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        length = 0 if head_only else int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            if not self._fill():
                raise EOFError("closed in the body")
        body = bytes(self.buf[:length])
        del self.buf[:length]
        return int(status), headers, body

    def closed(self, reset_ok: bool = True) -> bool:
        """Blocks until the server closes (True) or the socket's timeout (False)."""
        try:
            while self._fill():
                pass
        except ConnectionResetError:
            if not reset_ok:
                raise
            return True
        except socket.timeout:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve():
    servers = []

    def start(handler=echo, tls=None, log=None, address=("127.0.0.1", 0), auth=None, **limits):
        lines = [] if log is None else log
        kwargs = {"auth": auth} if auth is not None else {}
        server = HTTPServer(address, handler, Limits(**limits), tls=tls, log=lines.append, **kwargs)
        _host, port = server.bind()
        server.start()
        servers.append(server)
        server.lines = lines
        return server, port

    yield start
    for server in servers:
        server.shutdown()


# -- HTTP/1.1 as it should work ----------------------------------------------------------------


def test_get_head_and_keepalive(serve):
    server, port = serve()
    c = Client(port)
    c.get("/metrics?name=a&name=b&empty=")
    status, headers, body = c.response()
    assert status == 200
    assert headers["connection"] == "keep-alive"
    assert headers["content-length"] == str(len(body))
    assert headers["date"].endswith(" GMT")
    assert headers["content-type"] == "application/json"
    seen = json.loads(body)
    assert seen["path"] == "/metrics"
    assert seen["query"] == {"name": ["a", "b"], "empty": [""]}
    assert seen["version"] == "HTTP/1.1"
    assert seen["headers"] == {"host": "x"}
    assert seen["peer"] == "127.0.0.1"
    # HEAD: the GET's Content-Length and no body; the next response on the same connection
    # follows at once, which it would not if a body had been sent
    c.send(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, _ = c.response(head_only=True)
    assert status == 200 and int(headers["content-length"]) > 0
    c.get("/again")
    status, _headers, body = c.response()
    assert status == 200 and json.loads(body)["path"] == "/again"
    assert server.stats()["accepted"] == 1
    assert server.stats()["responses"] == {200: 3}


def test_connection_close_and_http10(serve):
    server, port = serve()
    c = Client(port)
    c.get("/", "Connection: close\r\n")
    status, headers, _ = c.response()
    assert status == 200 and headers["connection"] == "close"
    assert c.closed()
    # HTTP/1.0: closed unless keep-alive is asked for
    c = Client(port)
    c.send(b"GET / HTTP/1.0\r\n\r\n")
    status, headers, body = c.response()
    assert headers["connection"] == "close" and json.loads(body)["version"] == "HTTP/1.0"
    assert c.closed()
    c = Client(port)
    for _ in range(2):
        c.send(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
        status, headers, _ = c.response()
        assert status == 200 and headers["connection"] == "keep-alive"
    wait_for(lambda: server.stats()["closed"]["done"] == 2, what="two closes")


def test_keepalive_requests_then_close(serve):
    _server, port = serve(keepalive_requests=3)
    c = Client(port)
    said = []
    for _ in range(3):
        c.get()
        said.append(c.response()[1]["connection"])
    assert said == ["keep-alive", "keep-alive", "close"]
    assert c.closed()


def test_pipelined_requests_in_one_send(serve):
    _server, port = serve()
    c = Client(port)
    c.send(b"GET /one HTTP/1.1\r\nHost: x\r\n\r\nGET /two HTTP/1.1\r\nHost: x\r\n\r\n")
    assert json.loads(c.response()[2])["path"] == "/one"
    assert json.loads(c.response()[2])["path"] == "/two"


def test_request_targets(serve):
    _server, port = serve()
    c = Client(port)
    c.send(b"GET http://example.com:9877/a%20b?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n")
    seen = json.loads(c.response()[2])
    assert seen["path"] == "/a b" and seen["query"] == {"x": ["1"]}
    c.send(b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")
    assert json.loads(c.response()[2])["path"] == "*"
    # repeated fields joined, names lower-cased, OWS around the value dropped
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1 \r\nx-a:\t2\r\n\r\n")
    assert json.loads(c.response()[2])["headers"]["x-a"] == "1, 2"


def test_body_on_get_is_answered_then_closed(serve):
    server, port = serve()
    c = Client(port)
    c.send(b"GET /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n")
    status, headers, body = c.response()
    assert status == 200 and json.loads(body)["path"] == "/b"
    assert headers["connection"] == "close"
    assert c.closed()
    c = Client(port)
    c.send(
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    )
    assert c.response()[1]["connection"] == "close"
    assert c.closed()
    assert server.stats()["responses"] == {200: 2}


def answer_while_sending(port: int, head: bytes, size: int):
    """The response to a request whose sender is still sending `size` bytes after `head`."""
    c = Client(port)
    failed = []

    def send():
        try:
            c.sock.sendall(head + b"a" * size)
        except OSError as e:
            failed.append(e)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        # a FIN after the response, not a reset
        return c.response(), c.closed(reset_ok=False)
    finally:
        sender.join()
        # the server read (and dropped) what came after: not reset under the sender's feet
        assert not failed


def test_answer_survives_a_client_still_sending(serve):
    """Closing with unread input makes the kernel reset the connection, which can destroy
    the response before the client reads it: the server half-closes, and reads on a while."""
    server, port = serve(max_request_line=1024)
    (status, headers, _), closed = answer_while_sending(port, b"GET /", 1 << 20)
    assert status == 414 and closed
    head = b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (1 << 20)
    (status, headers, body), closed = answer_while_sending(port, head, 1 << 20)
    assert status == 200 and json.loads(body)["method"] == "POST"
    assert headers["connection"] == "close" and closed


def test_every_address_is_dual_stack(serve):
    server, port = serve(address=("", 0))
    c = Client(port, "127.0.0.1")
    c.get()
    # an IPv4 client of the IPv6 socket is shown as IPv4, not ::ffff:127.0.0.1
    assert json.loads(c.response()[2])["peer"] == "127.0.0.1"
    if socket.has_ipv6:
        try:
            c6 = Client(port, "::1")
        except OSError:
            return
        c6.get()
        assert json.loads(c6.response()[2])["peer"] == "::1"


# -- what is refused, and at once ----------------------------------------------------------------


def answered_at_once(port: int, data: bytes, status: int, within: float) -> Client:
    c = Client(port, timeout=within)
    start = time.monotonic()
    c.send(data)
    got, headers, _body = c.response()
    assert got == status, data
    assert headers["connection"] == "close"
    assert time.monotonic() - start < within
    assert c.closed()
    return c


def client_hello() -> bytes:
    """The first flight of a real TLS client, as a scanner or a misconfigured scrape sends."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_http09_garbage_and_tls_on_plaintext_are_refused_at_once(serve):
    # read_timeout is long: an answer within a fraction of it is not the timeout
    server, port = serve(read_timeout=5.0)
    cases = [
        (b"GET /metrics\r\n", 400),  # HTTP/0.9: no version, never answered by http.server
        (b"\x00\x01\x02\xffgarbage", 400),
        (client_hello(), 400),
        (b"GET /\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET  / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1 extra\r\n\r\n", 400),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
        (b"GET / HTTP/3.0\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # no Host (RFC 9112 3.2)
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: 1\r\n  folded\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX : 1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX(y): 1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n", 400),
        (b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ]
    for data, status in cases:
        try:
            answered_at_once(port, data, status, within=1.0)
        except (OSError, EOFError) as e:
            raise AssertionError(data) from e
    stats = server.stats()
    assert stats["responses"] == {400: 17, 505: 2}
    wait_for(lambda: server.stats()["closed"]["bad_request"] == len(cases), what="closes")
    assert server.stats()["closed"]["read_timeout"] == 0


def test_refused_head_request_gets_no_body(serve):
    _server, port = serve()
    for data in (b"HEAD / HTTP/1.1\r\n\r\n", b"HEAD / HTTP/1.1\r\nHost: x\r\nX : 1\r\n\r\n"):
        c = Client(port)
        c.send(data)
        status, headers, _ = c.response(head_only=True)
        assert status == 400 and int(headers["content-length"]) > 0
        assert c.closed() and c.buf == b""


HEADISH = st.lists(
    st.sampled_from(
        [b"GET", b"HEAD", b" ", b"/", b"?a=1", b"%zz", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0",
         b"\r\n", b"\n", b"\r", b"Host: x", b":", b"Content-Length: 3", b"Connection: close",
         b"Transfer-Encoding: chunked", b"\t", b"\x00", b"\xff", b"*", b"http://h/p"]
    )
).map(b"".join)  # fmt: skip


REQUESTISH = st.builds(
    lambda method, target, version, fields, end: (
        method + b" " + target + b" " + version + end + b"".join(f + end for f in fields) + end
    ),
    st.sampled_from([b"GET", b"HEAD", b"OPTIONS", b"POST", b"G\xffT", b""]),
    st.sampled_from([b"/", b"/?a=1&b", b"/%zz%C3%A9", b"*", b"http://h/p?q", b"h:1", b"/\x00"]),
    st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 ", b"http/1.1"]),
    st.lists(
        st.sampled_from(
            [b"Host: x", b"Host: y", b"Content-Length: 3", b"Content-Length: x",
             b"Connection: close", b"Connection: keep-alive", b"Transfer-Encoding: chunked",
             b" folded", b"Bad Name: 1", b"X: \x7f", b"X:", b"X: \xe9"]
        ),
        max_size=5,
    ),
    st.sampled_from([b"\r\n", b"\n"]),
)  # fmt: skip


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    data=st.one_of(
        REQUESTISH,
        st.lists(REQUESTISH, min_size=2, max_size=3).map(b"".join),  # pipelined
        HEADISH,
        st.binary(max_size=200),
    )
)
def test_any_bytes_get_an_answer_or_a_close_never_a_crash(serve, data):
    # one server for every example (the fixture is set up once for them all)
    if not hasattr(serve, "fuzzed"):
        serve.fuzzed = serve(read_timeout=1.0)
    server, port = serve.fuzzed
    c = Client(port, timeout=3.0)
    c.send(data)
    c.sock.shutdown(socket.SHUT_WR)  # no more: the server must answer or close now
    assert c.closed(), data
    assert not c.buf or c.buf.startswith(b"HTTP/1.1 "), data
    assert server.stats()["closed"]["error"] == 0
    assert server.lines == []
    c.close()


def test_bare_lf_line_ends_are_accepted(serve):
    _server, port = serve()
    c = Client(port)
    c.send(b"\r\nGET /lf HTTP/1.1\nHost: x\n\n")
    assert json.loads(c.response()[2])["path"] == "/lf"


def test_414_as_soon_as_the_line_is_too_long(serve):
    server, port = serve(read_timeout=5.0, max_request_line=1024)
    # no line end: the answer comes when the limit is crossed, not when the line ends
    answered_at_once(port, b"GET /" + b"a" * 1100, 414, within=1.0)
    # a line just under the limit is served
    c = Client(port)
    c.get("/" + "a" * 1000)
    assert c.response()[0] == 200
    wait_for(lambda: server.stats()["closed"]["too_large"] == 1, what="too_large")


def test_431_as_soon_as_the_head_is_too_large(serve):
    server, port = serve(read_timeout=5.0, max_header_bytes=2048, max_headers=10)
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 2100
    answered_at_once(port, head, 431, within=1.0)
    many = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: 1\r\n" * 10
    answered_at_once(port, many, 431, within=1.0)  # the 11th line, before the head ends
    c = Client(port)
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: 1\r\n" * 9 + b"\r\n")
    assert c.response()[0] == 200
    wait_for(lambda: server.stats()["closed"]["too_large"] == 2, what="too_large")


# -- deadlines -----------------------------------------------------------------------------------


def test_silent_connection_closed_at_read_timeout(serve):
    server, port = serve(read_timeout=0.5)
    c = Client(port)
    start = time.monotonic()
    assert c.closed()
    assert 0.4 < time.monotonic() - start < 2.0
    assert server.stats()["closed"]["read_timeout"] == 1
    assert server.stats()["connections"] == 0


def test_slowloris_closed_at_read_timeout(serve):
    server, port = serve(read_timeout=0.5)
    c = Client(port)
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100
    start = time.monotonic()
    closed_at = None
    for byte in head:
        try:
            c.send(bytes([byte]))
        except OSError:
            closed_at = time.monotonic()
            break
        # a read with a 0.1 s timeout paces the bytes and sees the close
        ready, _, _ = select.select([c.sock], [], [], 0.1)
        if ready:
            assert c.sock.recv(100) == b""
            closed_at = time.monotonic()
            break
    assert closed_at is not None, "a head dribbled for 10 s was not cut"
    assert 0.4 < closed_at - start < 1.5
    assert server.stats()["closed"]["read_timeout"] == 1


def test_idle_keepalive_closed_at_idle_timeout(serve):
    server, port = serve(idle_timeout=0.5, read_timeout=5.0)
    c = Client(port)
    c.get()
    assert c.response()[0] == 200
    start = time.monotonic()
    assert c.closed()
    assert 0.4 < time.monotonic() - start < 2.0
    assert server.stats()["closed"]["idle_timeout"] == 1


def test_later_head_has_read_timeout_from_its_first_byte(serve):
    server, port = serve(idle_timeout=10.0, read_timeout=0.5)
    c = Client(port)
    c.get()
    assert c.response()[0] == 200
    c.send(b"GET / HT")  # then nothing: a slow head, not an idle connection
    start = time.monotonic()
    assert c.closed()
    assert 0.4 < time.monotonic() - start < 2.0
    assert server.stats()["closed"]["read_timeout"] == 1


def test_stdlib_client_interoperates(serve):
    import http.client

    _server, port = serve()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for path in ("/a", "/b?x=%C3%A9"):
        conn.request("GET", path)
        response = conn.getresponse()
        seen = json.loads(response.read())
        assert response.status == 200 and seen["path"] == path.split("?")[0]
    assert seen["query"] == {"x": ["\u00e9"]}
    conn.request("HEAD", "/a")
    response = conn.getresponse()
    assert response.status == 200 and response.read() == b""
    conn.close()


def big(request: Request) -> Response:
    return Response(200, [], BIG)


BIG = b"x" * (16 << 20)  # one object for every response: never copied per connection


def test_client_not_reading_closed_at_write_timeout(serve):
    server, port = serve(handler=big, write_timeout=0.5)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    c = Client(port, sock=sock)
    c.get()
    wait_for(lambda: server.stats()["closed"]["write_timeout"] == 1, what="write_timeout")
    assert server.stats()["connections"] == 0
    # a reader that keeps up gets the whole body
    c = Client(port)
    c.get()
    assert len(c.response()[2]) == len(BIG)


# -- many connections, few threads ---------------------------------------------------------------


def test_300_idle_connections_do_not_delay_a_scrape(serve):
    server, port = serve(read_timeout=10.0)
    threads_before = threading.active_count()
    idle = [Client(port) for _ in range(300)]
    wait_for(lambda: server.stats()["connections"] == 300, what="300 connections")
    # an idle connection costs no thread
    assert threading.active_count() == threads_before
    start = time.monotonic()
    c = Client(port)
    c.get()
    assert c.response()[0] == 200
    assert time.monotonic() - start < 0.5
    for other in idle:
        other.close()


def test_eviction_at_the_cap_spares_requests_being_answered(serve):
    release = threading.Event()

    def handler(request: Request) -> Response:
        if request.path == "/block":
            release.wait(10)
        return echo(request)

    server, port = serve(handler=handler, max_connections=3, read_timeout=10.0)
    busy = Client(port)
    busy.get("/block")
    wait_for(lambda: server.stats()["in_flight"] == 1, what="a handler running")
    idle = [Client(port) for _ in range(2)]
    wait_for(lambda: server.stats()["connections"] == 3, what="3 connections")
    for _ in range(4):  # each new one evicts the longest idle, never the busy one
        c = Client(port)
        c.get()
        assert c.response()[0] == 200
    assert idle[0].closed() and idle[1].closed()
    assert server.stats()["closed"]["evicted"] >= 2
    release.set()
    assert busy.response()[0] == 200


class Blocking:
    """A handler whose /block requests wait for release(), counting those running."""

    def __init__(self):
        self.event = threading.Event()
        self.lock = threading.Lock()
        self.running = 0

    def __call__(self, request: Request) -> Response:
        if request.path == "/block":
            with self.lock:
                self.running += 1
            self.event.wait(10)
            with self.lock:
                self.running -= 1
        return echo(request)


def test_503_when_every_handler_is_busy(serve):
    handler = Blocking()
    release = handler.event
    server, port = serve(handler=handler, max_requests=2)
    blocked = [Client(port) for _ in range(2)]
    for c in blocked:
        c.get("/block")
    # two threads really run them at once
    wait_for(lambda: handler.running == 2, what="two handlers running")
    assert server.stats()["in_flight"] == 2
    c = Client(port, timeout=1.0)
    c.get()
    status, headers, body = c.response()
    assert (status, body) == (503, b"too many requests in flight\n")
    release.set()
    for b in blocked:
        assert b.response()[0] == 200
    # and the pool then answers again, on the connection that got the 503
    c.get()
    assert c.response()[0] == 200
    assert server.stats()["responses"] == {503: 1, 200: 3}


def test_at_the_cap_with_every_connection_busy_new_ones_wait(serve):
    handler = Blocking()
    server, port = serve(handler=handler, max_requests=2, max_connections=2)
    blocked = [Client(port) for _ in range(2)]
    for c in blocked:
        c.get("/block")
    wait_for(lambda: handler.running == 2, what="two handlers running")
    # nothing to evict: the third waits in the listen backlog, neither refused nor served
    waiting = Client(port, timeout=0.3)
    waiting.get()
    with pytest.raises(socket.timeout):
        waiting.response()
    assert server.stats()["accepted"] == 2
    handler.event.set()
    for c in blocked:
        assert c.response()[0] == 200
    waiting.sock.settimeout(5.0)
    assert waiting.response()[0] == 200
    assert server.stats()["closed"]["evicted"] == 1  # one of the two now idle made room


def test_idle_handler_threads_exit(serve, monkeypatch):
    from ibtool.web import server as httpserve

    monkeypatch.setattr(httpserve, "WORKER_IDLE", 0.2)
    before = threading.active_count()
    handler = Blocking()
    server, port = serve(handler=handler, max_requests=4)
    clients = [Client(port) for _ in range(4)]
    for c in clients:
        c.get("/block")
    wait_for(lambda: handler.running == 4, what="four handlers running")
    assert threading.active_count() == before + 5  # the loop and four handler threads
    handler.event.set()
    for c in clients:
        assert c.response()[0] == 200
    wait_for(lambda: threading.active_count() == before + 1, what="idle threads gone")
    clients[0].get()
    assert clients[0].response()[0] == 200  # and one is started again when needed


def test_responses_finishing_together_are_all_written(serve):
    """Handlers released at once hand their responses to the loop together: none may wait
    for an unrelated event (a wake-up lost between taking the results and draining)."""
    barrier = threading.Barrier(8)

    def handler(request: Request) -> Response:
        barrier.wait(5)
        return echo(request)

    _server, port = serve(handler=handler, max_requests=8, keepalive_requests=2000)
    clients = [Client(port, timeout=2.0) for _ in range(8)]
    for _round in range(1500):
        for c in clients:
            c.get()
        for c in clients:
            assert c.response()[0] == 200


def test_handler_raising_is_a_500_and_one_line(serve):
    def handler(request: Request) -> Response:
        if request.path == "/boom":
            raise RuntimeError("kaput")
        return echo(request)

    server, port = serve(handler=handler)
    c = Client(port)
    c.get("/boom")
    status, _headers, body = c.response()
    assert status == 500 and body == b"internal server error\n"
    c.get("/fine")
    assert c.response()[0] == 200
    assert len(server.lines) == 1
    assert "RuntimeError: kaput" in server.lines[0] and "/boom" in server.lines[0]


def test_bad_response_headers_are_a_500(serve):
    def handler(request: Request) -> Response:
        return Response(200, [("X-Split", "a\r\nSet-Cookie: evil=1")], b"")

    _server, port = serve(handler=handler)
    c = Client(port)
    c.get()
    status, headers, _ = c.response()
    assert status == 500 and "set-cookie" not in headers


# -- the process's fds: a subprocess with RLIMIT_NOFILE 128 ---------------------------------------

CHILD = r"""
import json, os, resource, sys, threading
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
from ibtool.web.server import HTTPServer, Limits, Response
logs = []
server = HTTPServer(("127.0.0.1", 0), lambda r: Response(200, [], b"ok\n"),
                    Limits(read_timeout=30, idle_timeout=30), log=logs.append)
print(server.bind()[1], server.max_connections, flush=True)
server.start()
held = []
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "fill":
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        print("{}", flush=True)
    elif cmd == "free":
        for fd in held:
            os.close(fd)
        held.clear()
        print("{}", flush=True)
    elif cmd == "stats":
        t = os.times()
        print(json.dumps({"stats": server.stats(), "cpu": t.user + t.system, "logs": logs,
                          "threads": threading.active_count()}), flush=True)
    elif cmd == "quit":
        break
server.shutdown()
print(json.dumps({"threads": threading.active_count()}), flush=True)
"""


class Child:
    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        port, cap = self.proc.stdout.readline().split()
        self.port, self.cap = int(port), int(cap)

    def ask(self, cmd: str):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stats(self) -> dict:
        return self.ask("stats")["stats"]

    def cpu_over(self, seconds: float) -> float:
        """CPU time the server's process spends in a window of wall-clock time."""
        before = self.ask("stats")["cpu"]
        time.sleep(seconds)  # a measuring window, not a wait for a condition
        return self.ask("stats")["cpu"] - before

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.ask("quit")["threads"] == 1
            self.proc.wait(10)


@pytest.fixture
def child():
    c = Child()
    yield c
    try:
        c.stop()
    finally:
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()


@pytest.mark.parametrize(
    "soft, cap", [(128, 64), (50, 16), (1024, 960), (1 << 20, 4096), (-1, 4096)]
)
def test_connection_cap_from_rlimit_nofile(monkeypatch, soft, cap):
    import resource

    from ibtool.web import server as httpserve

    if soft == -1:
        soft = resource.RLIM_INFINITY
    monkeypatch.setattr(httpserve.resource, "getrlimit", lambda which: (soft, soft))
    assert HTTPServer(("127.0.0.1", 0), echo).max_connections == cap
    assert HTTPServer(("127.0.0.1", 0), echo, Limits(max_connections=5)).max_connections == 5


def test_flood_of_idle_connections_at_rlimit_128(child):
    assert child.cap == 64  # 128 - 64 left for the rest of the process
    flood = [Client(child.port) for _ in range(200)]
    wait_for(
        lambda: child.stats()["closed"]["evicted"] == 200 - child.cap,
        what="the flood evicted down to the cap",
    )
    assert child.stats()["connections"] == child.cap
    # no busy loop while 64 idle connections are open and 136 more were refused
    assert child.cpu_over(1.0) < 0.2
    c = Client(child.port)
    c.get()
    status, _headers, body = c.response()
    assert (status, body) == (200, b"ok\n")
    stats = child.stats()
    assert stats["responses"] == {"200": 1}
    assert stats["closed"]["accept_error"] == 0
    # one line for 136 evictions
    assert child.ask("stats")["logs"] == [
        "64 connections open: closed the longest idle (1 since last said)"
    ]
    for f in flood:
        f.close()


def test_emfile_does_not_spin_and_is_survived(child):
    child.ask("fill")  # every fd of the process but the server's spare is taken
    refused = [Client(child.port) for _ in range(3)]
    for r in refused:
        assert r.closed()  # accepted with the spare fd and closed at once
    stats = child.stats()
    assert stats["closed"]["accept_error"] == 3
    assert child.cpu_over(1.0) < 0.2  # the listening socket is not left readable
    logs = child.ask("stats")["logs"]
    assert logs == ["cannot accept: Too many open files (1 since last said)"]
    child.ask("free")
    c = Client(child.port)
    c.get()
    assert c.response()[0] == 200


# -- TLS -------------------------------------------------------------------------------------------


def make_cert(directory: Path, name: str) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed: no certificate for the TLS tests")
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    return make_cert(directory, "one"), make_cert(directory, "two")


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def tls_client(port: int, ca: Path, cert=None, timeout: float = 5.0) -> Client:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return Client(port, sock=ctx.wrap_socket(raw, server_hostname="localhost"))


def test_tls_get_and_pipelining(serve, certs):
    (cert, key), _ = certs
    ctx = server_context(cert, key)
    server, port = serve(tls=lambda: ctx)
    c = tls_client(port, cert)
    c.get("/secure")
    seen = json.loads(c.response()[2])
    assert seen["path"] == "/secure" and seen["tls"] is True and seen["cert"] is False
    # two requests in one TLS record: the second is already decrypted, in the SSL object's
    # buffer (pending()), where select() cannot see it
    c.send(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
    assert json.loads(c.response()[2])["path"] == "/a"
    assert json.loads(c.response()[2])["path"] == "/b"
    assert server.stats()["closed"]["tls_handshake"] == 0


def test_tls_bytes_held_decrypted_are_not_forgotten(serve, certs):
    """One TLS record longer than a read: what the SSL object keeps after the first request
    (pending()) has no readable socket to announce it, and must be read after the response."""
    (cert, key), _ = certs
    ctx = server_context(cert, key)
    _server, port = serve(tls=lambda: ctx, max_header_bytes=4096, read_timeout=5.0)
    c = tls_client(port, cert, timeout=2.0)
    one = b"GET /one HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 1000 + b"\r\n\r\n"
    two = b"GET /two HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"q" * 3400 + b"\r\n\r\n"
    assert len(one + two) > 4097 and len(two) < 4096
    c.send(one + two)  # one record: under TLS's 16 KiB
    assert json.loads(c.response()[2])["path"] == "/one"
    assert json.loads(c.response()[2])["path"] == "/two"


def test_tls_client_certificate(serve, certs):
    (cert, key), (cert2, key2) = certs
    ctx = server_context(cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(str(cert2))
    _server, port = serve(tls=lambda: ctx)
    c = tls_client(port, cert, cert=(cert2, key2))
    c.get()
    assert json.loads(c.response()[2])["cert"] is True


def test_plaintext_to_tls_port_fails_the_handshake(serve, certs):
    (cert, key), _ = certs
    ctx = server_context(cert, key)
    server, port = serve(tls=lambda: ctx, read_timeout=5.0)
    for _ in range(3):
        c = Client(port, timeout=1.0)
        c.get()
        assert c.closed()
    wait_for(lambda: server.stats()["closed"]["tls_handshake"] == 3, what="3 failed")
    assert len(server.lines) == 1  # said once for that address, not once per connection
    assert "TLS handshake with 127.0.0.1 failed" in server.lines[0]


def test_stalled_tls_handshake_closed_at_read_timeout(serve, certs):
    (cert, key), _ = certs
    ctx = server_context(cert, key)
    server, port = serve(tls=lambda: ctx, read_timeout=0.5)
    c = Client(port)
    hello = client_hello()
    c.send(hello[: len(hello) // 2])  # half a ClientHello, then nothing
    start = time.monotonic()
    assert c.closed()
    assert time.monotonic() - start < 2.0
    assert server.stats()["closed"]["read_timeout"] == 1


def test_tls_context_failing_closes_that_connection(serve):
    def broken():
        raise ssl.SSLError("no certificate yet")

    server, port = serve(tls=broken)
    for _ in range(2):
        assert Client(port).closed()
    assert server.stats()["closed"]["tls_handshake"] == 2
    assert len(server.lines) == 1 and "no certificate yet" in server.lines[0]


def test_tls_context_asked_per_connection(serve, certs):
    (cert, key), (cert2, key2) = certs
    current = [server_context(cert, key)]
    _server, port = serve(tls=lambda: current[0])
    c = tls_client(port, cert)
    c.get()
    assert c.response()[0] == 200
    current[0] = server_context(cert2, key2)  # a certificate rotated, no restart
    c2 = tls_client(port, cert2)
    c2.get()
    assert c2.response()[0] == 200
    # the old connection keeps its context
    c.get()
    assert c.response()[0] == 200
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_client(port, cert)
    current[0] = None  # None: plaintext
    c3 = Client(port)
    c3.get()
    assert json.loads(c3.response()[2])["tls"] is False


# -- shutdown ------------------------------------------------------------------------------------


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_shutdown_leaves_no_thread_and_no_fd():
    threads_before = set(threading.enumerate())
    fds_before = fd_count()
    server = HTTPServer(("127.0.0.1", 0), echo, Limits(max_requests=4))
    _host, port = server.bind()
    server.start()
    clients = []
    for _ in range(4):
        c = Client(port)
        c.get()
        clients.append(c)
    for c in clients:
        assert c.response()[0] == 200
    idle = [Client(port) for _ in range(5)]
    wait_for(lambda: server.stats()["connections"] == 9, what="9 connections")
    assert set(threading.enumerate()) - threads_before  # the loop, the handler threads
    server.shutdown()
    server.shutdown()  # idempotent
    assert set(threading.enumerate()) == threads_before
    for c in clients + idle:
        assert c.closed()
        c.close()
    assert fd_count() == fds_before
    assert server.stats()["connections"] == 0


def test_shutdown_without_start_and_bind_errors():
    fds_before = fd_count()
    server = HTTPServer(("127.0.0.1", 0), echo)
    _host, port = server.bind()
    taken = HTTPServer(("127.0.0.1", port), echo)
    with pytest.raises(OSError):
        taken.bind()
    server.shutdown()
    taken.shutdown()
    assert fd_count() == fds_before
