"""What `ibtool ping --server` lets in (ibtool/rdma/ping/admission.py, acceptor.Acceptor).

The admission bookkeeping runs on a fake clock. The server's TCP side runs in a thread on the
fake pyverbs (pyverbs_fakes.py): floods of idle, half-open and garbage connections while a
real client's handshake completes, the refusals each client is told, the memory never
registered for a refused ping, and nothing left of a session once it ends or the server stops.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time

import pytest

from ibtool.argtypes import parse_size
from ibtool.errors import ExitCode
from ibtool.rdma import wire
from ibtool.rdma.ladder import Ladder, PathSpec
from ibtool.rdma.ping import acceptor, admission, echo, pingpong, session
from ibtool.rdma.ping import client as native
from ibtool.rdma.ping import server as ping_server
from ibtool.rdma.ping.admission import Admission, Limits, RefusalLog, Refused, TokenBucket
from ibtool.rdma.ping.options import ServeOptions
from tests.unit.fake_host import ROCE_GID


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def nets(*texts: str) -> tuple:
    return tuple(admission.parse_network(t) for t in texts)


# -- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("0", 0),
        ("4096", 4096),
        ("64K", 64 << 10),
        ("64M", 64 << 20),
        ("2g", 2 << 30),
        ("1MiB", 1 << 20),
        (" 8M ", 8 << 20),
    ],  # fmt: skip
)
def test_sizes_take_k_m_g_suffixes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "M", "1.5M", "-1", "1T", "ten"])
def test_what_is_not_a_size_is_refused(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_sizes_are_shown_in_their_largest_whole_unit():
    shown = [admission.show_size(n) for n in (64 << 20, 1 << 30, 1536, 1000, 0)]
    assert shown == ["64M", "1G", "1536", "1000", "0"]


def test_networks_and_sources():
    assert admission.parse_network("10.1.2.3/16") == ipaddress.ip_network("10.1.0.0/16")
    assert admission.parse_network("fd77::1") == ipaddress.ip_network("fd77::1/128")
    with pytest.raises(ValueError, match="not an IPv4 or IPv6 address or CIDR"):
        admission.parse_network("10.0.0.0/33")
    assert admission.source_of("::ffff:10.0.0.5") == ipaddress.ip_address("10.0.0.5")
    assert admission.source_of("fe80::1%veth0") == ipaddress.ip_address("fe80::1")


# -- token buckets, the refusal log ------------------------------------------------------------


def test_a_token_bucket_gives_its_burst_then_its_rate():
    bucket = TokenBucket(rate=2.0, burst=3.0, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.wait(0.0) == pytest.approx(0.5)
    assert not bucket.take(0.4) and bucket.take(0.5)
    assert not bucket.full(1.5) and bucket.full(2.0)
    assert bucket.take(100.0) and bucket.tokens == pytest.approx(2.0)  # never over the burst


def test_refusals_are_one_line_then_a_count_per_interval():
    clock, lines = Clock(), []
    log = RefusalLog(lines.append, clock)
    for _ in range(38):
        log.refused("10.0.0.5", "over --max-per-source 4")
        clock.now += 1.0
    log.refused("10.0.0.6", "not in --allow")
    assert lines == [
        "refused 10.0.0.5: connection over --max-per-source 4",
        "refused 10.0.0.6: connection not in --allow",
    ]
    clock.now = 1000.0 + 60.0
    log.flush()
    assert lines[2:] == [
        "refused 10.0.0.5: 37 more connections over --max-per-source 4 in the last 60 s"
    ]
    clock.now += 60.0
    log.flush()  # nothing more came: nothing said, both forgotten
    assert len(lines) == 3 and not log._open
    log.refused("10.0.0.5", "over --max-per-source 4")  # a new interval: said again
    log.refused("10.0.0.5", "over --max-per-source 4")
    clock.now += 61.0
    log.refused("10.0.0.5", "over --max-per-source 4")  # the count, then a fresh first line
    assert lines[3:] == [
        "refused 10.0.0.5: connection over --max-per-source 4",
        "refused 10.0.0.5: 1 more connection over --max-per-source 4 in the last 60 s",
        "refused 10.0.0.5: connection over --max-per-source 4",
    ]


def test_a_persistent_flood_is_a_line_an_interval():
    clock, lines = Clock(), []
    log = RefusalLog(lines.append, clock)
    for _ in range(3 * 480):  # eight a second for three minutes
        log.refused("10.0.0.5", "over --max-rate 10/s")
        clock.now += 0.125
        log.flush()
    assert lines == [
        "refused 10.0.0.5: connection over --max-rate 10/s",
        "refused 10.0.0.5: 479 more connections over --max-rate 10/s in the last 60 s",
        "refused 10.0.0.5: 480 more connections over --max-rate 10/s in the last 60 s",
        "refused 10.0.0.5: 480 more connections over --max-rate 10/s in the last 60 s",
    ]


# -- admission ---------------------------------------------------------------------------------


def admitted(limits: Limits, clock: Clock | None = None) -> tuple[Admission, list[str]]:
    lines: list[str] = []
    return Admission(limits, lines.append, clock or Clock()), lines


def test_the_allow_list_matches_ipv4_mapped_peers_as_ipv4():
    adm, lines = admitted(Limits(allow=nets("10.255.0.0/16", "fd77::/64")))
    assert adm.connection("10.255.1.2").source == ipaddress.ip_address("10.255.1.2")
    assert adm.connection("::ffff:10.255.3.4").source == ipaddress.ip_address("10.255.3.4")
    assert adm.connection("fd77::2").source == ipaddress.ip_address("fd77::2")
    for host in ("127.0.0.1", "::ffff:127.0.0.1", "::1", "10.254.0.1"):
        with pytest.raises(Refused) as e:
            adm.connection(host)
        assert (e.value.reason, e.value.tell) == ("not in --allow", None)  # closed at once
    assert lines == [
        "refused 127.0.0.1: connection not in --allow",
        "refused ::1: connection not in --allow",
        "refused 10.254.0.1: connection not in --allow",
    ]


def test_everyone_is_allowed_by_default():
    adm, _ = admitted(Limits())
    assert adm.connection("192.0.2.7") and adm.connection("2001:db8::7")


def test_new_connections_per_source_go_through_a_token_bucket():
    clock = Clock()
    adm, lines = admitted(Limits(max_rate=2.0, max_per_source=100), clock)
    tickets = [adm.connection("10.0.0.1") for _ in range(4)]  # the burst: 2 s of 2/s
    with pytest.raises(Refused) as e:
        adm.connection("10.0.0.1")
    assert (e.value.reason, e.value.tell) == ("over --max-rate 2/s", None)
    assert adm.connection("10.0.0.2")  # another source has its own bucket
    clock.now += 0.5
    assert adm.connection("10.0.0.1")  # one token back
    assert len(tickets) == 4 and lines == ["refused 10.0.0.1: connection over --max-rate 2/s"]


def test_connections_per_source_and_sessions_in_total_are_bounded():
    adm, lines = admitted(Limits(max_per_source=2, max_sessions=3))
    a, b = adm.connection("10.0.0.1"), adm.connection("10.0.0.1")
    with pytest.raises(Refused) as e:
        adm.connection("10.0.0.1")
    assert e.value.tell == "refused: 2 connections from 10.0.0.1 already, the most " \
        "--max-per-source 2 allows"  # fmt: skip
    c, d = adm.connection("10.0.0.2"), adm.connection("10.0.0.3")
    for t in (a, b, c):
        adm.session(t)
    assert adm.sessions == 3
    with pytest.raises(Refused) as e:
        adm.session(d)  # its handshake is done, but three are served
    assert e.value.tell == "refused: 3 clients served, the most --max-sessions allows"
    with pytest.raises(Refused):
        adm.connection("10.0.0.4")  # refused as it connects, too
    adm.release(a)
    adm.release(a)  # twice: nothing more given back
    assert adm.sessions == 2 and adm.held("10.0.0.1") == 1
    adm.session(d)
    assert adm.sessions == 3
    assert lines == [
        "refused 10.0.0.1: connection over --max-per-source 2",
        "refused 10.0.0.3: connection over --max-sessions 3",
        "refused 10.0.0.4: connection over --max-sessions 3",
    ]


def test_memory_is_reserved_per_client_and_in_total():
    adm, lines = admitted(Limits(max_memory=3 << 20, per_client_memory=1 << 20))
    a, b, c, d = (adm.connection(f"10.0.0.{i}") for i in range(1, 5))
    with pytest.raises(Refused) as e:
        adm.reserve(a, (1 << 20) + 1)
    assert e.value.tell == "refused: 1048577 bytes to register, a client may have 1048576"
    for t in (a, b, c):
        adm.reserve(t, 1 << 20)
    with pytest.raises(Refused) as e:
        adm.reserve(d, 64)
    assert e.value.tell == (
        "refused: 64 bytes to register would pass --max-memory 3M (3145728 in use)"
    )
    adm.reserve(a, 4096)  # a client's new session replaces its old reservation
    assert adm.memory == (2 << 20) + 4096
    adm.reserve(d, 64)
    adm.free(b)
    adm.release(c)
    assert adm.memory == 4096 + 64
    assert lines == [
        "refused 10.0.0.1: connection over the 1M a client may register",
        "refused 10.0.0.4: connection over --max-memory 3M",
    ]


def test_qp_rebuilds_wait_their_turn():
    clock = Clock()
    adm, _ = admitted(Limits(), clock)
    t = adm.connection("10.0.0.1")
    assert adm.rebuild_wait(t) == 0.0  # not a session yet: no bucket
    adm.session(t)
    waits = [adm.rebuild_wait(t) for _ in range(admission.RECONNECT_BURST + 2)]
    assert waits[: admission.RECONNECT_BURST] == [0.0] * admission.RECONNECT_BURST
    assert waits[-2:] == pytest.approx([1.0, 2.0])  # one a second, each behind the last


def test_the_tables_stay_bounded(monkeypatch):
    monkeypatch.setattr(admission, "MAX_TRACKED", 50)
    clock = Clock()
    adm, _ = admitted(Limits(max_rate=1.0, max_per_source=1), clock)
    for i in range(200):
        adm.release(adm.connection(f"10.0.{i // 256}.{i % 256}"))
    assert len(adm._buckets) <= 50


# -- the server's TCP side -----------------------------------------------------------------------


@pytest.fixture
def roce(fake_pyverbs, live_roce):
    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=2, gids={3: ROCE_GID})
    return fabric


class Server(threading.Thread):
    """`ibtool ping --server` (or its --compat rc_pingpong) on the fake mlx5_0/1 in a thread,
    with `limits`, until stop()."""

    def __init__(self, monkeypatch, limits: Limits, compat: bool = False, **serve):
        super().__init__(daemon=True)
        self.log: list[str] = []
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.limits, self.compat, self.serve = limits, compat, serve
        server = self

        class Recorded(acceptor.Acceptor):
            def __init__(self, listener, *args):
                super().__init__(listener, *args)
                server.acceptor, server.port = self, listener.getsockname()[1]
                server.ready.set()

        monkeypatch.setattr(ping_server, "Acceptor", Recorded)
        monkeypatch.setattr(pingpong, "Acceptor", Recorded)

    def run(self) -> None:
        try:
            options = ServeOptions(
                "127.0.0.1", 0, self.log.append, device="mlx5_0", device_port=1, gid_index=3,
                limits=self.limits, **self.serve,
            )  # fmt: skip
            (pingpong.serve if self.compat else ping_server.serve)(options)
        except BaseException as e:
            self.error = e
        finally:
            self.ready.set()

    def __enter__(self) -> Server:
        self.start()
        assert self.ready.wait(10) and self.error is None, self.error
        return self

    def __exit__(self, *exc) -> None:
        self.acceptor.stop.set()
        self.join(30)
        assert not self.is_alive(), "the ping server did not stop"
        assert self.error is None, self.error

    def wait_for(self, pattern: str, timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.log if re.search(pattern, line)]
            if found:
                return found[-1]
            assert time.monotonic() < deadline, (pattern, self.log)
            time.sleep(0.01)


def pings(port: int, count: int = 3, size: int = 64) -> tuple[native.PingStats, float]:
    """A client's run against the server; and how long its handshake took."""
    stats, rtts = native.PingStats(), []
    with Ladder("mlx5_0", 1, 3) as ladder:
        client = native.Client(ladder, "127.0.0.1", port, size, wire.Mode.SEND, 5.0)
        try:
            t0 = time.monotonic()
            client.connect()
            took = time.monotonic() - t0
            native.run_client(client, count, 0, None, lambda *r: None, None, stats, rtts)
        finally:
            client.close()
    return stats, took


def endpoint(size: int = 64) -> bytes:
    ep = wire.Endpoint(0x99, 1, 0, 3, bytes(15) + b"\x01", 0x1000, 1, size, wire.Mode.SEND)
    return wire.encode_endpoint(ep)


def raw_endpoint(size: int) -> bytes:
    """An ENDPOINT asking for `size` bytes, as wire's encoder packs it (no check of ours)."""
    payload = wire.ENDPOINT.pack(0x99, 1, 0, 3, bytes(15) + b"\x01", 0x1000, 1, size, 1)
    return wire.encode(wire.MessageType.ENDPOINT, payload)


def test_idle_half_open_and_garbage_connections_never_delay_a_handshake(roce, monkeypatch):
    limits = Limits(max_per_source=1000, max_rate=1e6)  # the flood is all admitted
    with Server(monkeypatch, limits) as server:
        flood = []
        for i in range(200):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            if i % 4 == 1:
                s.sendall(endpoint()[:20])  # half an ENDPOINT, then nothing
            elif i % 4 == 2:
                s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            flood.append(s)
        stats, took = pings(server.port, 5)
        for s in flood:
            s.close()
        assert (stats.sent, stats.received) == (5, 5)
        assert took < 1.0, took  # not 200 x HANDSHAKE_TIMEOUT, nor one of it
        server.wait_for(" done: 5 pings answered")
    dropped = [line for line in server.log if " dropped: " in line]
    assert len(dropped) == 1, server.log  # one line for the source, the repeats counted
    assert not roce.qps and not roce.mrs


def test_a_flood_from_one_address_is_refused_in_two_lines_and_others_are_served(roce, monkeypatch):
    with Server(monkeypatch, Limits(max_per_source=4, max_rate=5.0)) as server:
        flood = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(60)]
        server.wait_for("refused 127.0.0.1: connection over --max-rate 5/s")
        for s in flood:
            s.close()
        time.sleep(0.5)  # the bucket refills a token or two
        stats, _ = pings(server.port, 2)
        assert (stats.sent, stats.received) == (2, 2)
    refused = [line for line in server.log if line.startswith("refused ")]
    assert refused == [
        "refused 127.0.0.1: connection over --max-per-source 4",
        "refused 127.0.0.1: connection over --max-rate 5/s",
    ]


def test_refusals_repeat_as_a_count(roce, monkeypatch):
    monkeypatch.setattr(admission, "INTERVAL", 0.3)
    with Server(monkeypatch, Limits(allow=nets("10.255.0.0/16"))) as server:
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
                s.settimeout(10)
                assert s.recv(100) == b""  # closed at once, nothing said
        server.wait_for("more connections", timeout=5)
    assert [line for line in server.log if line.startswith("refused ")] == [
        "refused 127.0.0.1: connection not in --allow",
        "refused 127.0.0.1: 4 more connections not in --allow in the last 0.3 s",
    ]


def test_a_second_client_over_max_per_source_is_told_why(roce, monkeypatch, live_roce):
    with Server(monkeypatch, Limits(max_per_source=1)) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as first:
            first.sendall(endpoint())
            wire.receive(first, 10, wire.MessageType.ENDPOINT)
            r = live_roce("ping", "127.0.0.1", "--port", str(server.port), "-c", "3")
        assert r.code == ExitCode.FAILED
        reason = (
            "peer says: refused: 1 connection from 127.0.0.1 already, the most "
            "--max-per-source 1 allows"
        )
        assert r.err.startswith(f"ibtool: warning: seq=1 lost: {reason}\n"), r.err
        # No retry can pass: the run ends with the server's reason, not a closed connection.
        assert f"ibtool: error: {reason} (hint: the ping server at " in r.err, r.err
        assert "seq=2" not in r.err and "closed" not in r.err, r.err


def test_a_huge_ping_is_refused_before_any_memory_is_registered(roce, monkeypatch):
    registered = []
    monkeypatch.setattr(session.Session, "_keep", lambda s, o: registered.append(o) or o)
    with Server(monkeypatch, Limits()) as server:
        for size in (1 << 30, session.MAX_PING_SIZE + 1):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
                c.sendall(raw_endpoint(size))
                with pytest.raises(wire.PeerError) as e:
                    wire.receive(c, 10)
                assert str(e.value.message) == (
                    f"peer says: ping size {size} exceeds {session.MAX_PING_SIZE} bytes"
                )
    assert registered == [] and not roce.mrs


def test_max_memory_refuses_a_session_that_would_pass_it(roce, monkeypatch):
    limits = Limits(max_memory=(1 << 20) + 4096)
    with Server(monkeypatch, limits) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as first:
            first.sendall(endpoint(1 << 20))
            wire.receive(first, 10, wire.MessageType.ENDPOINT)
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
                c.sendall(endpoint(8192))
                with pytest.raises(wire.PeerError, match="would pass --max-memory 1028K"):
                    wire.receive(c, 10)
    assert [line for line in server.log if "--max-memory" in line] == [
        "refused 127.0.0.1: connection over --max-memory 1028K"
    ]


def test_a_client_whose_qp_died_holds_nothing_while_it_is_waited_for(roce, monkeypatch):
    with Server(monkeypatch, Limits()) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
            c.sendall(endpoint())
            wire.receive(c, 10, wire.MessageType.ENDPOINT)
            c.sendall(wire.encode_error("my QP died"))  # instead of READY
            server.wait_for("connection not ready: peer says: my QP died")
            deadline = time.monotonic() + 10
            while roce.qps or roce.mrs:  # closed before the reconnect is waited for
                assert time.monotonic() < deadline, (roce.qps, roce.mrs)
                time.sleep(0.01)
            assert server.acceptor.admission.memory == 0
        server.wait_for(" done: 0 pings answered")


def test_a_silent_client_is_dropped_after_the_idle_timeout(roce, monkeypatch):
    for module in (acceptor, echo, ping_server):  # the grace before a first ping
        monkeypatch.setattr(module, "HANDSHAKE_TIMEOUT", 0.5)
    with Server(monkeypatch, Limits(idle_timeout=0.3)) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
            c.sendall(endpoint())
            wire.receive(c, 10, wire.MessageType.ENDPOINT)
            c.sendall(wire.encode(wire.MessageType.READY))
            line = server.wait_for(" dropped: ")
            assert line.endswith(" dropped: sent nothing for 0.3 s (--idle-timeout)")
            with pytest.raises(wire.PeerError, match=r"sent nothing for 0\.3 s"):
                wire.receive(c, 10)
    assert not roce.qps and not roce.mrs


def test_a_stalled_handshake_is_dropped_at_its_deadline(roce, monkeypatch):
    monkeypatch.setattr(acceptor, "HANDSHAKE_TIMEOUT", 0.3)  # the handshake table's deadline
    with Server(monkeypatch, Limits()) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
            c.sendall(endpoint()[:10])
            t0 = time.monotonic()
            c.settimeout(10)
            assert c.recv(100) == b""
            assert time.monotonic() - t0 < 2
        assert server.wait_for(" dropped: ").endswith(
            " dropped: peer too slow: handshake timed out"
        )


def test_several_clients_are_served_at_once_and_the_stop_destroys_everything(roce, monkeypatch):
    with Server(monkeypatch, Limits()) as server:
        held = []
        for _ in range(3):  # three sessions, held open
            c = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            c.sendall(endpoint())
            wire.receive(c, 10, wire.MessageType.ENDPOINT)
            c.sendall(wire.encode(wire.MessageType.READY))
            held.append(c)
        assert server.acceptor.admission.sessions == 3 and len(roce.qps) == 3
        stats, _ = pings(server.port, 3)  # a fourth is served while they are
        assert (stats.sent, stats.received) == (3, 3)
        server.wait_for(" done: 3 pings answered")
    for c in held:
        c.close()
    assert not roce.qps and not roce.mrs  # the stop destroyed every QP, CQ and MR


def test_rc_pingpong_sessions_count_against_max_memory(roce, monkeypatch):
    limits = Limits(max_memory=1 << 20)  # room for one rc_pingpong session
    with Server(monkeypatch, limits, compat=True, idle=5.0) as server:
        with Ladder("mlx5_0", 1, 3) as ladder:
            first = pingpong.PingpongClient(ladder, "127.0.0.1", server.port, 64, 5.0)
            second = pingpong.PingpongClient(ladder, "127.0.0.1", server.port, 64, 5.0)
            try:
                first.connect()
                server.wait_for(r"qpn 0x[0-9a-f]+ \(ibv_rc_pingpong\)")
                with pytest.raises(wire.ProtocolError):
                    second.connect()  # the stock client sees the close
            finally:
                first.close()
                second.close()
    assert [line for line in server.log if "--max-memory" in line] == [
        "refused 127.0.0.1: connection over --max-memory 1M"
    ]
    assert not roce.qps and not roce.mrs


def test_quiet_sessions_back_off_when_others_are_served(roce, monkeypatch):
    from tests.unit import pyverbs_fakes

    polls = [0]
    start_poll = pyverbs_fakes.FakeCQEX.start_poll

    def counted(cq, attr):
        polls[0] += 1
        return start_poll(cq, attr)

    monkeypatch.setattr(pyverbs_fakes.FakeCQEX, "start_poll", counted)
    with Server(monkeypatch, Limits()) as server:
        held = []
        for _ in range(3):  # three sessions that never ping
            c = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            c.sendall(endpoint())
            wire.receive(c, 10, wire.MessageType.ENDPOINT)
            c.sendall(wire.encode(wire.MessageType.READY))
            held.append(c)
        time.sleep(0.3)  # past QUIET_AFTER: each polls about once a millisecond
        t0, p0 = time.monotonic(), polls[0]
        time.sleep(1.0)
        rate = (polls[0] - p0) / (time.monotonic() - t0)
        stats, _ = pings(server.port, 20)  # a real client is served at once meanwhile
        assert (stats.sent, stats.received) == (20, 20)
        for c in held:
            c.close()
    # 3 x 1000 a second at most when backed off (measured ~2700); busy-polling ~38000
    assert rate < 6 / echo.BACKOFF_SLEEP, f"three idle sessions polled {rate:.0f} times a second"


# -- the rdma_cm servers: serial, but an idle client cannot hold them ------------------------------


def test_an_idle_rping_client_is_dropped_after_the_idle_timeout(monkeypatch):
    from ibtool.rdma import cm
    from ibtool.rdma.ping import rping
    from tests.unit import test_rping

    deadlines = []

    class Silent(test_rping.Peer):
        def wait(self, opcode, deadline, what):
            if opcode == cm.IBV_WC_RECV and not self.messages:
                deadlines.append(deadline - time.monotonic())
                raise cm.CompletionTimeout(f"{what}: no completion before the timeout")
            return super().wait(opcode, deadline, what)

    peer, lines = Silent([test_rping.ad(64, 0xA000, 0x11), test_rping.ad(64, 0xB000, 0x22)]), []
    monkeypatch.setattr(cm, "Listener", lambda bind, port: test_rping.Listener(peer))
    rping.serve(ServeOptions("192.168.77.1", 7174, lines.append, max_clients=1, idle=120.0))
    assert lines[-1] == "client 1 dropped: sent nothing for 120 s (--idle-timeout)"
    assert 119 < deadlines[0] <= 120  # the wait for a ping is bounded by --idle-timeout


# -- what a server is told: one ServeOptions, each server refusing what it cannot honour -----------


@pytest.mark.parametrize(
    "server, given, said",
    [
        (
            "server",
            dict(device="mlx5_0", device_port=1, gid_index=3, idle=5.0),
            "the ping server does not take ServeOptions.idle",
        ),
        (
            "server",
            dict(gid_index=3),
            "the ping server needs ServeOptions.device, ServeOptions.device_port",
        ),
        (
            "pingpong",
            dict(device="mlx5_0"),
            "ibv_rc_pingpong's server needs ServeOptions.device_port",
        ),
        (
            "rping",
            dict(device="mlx5_0", path=PathSpec(sl=3)),
            "rping's server does not take ServeOptions.device, ServeOptions.path",
        ),
        (
            "cmping",
            dict(device_port=1, gid_index=3),
            "the rdma_cm ping server does not take ServeOptions.device_port, "
            "ServeOptions.gid_index",
        ),
    ],
)
def test_a_server_refuses_what_it_cannot_honour_before_it_listens(server, given, said):
    from ibtool.rdma.ping import cmping, rping

    serve = {"server": ping_server, "pingpong": pingpong, "rping": rping, "cmping": cmping}[server]
    lines: list[str] = []
    with pytest.raises(TypeError) as e:
        serve.serve(ServeOptions("127.0.0.1", 0, lines.append, **given))
    assert (str(e.value), lines) == (said, [])


# -- the command line ------------------------------------------------------------------------------


def test_limits_given_to_a_client_are_usage_errors(roce, live_roce):
    r = live_roce("ping", "127.0.0.1", "--max-sessions", "3")
    assert (r.code, r.out) == (ExitCode.USAGE, "")
    assert r.err.startswith("ibtool: error: --max-sessions is a server option (hint: "), r.err


@pytest.mark.parametrize("over", [["--cm"], ["--compat", "rping"]])
def test_the_limits_given_reach_the_rdma_cm_servers(roce, live_roce, monkeypatch, over):
    from ibtool.api import ping
    from ibtool.rdma import cm

    class AtRdmaCm(Exception):
        """The server got past its options to rdma_cm."""

    def reached(*args):
        raise AtRdmaCm

    def recorded(serve):
        def run(options: ServeOptions) -> None:
            got["options"] = options
            with pytest.raises(AtRdmaCm):  # the server takes all it is told
                serve(options)

        return run

    got = {}
    monkeypatch.setattr(cm, "rdmacm", reached)
    monkeypatch.setattr(cm, "Listener", reached)
    monkeypatch.setattr(ping, "serve_cmping", recorded(ping.serve_cmping))
    monkeypatch.setattr(ping, "serve_rping", recorded(ping.serve_rping))
    r = live_roce(
        "ping", "--server", *over, "--bind", "192.0.2.1", "--allow", "10.0.0.0/8",
        "--max-per-source", "2", "--max-rate", "0.5", "--idle-timeout", "30",
    )  # fmt: skip
    assert r.code == ExitCode.OK, r.err
    assert got["options"].limits == Limits(
        max_per_source=2, max_rate=0.5, idle_timeout=30.0, allow=nets("10.0.0.0/8")
    )
    assert got["options"].idle == 30.0


@pytest.mark.parametrize(
    "option, value, said",
    [
        (
            "--max-memory",
            "10K",
            "must be 1M to 1024G (one largest ping's buffer at least), not 10K",
        ),
        ("--max-memory", "lots", "not a size: 'lots' (bytes, or with K, M or G)"),
        ("--allow", "10.0.0.0/33", "not an IPv4 or IPv6 address or CIDR: '10.0.0.0/33'"),
        ("--max-sessions", "0", "must be 1 to 65535, not 0"),
        ("--max-rate", "0", "must be more than 0 and at most 1000000 per second, not 0"),
    ],
)
def test_bad_limits_are_refused_as_the_command_line_is_parsed(live_roce, option, value, said):
    r = live_roce("ping", "--server", option, value)
    assert (r.code, r.out) == (ExitCode.USAGE, "")
    assert r.err.endswith(f"ibtool ping: error: argument {option}: {said}\n"), r.err


def test_the_limits_given_reach_the_server(roce, live_roce, monkeypatch):
    got = {}
    monkeypatch.setattr("ibtool.api.ping.serve", lambda options, **kw: got.update(options=options))
    r = live_roce(
        "ping", "--server", "--max-sessions", "3", "--max-memory", "2G", "--allow",
        "10.1.2.3/16", "--allow", "fd77::/64", "--idle-timeout", "30",
    )  # fmt: skip
    assert r.code == ExitCode.OK, r.err
    assert got["options"].limits == Limits(
        max_sessions=3,
        max_memory=2 << 30,
        idle_timeout=30.0,
        allow=nets("10.1.0.0/16", "fd77::/64"),
    )
