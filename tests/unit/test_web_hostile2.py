"""The exporter's web side against hostile clients, second pass (issue 38): a flood of wrong
passwords does not starve a scraper whose credentials are cached, and what waits for bcrypt is
bounded; plain HTTP at the TLS port gets Go's 400; Accept-Encoding is negotiated as RFC 9110
12.5.3 says (q=0 forbids); the man page says what the time of a refusal tells.

Nothing sleeps to wait for the server: a test polls a condition with a deadline or blocks on a
socket with a timeout. bcrypt is made slow through its module attribute (the seam
test_webconfig's `checks` fixture uses), so that the flood reproduces the starvation of a
cost-10 hash in a fraction of a second.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import re
import secrets
import ssl
import threading
import time
from pathlib import Path

import pytest

from ibtool.live import exporter as exporter_module
from ibtool.live.exporter import Endpoint, Latest
from ibtool.web.server import Request, Response
from tests.unit.test_exporter import family
from tests.unit.test_httpserve import Blocking, Client, echo, serve, wait_for  # noqa: F401

bcrypt = pytest.importorskip("bcrypt")
pytest.importorskip("yaml")
pytest.importorskip("prometheus_client")

REPO = Path(__file__).resolve().parents[2]
TLS = REPO / "tests" / "fixtures" / "tls"


@pytest.fixture
def serve_http(serve):  # noqa: F811 (test_httpserve's fixture)
    """test_httpserve's `serve` (an HTTPServer on 127.0.0.1, its log lines kept)."""
    return serve


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- a wrong-password flood against a cached scraper -------------------------------------------


class SlowBcrypt:
    """bcrypt.checkpw taking `delay` more seconds (a cost-10 check takes 60-120 ms), counting
    the checks running at once."""

    def __init__(self, delay: float):
        self.delay, self.real = delay, bcrypt.checkpw
        self.lock = threading.Lock()
        self.running = self.most = self.calls = 0

    def __call__(self, password, hashed):
        with self.lock:
            self.running += 1
            self.calls += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.delay)  # the work of a costlier hash, not a wait for anything
            return self.real(password, hashed)
        finally:
            with self.lock:
                self.running -= 1


class Exporter:
    """serve() on 127.0.0.1 with a web configuration of one user, in a thread."""

    def __init__(self, tmp_path: Path, max_requests: int):
        from ibtool.web.config import Watcher

        hashed = bcrypt.hashpw(b"good", bcrypt.gensalt(rounds=4)).decode()
        path = tmp_path / "web.yml"
        path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        self.warnings: list[str] = []
        self.stop = threading.Event()
        bound = threading.Event()

        def ready(address):
            self.port = address[1]
            bound.set()

        self.thread = threading.Thread(
            target=exporter_module.serve,
            args=(("127.0.0.1", 0), lambda: family(3), 0.05, self.warnings.append),
            kwargs={
                "stop": self.stop,
                "ready": ready,
                "max_requests": max_requests,
                "web": Watcher(str(path), self.warnings.append),
            },
            daemon=True,
        )
        self.thread.start()
        assert bound.wait(10)

    def get(self, password: str, conn: http.client.HTTPConnection | None = None):
        """(status, seconds) of one GET /metrics, on `conn` or a connection of its own."""
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        began = time.monotonic()
        try:
            conn.request(
                "GET", "/metrics", headers={"Authorization": basic("prometheus", password)}
            )
            reply = conn.getresponse()
            reply.read()
            return reply.status, time.monotonic() - began
        finally:
            if own:
                conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def exporter(tmp_path):
    running = []

    def start(max_requests: int) -> Exporter:
        running.append(Exporter(tmp_path, max_requests))
        return running[-1]

    yield start
    for e in running:
        e.close()


def test_a_cached_scraper_is_served_through_a_wrong_password_flood(exporter, monkeypatch):
    """Issue 38: 60 threads of wrong passwords for a cost-10 user made the correct scrape 503
    on every try (those waiting for bcrypt held every --web.max-requests slot). Here 16
    threads against 4 slots and a 20 ms bcrypt: the correct, cached scrape is served every
    time, and the flood is answered 401 or 503, none of it kept waiting long, one bcrypt at a
    time, with a bounded number of threads."""
    slow = SlowBcrypt(0.02)
    monkeypatch.setattr(bcrypt, "checkpw", slow)
    e = exporter(max_requests=4)
    wait_for(lambda: e.get("good")[0] == 200, what="the scraper served once (and cached)")
    threads_before = threading.active_count()
    stop = threading.Event()
    deadline = time.monotonic() + 20  # the flood's bound, whatever happens
    lock = threading.Lock()
    answers: dict = {}
    latencies: list[float] = []

    def flood():
        conn = None
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", e.port, timeout=10)
                status, took = e.get(secrets.token_hex(8), conn)
            except (OSError, http.client.HTTPException) as error:
                status, took, conn = type(error).__name__, None, None
            with lock:
                answers[status] = answers.get(status, 0) + 1
                if took is not None:
                    latencies.append(took)

    flooders = [threading.Thread(target=flood, daemon=True) for _ in range(16)]
    for t in flooders:
        t.start()
    try:
        # saturated: some of the flood is already refused for want of room
        wait_for(lambda: answers.get(503, 0) >= 20, timeout=10, what="the flood refused")
        served, most_threads = [], 0
        for _ in range(20):
            served.append(e.get("good")[0])
            most_threads = max(most_threads, threading.active_count())
        # wrong passwords were checked meanwhile, and refused
        wait_for(lambda: answers.get(401, 0) >= 2, timeout=10, what="checks refused")
    finally:
        stop.set()
        for t in flooders:
            t.join(15)
    assert served == [200] * 20, served
    assert set(answers) <= {401, 503}, answers
    assert max(latencies) < 3.0, max(latencies)  # nobody waits without a bound
    assert slow.most == 1  # one bcrypt at a time (web/handler.go bcryptMtx)
    # the 16 flooders, and the server's: its loop, the handler pool (at most 4), one checker
    assert most_threads <= threads_before + 16 + 4 + 1, most_threads


def test_a_flood_of_wrong_passwords_does_not_evict_a_good_one(tmp_path, monkeypatch):
    """web/cache.go drops a tenth of the cache at random when it is full: a thousand wrong
    passwords would drop the good one (0.9 ** 90 of surviving), and the scraper would then
    queue behind the flood. Failures are kept apart from successes."""
    from ibtool.web.config import load

    hashed = bcrypt.hashpw(b"good", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    config = load(str(path))
    assert config.authorized(basic("prometheus", "good"))
    calls = []
    monkeypatch.setattr(bcrypt, "checkpw", lambda p, h: calls.append(p) or False)  # fast: a stub
    for i in range(1000):
        assert not config.authorized(basic("prometheus", f"guess{i}"))
    assert len(calls) == 1000
    assert config.authorized(basic("prometheus", "good"))
    assert len(calls) == 1000  # answered from the cache, no bcrypt
    assert len(config._cache) <= 200  # bounded: a hundred of each at most


# -- the auth stage of the HTTP server ----------------------------------------------------------


class SlowAuth:
    """An auth stage: `Basic ok` passes at once (cached), `Basic no` is refused at once, any
    other credential needs a slow check, which waits for `release` and then passes."""

    def __init__(self):
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = self.most = self.started = 0

    def __call__(self, request: Request):
        header = request.headers.get("authorization")
        if header == "Basic ok":
            return None
        if header == "Basic no":
            return Response(401, [("WWW-Authenticate", "Basic")], b"Unauthorized\n")

        def check():
            with self.lock:
                self.started += 1
                self.running += 1
                self.most = max(self.most, self.running)
            try:
                self.release.wait(10)
                return None
            finally:
                with self.lock:
                    self.running -= 1

        return check


def test_uncached_checks_wait_in_a_small_room_the_rest_get_503_at_once(serve_http):
    auth = SlowAuth()
    server, port = serve_http(auth=auth, max_auth_pending=2, max_requests=2)
    waiting = [Client(port) for _ in range(2)]
    for c in waiting:
        c.get("/a", "Authorization: Basic slow\r\n")
    wait_for(lambda: server.stats()["auth_pending"] == 2, what="two checks pending")
    wait_for(lambda: auth.running == 1, what="one check running")
    # the room is full: an uncached check is refused at once, it does not wait
    for _ in range(3):
        c = Client(port, timeout=2.0)
        began = time.monotonic()
        c.get("/b", "Authorization: Basic slow2\r\n")
        status, headers, body = c.response()
        assert (status, body) == (503, b"too many credential checks waiting\n")
        assert headers["retry-after"] == "1"
        assert time.monotonic() - began < 1.0
    # a cached client and a cached refusal are answered at once, the room full or not
    c = Client(port, timeout=2.0)
    c.get("/cached", "Authorization: Basic ok\r\n")
    assert c.response()[0] == 200
    c.get("/cached", "Authorization: Basic no\r\n")
    assert c.response()[0] == 401
    auth.release.set()
    for c in waiting:
        assert c.response()[0] == 200
    assert auth.most == 1  # one checker thread
    assert server.stats()["auth_pending"] == 0
    assert server.stats()["responses"] == {200: 3, 401: 1, 503: 3}


def test_the_in_flight_cap_still_bounds_the_handler_behind_auth(serve_http):
    handler = Blocking()
    server, port = serve_http(handler=handler, auth=SlowAuth(), max_requests=2)
    blocked = [Client(port) for _ in range(2)]
    for c in blocked:
        c.get("/block", "Authorization: Basic ok\r\n")
    wait_for(lambda: handler.running == 2, what="two handlers running")
    c = Client(port, timeout=2.0)
    c.get("/", "Authorization: Basic ok\r\n")
    assert c.response()[:3:2] == (503, b"too many requests in flight\n")
    handler.event.set()
    for b in blocked:
        assert b.response()[0] == 200
    assert server.stats()["in_flight"] == 0


def test_an_auth_stage_that_raises_is_a_500_and_one_line(serve_http):
    def broken(request):
        if request.path == "/slow":
            return lambda: 1 / 0
        raise RuntimeError("auth bug")

    server, port = serve_http(auth=broken)
    c = Client(port, timeout=2.0)
    c.get("/")
    assert c.response()[0] == 500
    c.get("/slow")
    assert c.response()[0] == 500
    c.get("/")
    assert c.response()[0] == 500
    assert server.stats()["auth_pending"] == 0
    assert any("RuntimeError: auth bug" in line for line in server.lines)
    assert any("ZeroDivisionError" in line for line in server.lines)


def test_checks_pending_at_shutdown_are_not_run(serve_http):
    auth = SlowAuth()
    server, port = serve_http(auth=auth, max_auth_pending=4)
    clients = [Client(port) for _ in range(3)]
    for c in clients:
        c.get("/", "Authorization: Basic slow\r\n")
    wait_for(lambda: server.stats()["auth_pending"] == 3, what="three checks pending")
    stopping = threading.Thread(target=server.shutdown)
    stopping.start()
    wait_for(lambda: server._stopping, what="the shutdown begun")
    auth.release.set()
    stopping.join(15)
    assert not stopping.is_alive()
    assert auth.started == 1  # the one running finished; the two waiting were dropped


# -- plain HTTP at the TLS port -----------------------------------------------------------------


def tls_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(TLS / "server.pem"), str(TLS / "server.key"))
    return ctx


GO_400 = b"Client sent an HTTP request to an HTTPS server.\n"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HEAD / HTTP/1.0\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    ],
)
def test_plain_http_to_the_tls_port_gets_gos_400(serve_http, request_bytes):
    """Go's net/http answers such a request 400 "Client sent an HTTP request to an HTTPS
    server." (server.go, tlsRecordHeaderLooksLikeHTTP), so that curl http:// on the TLS port
    says what is wrong; a closed connection says nothing."""
    ctx = tls_context()
    server, port = serve_http(tls=lambda: ctx, read_timeout=5.0)
    c = Client(port, timeout=3.0)
    c.send(request_bytes)
    status, headers, body = c.response()
    assert (status, body) == (400, GO_400)
    assert headers["connection"] == "close"
    assert c.closed(reset_ok=False)
    c.close()  # the server, lingering for the rest of the request, then closes too
    wait_for(lambda: server.stats()["closed"]["tls_handshake"] == 1, what="the close counted")
    assert server.stats()["responses"] == {400: 1}
    assert "client sent an HTTP request to an HTTPS server" in server.lines[0]


def test_plain_http_byte_by_byte_to_the_tls_port_gets_the_400(serve_http):
    ctx = tls_context()
    _server, port = serve_http(tls=lambda: ctx, read_timeout=5.0)
    c = Client(port, timeout=3.0)
    for byte in b"GET /":
        c.send(bytes([byte]))
    assert c.response()[::2] == (400, GO_400)


@pytest.mark.parametrize(
    "data",
    [
        b"SSH-2.0-OpenSSH_9.2\r\n",  # another protocol: not HTTP, not TLS
        b"\x00\x01\x02\x03\x04\x05",
        b"get / HTTP/1.1\r\n\r\n",  # methods are case-sensitive (RFC 9110 9.1)
    ],
)
def test_what_is_neither_tls_nor_http_is_closed_with_nothing_sent(serve_http, data):
    ctx = tls_context()
    server, port = serve_http(tls=lambda: ctx, read_timeout=5.0)
    c = Client(port, timeout=3.0)
    c.send(data)
    assert c.closed()
    assert c.buf == b""
    wait_for(lambda: server.stats()["closed"]["tls_handshake"] == 1, what="a failed handshake")


def test_a_silent_http_prefix_at_the_tls_port_has_the_handshake_timeout(serve_http):
    ctx = tls_context()
    server, port = serve_http(tls=lambda: ctx, read_timeout=0.5)
    c = Client(port, timeout=5.0)
    c.send(b"GE")  # could still be "GET /": then nothing
    began = time.monotonic()
    assert c.closed()
    assert time.monotonic() - began < 3.0
    assert server.stats()["closed"]["read_timeout"] == 1


def test_tls_still_works_once_the_first_byte_is_looked_at(serve_http):
    ctx = tls_context()
    server, port = serve_http(tls=lambda: ctx)
    client = ssl.create_default_context(cafile=str(TLS / "ca.pem"))
    import socket

    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    c = Client(port, sock=client.wrap_socket(raw, server_hostname="localhost"))
    c.get("/tls")
    status, _headers, body = c.response()
    assert status == 200 and b'"tls": true' in body
    c.get("/again")
    assert c.response()[0] == 200
    assert server.stats()["closed"]["tls_handshake"] == 0


# -- Accept-Encoding --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "gzipped"),
    [
        (None, False),
        ("", False),
        ("gzip", True),
        ("GZip", True),  # content-codings are case-insensitive (RFC 9110 8.4.1)
        ("x-gzip", True),  # RFC 9110 8.4.1.3: x-gzip is gzip
        ("deflate, gzip;q=1.0, *;q=0.5", True),
        ("gzip;q=0, identity", False),  # issue 38: q=0 is "not acceptable"
        ("gzip; q=0.000", False),
        ("gzip;Q=0", False),  # the weight's name is case-insensitive (RFC 9110 12.4.2)
        ("identity, gzip;q=0", False),
        ("*", True),  # "*" matches any coding not listed
        ("*;q=0", False),
        ("*;q=0.5, gzip;q=0", False),
        ("gzip;q=0, *", False),  # listed: the "*" does not apply to it
        ("br, deflate", False),
        ("gzip;q=0.5, identity;q=1", False),  # the client prefers identity
        ("gzip;q=0.5, identity;q=0.5", True),  # a tie: the smaller answer
        ("gzip;q=0.5", True),
        ("identity;q=0, gzip;q=0.001", True),
        ("gzip;q=2", False),  # not a qvalue: taken as 0, identity is always safe
        ("gzip;q=0.5000", False),  # at most three decimals
        ("gzip;q=", False),
        ("gzip;q=1.001", False),
        ("gzip;level=9", False),  # Accept-Encoding has no other parameter
        ("gzip;q=0.1;q=0.9", False),
        (", , gzip ,", True),  # empty list elements are ignored (RFC 9110 5.6.1.2)
        ("gzip, gzip;q=0", False),  # said twice, q=0 once: forbidden
        pytest.param("gzip, " + "x, " * 4000, True, id="long"),  # bounded by the head's size
        ("gzipx", False),
        ("\tgzip\t;\tq=1", True),
    ],
)
def test_accept_encoding_is_negotiated(header, gzipped):
    assert exporter_module.accepts_gzip(header) is gzipped


def scrape(headers: dict[str, str]) -> Response:
    latest = Latest()
    latest.store(family(3), 1795000000.0, 0.01)
    endpoint = Endpoint(
        latest,
        lambda: {"connections": 0, "in_flight": 1, "accepted": 1, "responses": {}, "closed": {}},
    )
    request = Request(
        method="GET",
        path="/metrics",
        query={},
        version="HTTP/1.1",
        headers={k.lower(): v for k, v in headers.items()},
        peer=("127.0.0.1", 1),
        tls=False,
        peer_cert=None,
    )
    return endpoint(request)


def test_gzip_forbidden_by_q0_is_not_sent():
    reply = scrape({"Accept-Encoding": "gzip;q=0, identity"})
    assert ("Content-Encoding", "gzip") not in reply.headers
    assert b"ibtool_port_rate" in reply.body
    assert ("Vary", "Accept-Encoding") in reply.headers
    reply = scrape({"Accept-Encoding": "identity;q=0.5, gzip"})
    assert ("Content-Encoding", "gzip") in reply.headers
    assert b"ibtool_port_rate" in gzip.decompress(reply.body)


# -- timing, as the man page says it ------------------------------------------------------------


def test_the_man_page_says_users_of_different_costs_are_told_apart(tmp_path):
    """A wrong password for an unknown user is checked against a dummy hash of the highest
    cost configured; a user of a lower cost answers faster (4.8 ms at cost 4, 114 ms at 10), so
    the page must not promise the same time whatever the user: it says to give every user the
    same cost."""
    from ibtool.web.config import load

    four = bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4)).decode()
    five = bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=5)).decode()
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  a: '{four}'\n  b: '{five}'\n")
    assert load(str(path))._dummy_hash.startswith("$2b$05$")  # the highest cost
    text = (REPO / "man" / "ibtool-exporter.8").read_text()
    text = re.sub(r"\\f[BIRP]|\\&", "", text).replace("\\-", "-")
    words = " ".join(line for line in text.splitlines() if not line.startswith("."))
    words = " ".join(words.split())
    assert "takes the same time whether the user exists or not" not in words
    assert "the highest cost" in words
    assert "give every user the same cost" in words
